// Reconfiguration end to end, in process: four ptcd daemons (store +
// transformer) on localhost:0, a GPT-like job saved with values that encode
// each element's tensor and global index, and a sequence of
// reconfigurations executed by the daemons themselves, each verified
// element by element on every target rank, with fingerprints proven.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/plan_scenario.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "proto/transformer.grpc.pb.h"
#include "state_transformer/transformer_service.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=4,hidden=32,heads=4,ffn=48,vocab=100,positions=16,pad=8";
constexpr int kHosts = 4, kGpus = 2;

using testing::DaemonCluster;

std::vector<int> Hosts(std::initializer_list<int> h) { return h; }

testing::SmallObjects Save(DaemonCluster& c, const PlanScenario& s,
                           int64_t version) {
  return testing::SaveSource(c, "gpt", s, version);
}
void VerifyTarget(DaemonCluster& c, const PlanScenario& s, int64_t version,
                  const testing::SmallObjects* small = nullptr) {
  testing::VerifyTarget(c, "gpt", s, version, small);
}

int64_t UcxBytes() {
  for (const auto& [name, value] : CounterValues()) {
    if (name == "ptc_transformer_ucx_bytes_received_total") return value;
  }
  return 0;
}

TEST_CASE(
    "reconfigure: a GPT job moves through six layouts between four daemons, "
    "every element exact and fingerprints proven, over UCX and over gRPC",
    "[reconfigure]") {
  const proto::Transport transport =
      GENERATE(proto::TRANSPORT_GRPC, proto::TRANSPORT_UCX);
  INFO("transport " << proto::Transport_Name(transport));
  DaemonCluster c(kHosts);
  const int64_t ucx_before = UcxBytes();
  int64_t cross_host = 0;
  struct Step {
    const char* to;
    std::vector<int> hosts;
  };
  const std::vector<Step> steps = {
      {"tp=1,pp=2,dp=2", Hosts({0, 1})},                  // tp change, dp up
      {"tp=2,pp=1,dp=2", Hosts({0, 1})},                  // pp change
      {"tp=2,pp=3,dp=1,layers=1/1/2", Hosts({1, 2, 3})},  // uneven stages
      {"tp=1,pp=1,dp=4,zero=1", Hosts({2, 3})},           // redeploy, ZeRO-1
      {"tp=4,pp=2,dp=1", Hosts({0, 1, 2, 3})},            // scale up
      {"tp=2,pp=1,dp=1", Hosts({3})},                     // scale down
  };
  std::string from = "tp=2,pp=2,dp=1";
  std::vector<int> from_hosts = Hosts({0, 1});
  int64_t version = 1, epoch = 0;
  testing::SmallObjects small;
  {
    auto first = MakePlanScenario(kModel, from, from_hosts, from, from_hosts,
                                  ptc::Cluster::Uniform(kHosts, kGpus));
    REQUIRE(first.ok());
    small = Save(c, *first, version);
  }
  for (const Step& step : steps) {
    INFO("from " << from << " to " << step.to);
    auto s = MakePlanScenario(kModel, from, from_hosts, step.to, step.hosts,
                              ptc::Cluster::Uniform(kHosts, kGpus));
    REQUIRE(s.ok());
    auto plan = PlanReconfiguration(s->input());
    REQUIRE(plan.ok());
    REQUIRE(ValidatePlan(s->input(), *plan).ok());
    ReconfigureRequest req;
    const PlanInput input = s->input();
    req.input = &input;
    req.plan = &*plan;
    req.job = "gpt";
    req.source_version = version;
    req.target_version = version + 1;
    req.plan_epoch = ++epoch;
    req.addresses = c.addresses;
    req.transport = transport;
    cross_host += plan->summary.cross_host_bytes;
    int64_t last_done = -1, total = 0;
    auto report = RunReconfiguration(req, [&](const ReconfigureProgress& p) {
      CHECK(p.bytes_done >= last_done);
      last_done = p.bytes_done;
      total = p.bytes_total;
    });
    INFO(report.status().ToString());
    REQUIRE(report.ok());
    CHECK(report->tensors_verified == static_cast<int>(s->spec.tensors.size()));
    CHECK(report->bytes_from_peers == plan->summary.cross_host_bytes);
    CHECK(last_done == total);
    ++version;
    // Every target rank holds the small objects its scope's rule names.
    small = testing::AfterPlan("gpt", small, *plan, version);
    VerifyTarget(c, *s, version, &small);
    // The old version is released everywhere; the new one is committed.
    for (auto& d : c.daemons) {
      auto list = d->client->List("gpt");
      REQUIRE(list.ok());
      for (const auto& v : list->jobs(0).versions()) {
        CHECK(v.version() == version);
        CHECK(v.committed());
      }
    }
    from = step.to;
    from_hosts = step.hosts;
  }
  // Every byte that crossed hosts went over the transport asked for.
  CHECK(UcxBytes() - ucx_before == (transport == proto::TRANSPORT_UCX ? cross_host : 0));
}

// `from` on hosts 0 and 1, saved and planned to the same config on hosts 2
// and 3; host 1 goes away after planning, before the transfer. The
// change's outcome.
absl::StatusOr<ReconfigureReport> ChangeAsHost1Dies(DaemonCluster& c,
                                                    const PlanScenario& s) {
  Save(c, s, 1);
  auto plan = PlanReconfiguration(s.input());
  REQUIRE(plan.ok());
  c.daemons[1]->server->Shutdown(absl::ZeroDuration());
  ReconfigureRequest req;
  const PlanInput input = s.input();
  req.input = &input;
  req.plan = &*plan;
  req.job = "gpt";
  req.source_version = 1;
  req.target_version = 2;
  req.plan_epoch = 1;
  req.addresses = c.addresses;
  return RunReconfiguration(req);
}

TEST_CASE(
    "reconfigure: a source host that fails mid-way is replaced by its replica, "
    "and the change commits",
    "[reconfigure]") {
  DaemonCluster c(kHosts);
  // dp=2: host 1's pieces come from host 0, its small objects from their
  // copies there or fresh.
  auto s =
      MakePlanScenario(kModel, "tp=2,dp=2", Hosts({0, 1}), "tp=2,dp=2",
                       Hosts({2, 3}), ptc::Cluster::Uniform(kHosts, kGpus));
  REQUIRE(s.ok());
  auto report = ChangeAsHost1Dies(c, *s);
  INFO(report.status().ToString());
  REQUIRE(report.ok());
  VerifyTarget(c, *s, 2);
}

TEST_CASE(
    "reconfigure: a source host with the only copy that fails mid-way aborts "
    "the change and leaves the old version intact",
    "[reconfigure]") {
  DaemonCluster c(kHosts);
  // pp=2 without replicas: stage 1 only on host 1.
  auto s =
      MakePlanScenario(kModel, "tp=2,pp=2,dp=1", Hosts({0, 1}), "tp=2,pp=2,dp=1",
                       Hosts({2, 3}), ptc::Cluster::Uniform(kHosts, kGpus));
  REQUIRE(s.ok());
  auto report = ChangeAsHost1Dies(c, *s);
  REQUIRE(!report.ok());
  CHECK(report.status().code() == absl::StatusCode::kUnavailable);
  CHECK(report.status().message().find("from host1 (") != std::string::npos);
  // Nothing of version 2 anywhere; version 1 intact on host 0.
  for (int h : {0, 2, 3}) {
    auto list = c.daemons[h]->client->List("gpt");
    REQUIRE(list.ok());
    for (const auto& v : list->jobs(0).versions()) CHECK(v.version() == 1);
  }
  auto list = c.daemons[0]->client->List("gpt");
  REQUIRE(list.ok());
  REQUIRE(list->jobs_size() == 1);
  REQUIRE(list->jobs(0).versions_size() == 1);
  CHECK(list->jobs(0).versions(0).version() == 1);
}

TEST_CASE("reconfigure: a stale plan epoch is refused and changes nothing",
          "[reconfigure]") {
  DaemonCluster c(kHosts);
  auto stub = proto::Transformer::NewStub(
      grpc::CreateChannel(c.addresses[0], grpc::InsecureChannelCredentials()));
  auto execute = [&](int64_t epoch, int64_t version) {
    grpc::ClientContext ctx;
    proto::ExecuteFragmentRequest req;
    req.set_job("gpt");
    req.set_source_version(1);
    req.set_target_version(version);
    req.set_plan_epoch(epoch);
    req.set_host(0);
    req.mutable_fragment()->set_host(0);
    auto reader = stub->ExecuteFragment(&ctx, req);
    proto::FragmentProgress p;
    while (reader->Read(&p)) {
    }
    return reader->Finish();
  };
  CHECK(execute(5, 2).ok());  // an empty fragment at epoch 5
  const grpc::Status stale = execute(4, 3);
  CHECK(stale.error_code() == grpc::StatusCode::ABORTED);
  CHECK(stale.error_message().find("stale") != std::string::npos);
  CHECK(execute(0, 3).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // Commit must name the current epoch exactly.
  grpc::ClientContext ctx;
  proto::CommitStagedRequest commit;
  commit.set_job("gpt");
  commit.set_version(2);
  commit.set_plan_epoch(4);
  proto::CommitStagedResponse resp;
  CHECK(stub->CommitStaged(&ctx, commit, &resp).error_code() ==
        grpc::StatusCode::ABORTED);
}

}  // namespace
}  // namespace ptc
