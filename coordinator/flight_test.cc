#include "coordinator/flight.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

using JobRecord = proto::CoordinatorState::Job;

// A job committed at version 3 (tp=2 on host a), layout epoch 2, last
// plan epoch 5.
JobRecord Committed() {
  JobRecord job;
  job.set_job("j");
  job.set_config("tp=2");
  job.add_hosts("a");
  job.add_rank_hosts("a");
  job.add_rank_hosts("a");
  job.add_rank_devices(0);
  job.add_rank_devices(1);
  job.set_committed_version(3);
  job.set_committed_step(30);
  job.set_layout_epoch(2);
  job.set_last_epoch(5);
  job.add_open_saves()->set_version(4);
  return job;
}

// tp=1,dp=2 over hosts a and b, version 6, plan epoch 6.
FlightTarget ToTwoHosts() {
  FlightTarget t;
  t.config = "tp=1,dp=2";
  t.rank_hosts = {"b", "a"};
  t.rank_devices = {0, 0};
  t.version = 6;
  t.epoch = 6;
  t.step = 30;
  t.release_hosts = {"a"};
  t.reason = "requested";
  return t;
}

TEST_CASE("a change goes staging, decided, committed, and the target becomes "
          "the committed layout in a new layout epoch") {
  JobRecord job = Committed();
  proto::ReconfigureEvent event;
  REQUIRE(PhaseOf(job) == FlightPhase::kIdle);

  REQUIRE(StartFlight(ToTwoHosts(), job, event).ok());
  CHECK(PhaseOf(job) == FlightPhase::kStaging);
  CHECK(job.target_version() == 6);
  CHECK(job.last_epoch() == 6);
  // Target hosts in the order of the ranks, each once.
  CHECK(std::vector<std::string>(job.target_hosts().begin(),
                                 job.target_hosts().end()) ==
        std::vector<std::string>{"b", "a"});
  CHECK(event.phase() == proto::PHASE_STAGING);
  CHECK(event.plan_epoch() == 6);
  CHECK(event.reason() == "requested");
  CHECK(job.config() == "tp=2");  // nothing committed yet

  REQUIRE(DecideFlight(job, event).ok());
  CHECK(PhaseOf(job) == FlightPhase::kDecided);
  CHECK(event.phase() == proto::PHASE_COMMITTING);

  auto lost = CommitFlight(job, event);
  REQUIRE(lost.ok());
  CHECK(lost->empty());
  CHECK(PhaseOf(job) == FlightPhase::kIdle);
  CHECK(job.config() == "tp=1,dp=2");
  CHECK(job.committed_version() == 6);
  CHECK(job.committed_step() == 30);
  CHECK(job.hosts_size() == 2);
  CHECK(job.rank_hosts(0) == "b");
  CHECK(job.layout_epoch() == 3);
  CHECK(job.open_saves_size() == 0);  // rule 2
  CHECK(job.target_hosts_size() == 0);
  CHECK(job.release_hosts_size() == 0);
  CHECK(job.target_reason() == "requested");
  CHECK(event.phase() == proto::PHASE_COMMITTED);
  CHECK(event.error().empty());
}

TEST_CASE("targets that never acknowledged a decided commit become lost "
          "hosts") {
  JobRecord job = Committed();
  proto::ReconfigureEvent event;
  REQUIRE(StartFlight(ToTwoHosts(), job, event).ok());
  REQUIRE(DecideFlight(job, event).ok());
  REQUIRE(AcknowledgeFlight({"a"}, job).ok());
  REQUIRE(AcknowledgeFlight({"a"}, job).ok());  // twice counts once
  CHECK(job.acked_hosts_size() == 1);
  // Only targets acknowledge.
  CHECK(AcknowledgeFlight({"z"}, job).code() ==
        absl::StatusCode::kInvalidArgument);
  auto lost = CommitFlight(job, event);
  REQUIRE(lost.ok());
  CHECK(*lost == std::vector<std::string>{"b"});
  CHECK(job.lost_hosts_size() == 1);
  CHECK(job.lost_hosts(0) == "b");
  CHECK(event.error().find("committed without host(s) b") != std::string::npos);

  // Every target acknowledged: none is lost, and an error of an earlier
  // try is not shown with the commit.
  job = Committed();
  event.Clear();
  REQUIRE(StartFlight(ToTwoHosts(), job, event).ok());
  REQUIRE(DecideFlight(job, event).ok());
  event.set_error("host b did not answer");
  REQUIRE(AcknowledgeFlight({"a", "b"}, job).ok());
  lost = CommitFlight(job, event);
  REQUIRE(lost.ok());
  CHECK(lost->empty());
  CHECK(job.lost_hosts_size() == 0);
  CHECK(event.error().empty());
}

TEST_CASE("an abort keeps the committed state") {
  JobRecord job = Committed();
  const JobRecord before = job;
  proto::ReconfigureEvent event;
  REQUIRE(StartFlight(ToTwoHosts(), job, event).ok());
  REQUIRE(AbortFlight("host b went silent", job, event).ok());
  CHECK(PhaseOf(job) == FlightPhase::kIdle);
  CHECK(job.config() == before.config());
  CHECK(job.committed_version() == 3);
  CHECK(job.layout_epoch() == 2);
  CHECK(job.open_saves_size() == 1);
  CHECK(job.last_epoch() == 6);  // the epoch stays used
  CHECK(event.phase() == proto::PHASE_ABORTED);
  CHECK(event.plan_epoch() == 6);
  CHECK(event.error() == "host b went silent");
}

TEST_CASE("transitions from the wrong phase are refused and change nothing") {
  JobRecord job = Committed();
  proto::ReconfigureEvent event;
  CHECK(DecideFlight(job, event).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(CommitFlight(job, event).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(AbortFlight("x", job, event).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(AcknowledgeFlight({"a"}, job).code() ==
        absl::StatusCode::kFailedPrecondition);

  REQUIRE(StartFlight(ToTwoHosts(), job, event).ok());
  FlightTarget again = ToTwoHosts();
  again.epoch = 7;
  again.version = 7;
  const absl::Status second = StartFlight(again, job, event);
  CHECK(second.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(second.message()).find("has a change staging (plan epoch 6)") !=
        std::string::npos);
  CHECK(job.target_version() == 6);
  // Not committed before its decision.
  CHECK(CommitFlight(job, event).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(DecideFlight(job, event).ok());
  // A decided change only ends committed (rule 5).
  const absl::Status abort = AbortFlight("x", job, event);
  CHECK(abort.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(abort.message()).find("a decided change") != std::string::npos);
  CHECK(PhaseOf(job) == FlightPhase::kDecided);
}

TEST_CASE("a start with a stale plan epoch or a malformed target is refused") {
  JobRecord job = Committed();
  proto::ReconfigureEvent event;
  FlightTarget stale = ToTwoHosts();
  stale.epoch = 5;  // the job's last epoch: planned before another change
  const absl::Status s = StartFlight(stale, job, event);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("changed while this change was planned") !=
        std::string::npos);

  FlightTarget no_version = ToTwoHosts();
  no_version.version = 0;
  CHECK(StartFlight(no_version, job, event).code() ==
        absl::StatusCode::kInvalidArgument);
  FlightTarget uneven = ToTwoHosts();
  uneven.rank_devices = {0};
  CHECK(StartFlight(uneven, job, event).code() ==
        absl::StatusCode::kInvalidArgument);
  FlightTarget elsewhere = ToTwoHosts();
  elsewhere.hosts = {"a"};  // a rank on b, which it does not target
  CHECK(StartFlight(elsewhere, job, event).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(PhaseOf(job) == FlightPhase::kIdle);
  CHECK(job.last_epoch() == 5);

  // Hosts given explicitly keep their order, and may hold no rank.
  FlightTarget spare = ToTwoHosts();
  spare.hosts = {"a", "b", "c"};
  REQUIRE(StartFlight(spare, job, event).ok());
  CHECK(job.target_hosts_size() == 3);
  CHECK(job.target_hosts(0) == "a");
}

}  // namespace
}  // namespace ptc
