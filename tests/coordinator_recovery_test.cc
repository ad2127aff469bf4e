// A coordinator that restarts with a reconfiguration on disk: it finishes a
// commit it had decided, and aborts one it had not. Deterministic: the
// "crashed" coordinator is frozen right after (or before) its decision and
// a second one starts from the same metadata.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/atomic_file.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/planner.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=32,heads=4,ffn=48,vocab=64,positions=8,pad=8";

// The metadata a coordinator would have written for a job at version 1 on
// hosts 0,1 while moving it to `to` on hosts 2,3 at epoch 7.
proto::CoordinatorState InFlightState(const testing::DaemonCluster& c,
                                      bool decided) {
  proto::CoordinatorState state = testing::KnownHosts(c, 2);
  auto* j = state.add_jobs();
  j->set_job("gpt");
  j->set_model(kModel);
  j->set_config("tp=2,pp=1,dp=2");
  j->add_hosts("host0");
  j->add_hosts("host1");
  j->set_committed_version(1);
  j->set_last_epoch(7);
  j->set_target_config("tp=1,pp=2,dp=2");
  j->add_target_hosts("host2");
  j->add_target_hosts("host3");
  j->set_target_version(2);
  j->set_target_epoch(7);
  j->set_commit_decided(decided);
  j->add_release_hosts("host0");
  j->add_release_hosts("host1");
  return state;
}

void Recovers(bool decided) {
  testing::DaemonCluster c(4);
  auto s = MakePlanScenario(kModel, "tp=2,pp=1,dp=2", {0, 1}, "tp=1,pp=2,dp=2",
                            {2, 3}, ptc::Cluster::Uniform(4, 2));
  REQUIRE(s.ok());
  testing::SaveSource(c, "gpt", *s, 1);
  auto plan = PlanReconfiguration(s->input());
  REQUIRE(plan.ok());
  // The first coordinator stages version 2 and freezes at its decision.
  const PlanInput input = s->input();
  ReconfigureRequest req;
  req.input = &input;
  req.plan = &*plan;
  req.job = "gpt";
  req.source_version = 1;
  req.target_version = 2;
  req.plan_epoch = 7;
  req.addresses = c.addresses;
  absl::Notification frozen, thaw;
  req.before_commit = [&] {
    frozen.Notify();
    thaw.WaitForNotification();
    return absl::UnavailableError("the first coordinator crashed");
  };
  absl::StatusOr<ReconfigureReport> first;
  std::thread crashed([&] { first = RunReconfiguration(req); });
  frozen.WaitForNotification();
  for (int h : {2, 3}) {  // staged, not committed
    auto list = c.daemons[h]->client->List("gpt");
    REQUIRE(list.ok());
    REQUIRE(list->jobs(0).versions(0).version() == 2);
    REQUIRE(!list->jobs(0).versions(0).committed());
  }
  // A second coordinator starts from the metadata on disk.
  testing::TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/state.pb",
                              InFlightState(c, decided).SerializeAsString())
              .ok());
  auto second = CoordinatorServer::Start({"127.0.0.1:0", {dir.path()}});
  REQUIRE(second.ok());
  const std::vector<std::string> log = (*second)->service()->recovery_log();
  REQUIRE(log.size() == 1);
  thaw.Notify();
  crashed.join();
  CHECK(!first.ok());
  if (decided) {
    CHECK(log[0].find("resumed the decided commit of epoch 7") !=
          std::string::npos);
    testing::VerifyTarget(c, "gpt", *s, 2);
    for (int h : {2, 3}) {
      auto list = c.daemons[h]->client->List("gpt");
      CHECK(list->jobs(0).versions_size() == 1);
      CHECK(list->jobs(0).versions(0).committed());
    }
    for (int h : {0, 1}) {  // the old version was released
      CHECK(c.daemons[h]->client->List("gpt")->jobs(0).versions_size() == 0);
    }
  } else {
    CHECK(log[0].find("aborted epoch 7") != std::string::npos);
    // The old plan is fenced off: its epoch is stale on the hosts now.
    CHECK(CommitStagedOn({c.addresses.at(2)}, "gpt", 2, 7).code() ==
          absl::StatusCode::kAborted);
    for (int h : {2, 3})
      CHECK(c.daemons[h]->client->List("gpt")->jobs(0).versions_size() == 0);
    for (int h : {0, 1}) {
      auto list = c.daemons[h]->client->List("gpt");
      CHECK(list->jobs(0).versions_size() == 1);
      CHECK(list->jobs(0).versions(0).version() == 1);
    }
  }
  // What the restarted coordinator persisted agrees (the job's own file;
  // it read the job from a state.pb of the older format).
  auto bytes = ReadFileIfExists(dir.path() + "/jobs/gpt.pb");
  REQUIRE(bytes.ok());
  REQUIRE(bytes->has_value());
  proto::CoordinatorState::Job after;
  REQUIRE(after.ParseFromString(**bytes));
  CHECK(after.committed_version() == (decided ? 2 : 1));
  CHECK(after.target_version() == 0);
}

TEST_CASE("coordinator recovery: a decided commit is finished after a restart",
          "[coordinator][recovery]") {
  Recovers(/*decided=*/true);
}

TEST_CASE(
    "coordinator recovery: an undecided reconfiguration is aborted after a "
    "restart",
    "[coordinator][recovery]") {
  Recovers(/*decided=*/false);
}

// Whether each host is alive, as the coordinator at `port` says.
std::map<std::string, bool> Alive(int port) {
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::ListHostsResponse resp;
  REQUIRE(stub->ListHosts(&ctx, proto::ListHostsRequest(), &resp).ok());
  std::map<std::string, bool> out;
  for (const auto& h : resp.hosts()) out[h.name()] = h.alive();
  return out;
}

// Waits (at most a minute) until the coordinator at `port` says `host`
// is dead; whether it did.
bool DeclaredDead(int port, const std::string& host) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Alive(port)[host] && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(50));
  return !Alive(port)[host];
}

TEST_CASE(
    "coordinator: a host whose heartbeats stop but that answers directly "
    "stays alive (a busy machine, or a coordinator that just restarted); "
    "one that does not answer is declared dead",
    "[coordinator][failure]") {
  // A coordinator that restarts knowing two live hosts, neither of which
  // heartbeats to it (as hosts whose channels are still in reconnect
  // backoff, or starved on a loaded machine): host0's ptcd answers calls,
  // nothing listens at host1's address any more.
  testing::DaemonCluster c(1);
  proto::CoordinatorState state = testing::KnownHosts(c, 2);
  proto::HostStatus* gone = state.add_hosts();
  gone->set_name("host1");
  gone->set_address("127.0.0.1:1");
  gone->set_gpus(2);
  gone->set_alive(true);
  testing::TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/state.pb",
                              state.SerializeAsString())
              .ok());
  CoordinatorServerOptions options{"127.0.0.1:0", {dir.path()}};
  // (A probe has half the host timeout to answer: long enough for a busy
  // machine.)
  options.service.host_timeout = absl::Seconds(2);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  const int port = (*coordinator)->port();
  CHECK(DeclaredDead(port, "host1"));
  // Several host timeouts without a heartbeat: host0 is alive all along.
  // Its probe's connection is closed each time it answered (it is asked
  // again after another half timeout): the coordinator does not keep one
  // open to every host that was ever late.
  bool closed = false;
  for (int i = 0; i < 4; ++i) {
    CHECK(Alive(port)["host0"]);
    for (int j = 0; j < 100; ++j) {
      closed |= (*coordinator)->service()->GetCounts().probes_open == 0;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  CHECK(closed);
}

TEST_CASE(
    "coordinator: a rack of hosts behind a cut link (their ptcds keep their "
    "connections and answer nothing) is declared dead in one host timeout, "
    "not in waves of probes",
    "[coordinator][failure]") {
  // 48 hosts of a rack go quiet at once, as behind a switch that failed:
  // each is asked directly for the second half of its timeout. With the
  // questions asked 16 at a time and awaited by the monitor loop, the
  // verdicts took three waves (twice the timeout), and every other host's
  // verdict and every decided commit's retry waited with them.
  testing::SilentStore rack;
  proto::CoordinatorState state;
  for (int i = 0; i < 48; ++i) {
    proto::HostStatus* h = state.add_hosts();
    h->set_name(absl::StrCat("rack0-host", i));
    h->set_address(rack.address());
    h->set_gpus(8);
    h->set_alive(true);
  }
  testing::TempDir dir;
  REQUIRE(
      WriteFileAtomically(dir.path() + "/state.pb", state.SerializeAsString())
          .ok());
  CoordinatorServerOptions options{"127.0.0.1:0", {dir.path()}};
  options.service.host_timeout = absl::Seconds(8);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  // Counted once it started, as the coordinator counts its hosts' silence
  // (a loaded machine's slow start is not the verdict's time).
  const absl::Time started = absl::Now();
  const int port = (*coordinator)->port();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int alive = 48;
  while (alive > 0 && absl::Now() < deadline) {
    alive = 0;
    for (const auto& [name, up] : Alive(port)) alive += up;
    if (alive > 0) absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration took = absl::Now() - started;
  INFO("every host of the rack declared dead after " << took);
  REQUIRE(alive == 0);
  // One timeout and the monitor's rounds (three waves: 16 s).
  CHECK(took < absl::Seconds(14));
  CHECK(rack.calls() >= 48);  // every host was asked
  // Their connections closed with the verdicts.
  const absl::Time closing = absl::Now() + absl::Seconds(30);
  while ((*coordinator)->service()->GetCounts().probes_open > 0 &&
         absl::Now() < closing)
    absl::SleepFor(absl::Milliseconds(20));
  CHECK((*coordinator)->service()->GetCounts().probes_open == 0);
}

TEST_CASE(
    "coordinator: a write of more records than one transaction takes (300 "
    "hosts moved into records of their own) is written in several",
    "[coordinator][failure]") {
  // A state file from before per-host records, with 300 hosts: the first
  // write moves each into a record of its own, more than a transaction
  // holds (kMaxRecordsPerCommit). host0 does not answer, so the
  // coordinator declares it dead: that is the first write.
  proto::CoordinatorState state;
  for (int i = 0; i < 300; ++i) {
    proto::HostStatus* h = state.add_hosts();
    h->set_name(absl::StrCat("host", i));
    h->set_address("127.0.0.1:1");
    h->set_gpus(8);
    h->set_alive(i == 0);
  }
  testing::TempDir dir;
  REQUIRE(
      WriteFileAtomically(dir.path() + "/state.pb", state.SerializeAsString())
          .ok());
  CoordinatorServerOptions options{"127.0.0.1:0", {dir.path()}};
  options.service.host_timeout = absl::Milliseconds(500);
  {
    auto coordinator = CoordinatorServer::Start(options);
    REQUIRE(coordinator.ok());
    REQUIRE(DeclaredDead((*coordinator)->port(), "host0"));
  }
  // Every host is in a record of its own, and host0's death with it.
  int records = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir.path() + "/hosts"))
    records += entry.path().extension() == ".pb";
  CHECK(records == 300);
  auto again = CoordinatorServer::Start(options);
  REQUIRE(again.ok());
  const std::map<std::string, bool> alive = Alive((*again)->port());
  CHECK(alive.size() == 300);
  CHECK(std::none_of(alive.begin(), alive.end(),
                     [](const auto& h) { return h.second; }));
}

}  // namespace
}  // namespace ptc
