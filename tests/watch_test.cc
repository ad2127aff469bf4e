// Coordinator.Watch during a change: a job's processes (followers) are told
// its phases and outcome, not its plan and progress, which ptcctl watch
// streams; every stream of a job shares one copy of its events.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/metrics.h"
#include "coordinator/coordinator_server.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=64,positions=8,pad=8";

TEST_CASE(
    "watch: followers are told a change's phases and outcome, without its "
    "plan or progress; a plain watcher gets both",
    "[coordinator]") {
  testing::DaemonCluster c(4);
  auto s = MakePlanScenario(kModel, "tp=2,pp=1,dp=1", {0}, "tp=1,pp=2,dp=2",
                            {2, 3}, ptc::Cluster::Uniform(4, 2));
  REQUIRE(s.ok());
  testing::SaveSource(c, "gpt", *s, 1);
  testing::TempDir dir;
  proto::CoordinatorState state = testing::KnownHosts(c, 2);
  auto* j = state.add_jobs();
  j->set_job("gpt");
  j->set_model(kModel);
  j->set_config("tp=2,pp=1,dp=1");
  j->add_hosts("host0");
  j->set_committed_version(1);
  REQUIRE(WriteFileAtomically(dir.path() + "/state.pb",
                              state.SerializeAsString())
              .ok());
  // Heartbeats are not sent here: a long timeout keeps the hosts alive.
  CoordinatorServerOptions options;
  options.service.state_dir = dir.path();
  options.service.host_timeout = absl::Hours(1);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*coordinator)->port()),
                          grpc::InsecureChannelCredentials()));

  // Three processes follow the job before the change.
  constexpr int kFollowers = 3;
  std::vector<std::vector<proto::ReconfigureEvent>> followed(kFollowers);
  std::vector<std::thread> followers;
  std::vector<grpc::ClientContext> contexts(kFollowers);
  const int64_t written_before =
      GetCounter("ptc_watch_events_written_total").value();
  for (int i = 0; i < kFollowers; ++i) {
    contexts[i].set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    followers.emplace_back([&, i] {
      proto::WatchRequest req;
      req.set_job("gpt");
      req.set_follow(true);
      auto reader = stub->Watch(&contexts[i], req);
      proto::ReconfigureEvent e;
      // Until the job runs in its new layout.
      while (reader->Read(&e)) {
        followed[i].push_back(e);
        if (e.layout_epoch() == 2 && e.phase() == proto::PHASE_COMMITTED)
          break;
      }
      contexts[i].TryCancel();
    });
  }
  // Each is told the job as it is now before the change starts.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (GetCounter("ptc_watch_events_written_total").value() - written_before <
             kFollowers &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }

  proto::ReconfigureRequest req;
  req.set_job("gpt");
  req.set_to("tp=1,pp=2,dp=2");
  req.add_hosts("host2");
  req.add_hosts("host3");
  proto::ReconfigureResponse started;
  {
    grpc::ClientContext ctx;
    REQUIRE(stub->Reconfigure(&ctx, req, &started).ok());
  }
  std::vector<proto::ReconfigureEvent> watched;
  {
    grpc::ClientContext ctx;
    proto::WatchRequest watch;
    watch.set_job("gpt");
    auto reader = stub->Watch(&ctx, watch);
    proto::ReconfigureEvent e;
    while (reader->Read(&e)) watched.push_back(e);
    REQUIRE(reader->Finish().ok());
  }
  for (std::thread& t : followers) t.join();

  // The plain watcher saw the plan and each host's staging.
  REQUIRE_FALSE(watched.empty());
  CHECK(watched.back().phase() == proto::PHASE_COMMITTED);
  CHECK(watched.back().plan().target_bytes() > 0);
  CHECK(watched.back().host_progress_size() == 2);
  CHECK(watched.back().bytes_total() > 0);

  for (const auto& events : followed) {
    REQUIRE_FALSE(events.empty());
    CHECK(events.front().layout_epoch() == 1);
    CHECK(events.front().committed_version() == 1);
    const proto::ReconfigureEvent& last = events.back();
    CHECK(last.phase() == proto::PHASE_COMMITTED);
    CHECK(last.layout_epoch() == 2);
    CHECK(last.plan_epoch() == watched.back().plan_epoch());
    CHECK(last.from_config() == "tp=2,pp=1,dp=1");
    CHECK(last.to_config() == "tp=1,pp=2,dp=2");
    // One event per phase at most (and the job's epoch or version moving):
    // never the progress within a phase.
    CHECK(events.size() <= 8);
    for (const proto::ReconfigureEvent& e : events) {
      CHECK_FALSE(e.has_plan());
      CHECK(e.host_progress_size() == 0);
      CHECK(e.bytes_done() == 0);
      CHECK(e.bytes_total() == 0);
      CHECK(e.hosts_total() == 0);
    }
  }
}

}  // namespace
}  // namespace ptc
