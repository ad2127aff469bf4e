#include "plan/planner.h"

#include <catch2/catch.hpp>

#include "plan/internal/plan_testing.h"
#include "plan/plan_proto.h"
#include "plan/plan_validator.h"
#include "ptc/families.h"

namespace ptc {
namespace {

using testing::ExecuteAndVerify;
using testing::MakeJob;
using testing::TestJob;

constexpr char kSmallGpt[] =
    "gpt:layers=4,hidden=32,heads=4,ffn=64,vocab=100,positions=16,pad=8";

TestJob Job(const std::string& from, std::vector<int> from_hosts,
            const std::string& to, std::vector<int> to_hosts, Cluster cluster,
            std::vector<bool> alive = {},
            const std::string& model = kSmallGpt) {
  auto job =
      MakeJob(model, from, from_hosts, to, to_hosts, std::move(cluster), alive);
  REQUIRE(job.ok());
  return std::move(*job);
}

void CheckGood(const TestJob& job, const Plan& plan) {
  REQUIRE(ValidatePlan(job.input(), plan).ok());
  REQUIRE(ExecuteAndVerify(job.input(), plan).ok());
  CHECK(plan.summary.cross_host_bytes ==
        plan.summary.cross_host_bytes_lower_bound);
}

TEST_CASE("planner: an unchanged layout keeps everything in place",
          "[coordinator][planner]") {
  const TestJob job = Job("tp=2,pp=2,dp=2", {0, 1}, "tp=2,pp=2,dp=2", {0, 1},
                          Cluster::Uniform(2, 4));
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  CHECK(plan->summary.cross_host_bytes == 0);
  CHECK(plan->summary.copied_within_host_bytes == 0);
  CHECK(plan->summary.kept_in_place_bytes == plan->summary.target_bytes);
}

TEST_CASE("planner: a tp change inside one host copies within the host",
          "[coordinator][planner]") {
  const TestJob job =
      Job("tp=4", {0}, "tp=2,dp=2", {0}, Cluster::Uniform(1, 4));
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  CHECK(plan->summary.cross_host_bytes == 0);
  CHECK(plan->summary.copied_within_host_bytes > 0);
  // dp=2 on one host: both replicas (and both tp ranks, for tp-replicated
  // tensors) share one copy in the store.
  int64_t rank_bytes = 0;
  for (int r = 0; r < 4; ++r) rank_bytes += job.target().RankBytes(job.spec, r);
  CHECK(plan->summary.dedup_saved_bytes ==
        rank_bytes - plan->summary.target_bytes);
  CHECK(plan->summary.dedup_saved_bytes >= plan->summary.target_bytes);
}

TEST_CASE(
    "planner: a dp scale-up fetches each region once per new host and "
    "balances the replicas",
    "[coordinator][planner]") {
  // Two replicas on hosts 0 and 1; hosts 2 and 3 join.
  const TestJob job = Job("tp=2,dp=2", {0, 1}, "tp=2,dp=4", {0, 1, 2, 3},
                          Cluster::Uniform(4, 2));
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  const PlanSummary& s = plan->summary;
  // Each new host needs one full replica.
  CHECK(s.cross_host_bytes == 2 * job.spec.TotalBytes());
  // Each old host sends one replica's worth (within an element per class).
  CHECK(s.max_host_send_bytes_lower_bound == job.spec.TotalBytes());
  CHECK(s.max_host_send_bytes <=
        s.max_host_send_bytes_lower_bound * 1.001 + 64);
  CHECK(s.host_send_bytes[0] > 0);
  CHECK(s.host_send_bytes[1] > 0);
}

TEST_CASE("planner: a single replica is striped across several senders",
          "[coordinator][planner]") {
  // One region held by hosts 0..3 (dp=4, tp=1, one GPU each); host 4 joins
  // with dp=5: it needs a whole replica; four senders share it.
  const TestJob job = Job("dp=4", {0, 1, 2, 3}, "dp=5", {0, 1, 2, 3, 4},
                          Cluster::Uniform(5, 1));
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  const PlanSummary& s = plan->summary;
  CHECK(s.cross_host_bytes == job.spec.TotalBytes());
  CHECK(s.max_host_send_bytes_lower_bound == (job.spec.TotalBytes() + 3) / 4);
  CHECK(s.max_host_send_bytes <= s.max_host_send_bytes_lower_bound * 1.05);
  for (int h = 0; h < 4; ++h) CHECK(s.host_send_bytes[h] > 0);
}

TEST_CASE("planner: faster links send more when bandwidths differ",
          "[coordinator][planner]") {
  Cluster cluster = Cluster::Uniform(3, 1);
  cluster.hosts[0].bandwidth = 30e9;
  cluster.hosts[1].bandwidth = 10e9;
  const TestJob job = Job("dp=2", {0, 1}, "dp=3", {0, 1, 2}, cluster);
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  const PlanSummary& s = plan->summary;
  // Host 0 sends about three quarters.
  const double share =
      static_cast<double>(s.host_send_bytes[0]) / s.cross_host_bytes;
  CHECK(share > 0.7);
  CHECK(share < 0.8);
  CHECK(s.max_host_send_seconds <= s.max_host_send_seconds_lower_bound * 1.01);
}

TEST_CASE("planner: dead hosts are never sources", "[coordinator][planner]") {
  // Replicas on hosts 0, 1, 2; host 1 dies; the target is hosts 0, 2, 3.
  const TestJob job = Job("tp=2,dp=3", {0, 1, 2}, "tp=2,dp=3", {0, 2, 3},
                          Cluster::Uniform(4, 2), {true, false, true, true});
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
  CHECK(plan->summary.host_send_bytes[1] == 0);
  auto baseline = PlanTenplexBaseline(job.input());
  REQUIRE(baseline.ok());
  REQUIRE(ValidatePlan(job.input(), *baseline).ok());
  CHECK(baseline->summary.host_send_bytes[1] == 0);
}

TEST_CASE("planner: a late host sends only what no other host holds",
          "[coordinator][planner]") {
  // Replicas on hosts 0 and 1; the target is host 2 alone: on time, both
  // send half; with host 1's heartbeats late, host 0 sends everything.
  const TestJob job =
      Job("dp=2", {0, 1}, "dp=1", {2}, Cluster::Uniform(3, 1));
  auto balanced = PlanReconfiguration(job.input());
  REQUIRE(balanced.ok());
  CHECK(balanced->summary.host_send_bytes[1] > 0);
  PlanInput in = job.input();
  in.late = {false, true, false};
  auto plan = PlanReconfiguration(in);
  REQUIRE(plan.ok());
  REQUIRE(ValidatePlan(in, *plan).ok());
  REQUIRE(ExecuteAndVerify(in, *plan).ok());
  CHECK(plan->summary.host_send_bytes[1] == 0);
  CHECK(plan->summary.host_send_bytes[0] == job.spec.TotalBytes());
  for (const SmallObjectMove& m : plan->small_objects) {
    if (m.derive_from.empty()) CHECK(m.source_host != 1);
  }
  // Every copied object lists a copy on another host to take if its source
  // host fails during the change, or may take a fresh value.
  for (const SmallObjectMove& m : balanced->small_objects) {
    if (!m.derive_from.empty()) continue;
    INFO(m.name << " for rank " << m.target_rank);
    CHECK((!m.alternates.empty() || !m.derive_fallback.empty()));
    for (const SmallObjectMove::Copy& c : m.alternates) {
      CHECK(c.host != m.source_host);
      CHECK(job.source_placement.host[c.rank] == c.host);
    }
    if (m.name == "iteration") CHECK(m.alternates.size() == 1);
  }

  // What only a late host holds still comes from it: pp=2 keeps stage 1 on
  // host 1 alone.
  const TestJob stages = Job("pp=2", {0, 1}, "pp=1", {2}, Cluster::Uniform(3, 1));
  PlanInput late_sole = stages.input();
  late_sole.late = {false, true, false};
  auto sole = PlanReconfiguration(late_sole);
  REQUIRE(sole.ok());
  REQUIRE(ExecuteAndVerify(late_sole, *sole).ok());
  CHECK(sole->summary.host_send_bytes[1] > 0);
}

TEST_CASE(
    "planner: a region with no surviving copy is FAILED_PRECONDITION "
    "naming it",
    "[coordinator][planner]") {
  // pp=2 without replicas: stage 1 lives only on host 1, which dies.
  const TestJob job =
      Job("pp=2", {0, 1}, "pp=1", {0}, Cluster::Uniform(2, 1), {true, false});
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(!plan.ok());
  CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(plan.status().message().find("no surviving copy") != std::string::npos);
  // What callers decide by: the payload, not the text.
  CHECK(HasPlanFailure(plan.status(), PlanFailure::kNoSurvivingCopy));
  CHECK_FALSE(HasPlanFailure(plan.status(), PlanFailure::kHostWentSilent));
  CHECK(plan.status().message().find("host1") != std::string::npos);
  CHECK(plan.status().message().find("layers.") != std::string::npos);
  CHECK(PlanTenplexBaseline(job.input()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("planner: inputs that do not fit together are rejected",
          "[coordinator][planner]") {
  TestJob job = Job("tp=2", {0}, "tp=2", {1}, Cluster::Uniform(2, 2));
  SECTION("a target rank on a dead host") {
    job.alive = {true, false};
    auto plan = PlanReconfiguration(job.input());
    CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(plan.status().message().find("rank 0 on host1, which is dead") !=
          std::string::npos);
  }
  SECTION("a placement of the wrong size") {
    job.target_placement.host.push_back(0);
    job.target_placement.device.push_back(1);
    CHECK(PlanReconfiguration(job.input()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("liveness for the wrong number of hosts") {
    job.alive = {true};
    CHECK(PlanReconfiguration(job.input()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("a layout of another model") {
    auto other =
        SpecForModel("gpt:layers=1,hidden=8,heads=2");
    REQUIRE(other.ok());
    job.spec = *other;
    auto plan = PlanReconfiguration(job.input());
    CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(plan.status().message().find("tensors") != std::string::npos);
  }
  SECTION("a host without bandwidth") {
    job.cluster.hosts[0].bandwidth = 0;
    CHECK(PlanReconfiguration(job.input()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE(
    "planner: the Tenplex-style baseline pulls from replica 0 without "
    "dedup or locality",
    "[coordinator][planner]") {
  // dp=2 on hosts 0 (replica 0) and 1 -> dp=4 on hosts 0..3 with 2 GPUs per
  // host... each host holds tp=2 of one replica.
  const TestJob job = Job("tp=2,dp=2", {0, 1}, "tp=2,dp=4", {1, 2, 3, 0},
                          Cluster::Uniform(4, 2));
  auto ours = PlanReconfiguration(job.input());
  auto base = PlanTenplexBaseline(job.input());
  REQUIRE(ours.ok());
  REQUIRE(base.ok());
  CheckGood(job, *ours);
  REQUIRE(ValidatePlan(job.input(), *base).ok());
  REQUIRE(ExecuteAndVerify(job.input(), *base).ok());
  CHECK(base->per_rank);
  // Only host 0 (replica 0) sends in the baseline.
  CHECK(base->summary.host_send_bytes[1] == 0);
  CHECK(base->summary.cross_host_bytes > ours->summary.cross_host_bytes);
  CHECK(base->summary.max_host_send_bytes > ours->summary.max_host_send_bytes);
}

TEST_CASE("planner: small objects follow their scope's rule",
          "[coordinator][planner]") {
  const TestJob job =
      Job("tp=2,pp=2", {0, 1}, "tp=4", {1}, Cluster::Uniform(2, 4));
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CHECK(plan->summary.small_object_moves ==
        4 * static_cast<int64_t>(job.spec.small_objects.size()));
  for (const SmallObjectMove& m : plan->small_objects) {
    if (m.name == "rng.model_parallel") {
      // tp 0 and 1 existed (stage 0, same tp, dp 0); tp 2 and 3 are new
      // and derive fresh seeds.
      if (m.target_rank < 2) {
        CHECK(m.source_rank == m.target_rank);
        CHECK(m.derive_from.empty());
      } else {
        CHECK(m.source_rank == -1);
        CHECK(m.derive_from == absl::StrCat("pp=0,tp=", m.target_rank));
      }
    }
  }
}

TEST_CASE(
    "planner: a small object whose every copy died comes from the copy the "
    "coordinator keeps",
    "[coordinator][planner]") {
  // tp=2,dp=2, replica d on host d; host 0 died. Its replica's data loader
  // position had no copy elsewhere.
  TestJob job = Job("tp=2,dp=2", {0, 1}, "tp=2,dp=2", {1, 2},
                    Cluster::Uniform(3, 2), {false, true, true});
  job.spec.small_objects.push_back({"loader", {"dp"}, NewRankRule::kCopy, 64});
  PlanInput in = job.input();
  auto refused = PlanReconfiguration(in);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("small object 'loader'") &&
                 Catch::Contains("has no surviving source"));
  // The coordinator kept rank 0's copy (the first of replica 0's ranks)
  // and rank 2's.
  in.kept = [](const std::string& name, int32_t rank) {
    return name == "loader" && (rank == 0 || rank == 2);
  };
  auto plan = PlanReconfiguration(in);
  REQUIRE(plan.ok());
  int loaders = 0;
  for (const SmallObjectMove& m : plan->small_objects) {
    if (m.name != "loader") {
      CHECK(m.kept_rank == -1);
      continue;
    }
    ++loaders;
    if (m.target_rank < 2) {
      // Replica 0's: only the coordinator's copy is left.
      CHECK(m.source_host == kFromCoordinator);
      CHECK(m.source_rank == 0);
      CHECK(m.kept_rank == 0);
    } else {
      // Replica 1's: from its live host, the kept copy as the last resort.
      CHECK(m.source_host == 1);
      CHECK(m.source_rank == 2);
      CHECK(m.kept_rank == 2);
    }
  }
  CHECK(loaders == 4);
  // The plan travels with its kept ranks.
  auto back = PlanFromProto(PlanToProto(*plan));
  REQUIRE(back.ok());
  for (size_t i = 0; i < plan->small_objects.size(); ++i)
    CHECK(back->small_objects[i].kept_rank == plan->small_objects[i].kept_rank);
}

TEST_CASE("planner: LLaMA with grouped splits and ZeRO-1 re-partitions exactly",
          "[coordinator][planner]") {
  const TestJob job = Job(
      "tp=2,pp=2,dp=2,zero=1", {0, 1, 2, 3},
      "tp=4,pp=1,dp=2,zero=1,order=dp-tp-pp", {2, 3}, Cluster::Uniform(4, 4),
      {}, "llama:layers=3,hidden=32,heads=8,kv_heads=4,ffn=24,vocab=90,pad=2");
  auto plan = PlanReconfiguration(job.input());
  REQUIRE(plan.ok());
  CheckGood(job, *plan);
}

}  // namespace
}  // namespace ptc
