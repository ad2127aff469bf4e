#include "plan/plan_proto.h"

#include <catch2/catch.hpp>

#include "plan/internal/plan_testing.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"

namespace ptc {
namespace {

// A GPT job from tp=2 on two hosts to tp=4 on four.
absl::StatusOr<testing::TestJob> SmallJob() {
  return testing::MakeJob("gpt:layers=2,hidden=16,heads=4,vocab=30,positions=4",
                          "tp=2,dp=2", {0, 1}, "tp=4,dp=2", {1, 2, 3, 0},
                          Cluster::Uniform(4, 2));
}

TEST_CASE("plan proto: a plan survives the wire and still validates",
          "[coordinator][proto]") {
  auto job = SmallJob();
  REQUIRE(job.ok());
  auto plan = PlanReconfiguration(job->input());
  REQUIRE(plan.ok());
  std::string bytes;
  REQUIRE(PlanToProto(*plan).SerializeToString(&bytes));
  proto::Plan wire;
  REQUIRE(wire.ParseFromString(bytes));
  auto back = PlanFromProto(wire);
  REQUIRE(back.ok());
  CHECK(ValidatePlan(job->input(), *back).ok());
  CHECK(back->summary.cross_host_bytes == plan->summary.cross_host_bytes);
  CHECK(back->summary.host_send_bytes == plan->summary.host_send_bytes);
  CHECK(back->fragments.size() == plan->fragments.size());
  CHECK(back->small_objects.size() == plan->small_objects.size());
  for (size_t i = 0; i < plan->small_objects.size(); ++i) {
    const SmallObjectMove& a = plan->small_objects[i];
    const SmallObjectMove& b = back->small_objects[i];
    CHECK(b.derive_fallback == a.derive_fallback);
    REQUIRE(b.alternates.size() == a.alternates.size());
    for (size_t k = 0; k < a.alternates.size(); ++k) {
      CHECK(b.alternates[k].rank == a.alternates[k].rank);
      CHECK(b.alternates[k].host == a.alternates[k].host);
    }
  }
}

TEST_CASE("plan proto: every field of a plan's summary reaches the wire",
          "[coordinator][proto]") {
  // Each field a value of its own, so that one left out or swapped shows.
  PlanSummary s;
  s.target_bytes = 1;
  s.kept_in_place_bytes = 2;
  s.copied_within_host_bytes = 3;
  s.cross_host_bytes = 4;
  s.cross_host_bytes_lower_bound = 5;
  s.dedup_saved_bytes = 6;
  s.max_host_send_bytes = 7;
  s.max_host_send_bytes_lower_bound = 8;
  s.max_host_send_host = 9;
  s.max_host_send_seconds = 10.5;
  s.max_host_send_seconds_lower_bound = 11.5;
  s.transfers = 12;
  s.small_object_moves = 13;
  s.plan_seconds = 14.5;
  s.snapshot_bytes = 15;
  s.host_send_bytes = {16, 17};
  s.host_receive_bytes = {18, 19, 20};
  const proto::PlanSummary w = SummaryToProto(s);
  CHECK(w.target_bytes() == 1);
  CHECK(w.kept_in_place_bytes() == 2);
  CHECK(w.copied_within_host_bytes() == 3);
  CHECK(w.cross_host_bytes() == 4);
  CHECK(w.cross_host_bytes_lower_bound() == 5);
  CHECK(w.dedup_saved_bytes() == 6);
  CHECK(w.max_host_send_bytes() == 7);
  CHECK(w.max_host_send_bytes_lower_bound() == 8);
  CHECK(w.max_host_send_host() == 9);
  CHECK(w.max_host_send_seconds() == 10.5);
  CHECK(w.max_host_send_seconds_lower_bound() == 11.5);
  CHECK(w.transfers() == 12);
  CHECK(w.small_object_moves() == 13);
  CHECK(w.plan_seconds() == 14.5);
  CHECK(w.snapshot_bytes() == 15);
  CHECK(std::vector<int64_t>(w.host_send_bytes().begin(),
                             w.host_send_bytes().end()) ==
        std::vector<int64_t>{16, 17});
  CHECK(std::vector<int64_t>(w.host_receive_bytes().begin(),
                             w.host_receive_bytes().end()) ==
        std::vector<int64_t>{18, 19, 20});
  // The whole plan's wire form carries the same summary.
  Plan plan;
  plan.summary = s;
  CHECK(PlanToProto(plan).summary().SerializeAsString() ==
        w.SerializeAsString());
}

TEST_CASE("plan proto: a malformed region is INVALID_ARGUMENT",
          "[coordinator][proto]") {
  proto::Plan wire;
  proto::Interval* d =
      wire.add_fragments()->add_transfers()->mutable_region()->add_dims();
  d->set_begin(5);
  d->set_end(2);
  auto plan = PlanFromProto(wire);
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(plan.status().message().find("[5, 2)") != std::string::npos);
}

}  // namespace
}  // namespace ptc
