// A job's change in flight as a state machine over its durable record
// (proto::CoordinatorState::Job, what the control store keeps) and the
// event its watchers see (proto::ReconfigureEvent). Pure: no locks, no
// RPCs, no store. The coordinator makes each transition under its lock,
// persists the record as one transaction before it acts on it, and
// carries out its effects (the driver stages and commits on the hosts).
//
//   idle ──Start──▶ staging ──Decide──▶ decided ──Commit──▶ idle (committed)
//                     │                   ▲   │
//                     └──Abort──▶ idle    └───┘ Acknowledge (hosts that
//                                               committed the decision)
//
// A restart finds the record in one of these phases and settles it by
// the same transitions: staging is aborted, decided is committed (rule 5
// of coordinator_service.h). A hot switch (the processes moved the state
// themselves and saved it) is Start, Decide and Commit at once.
//
//   FlightTarget t{.config = "tp=2,dp=2", .rank_hosts = ..., .version = 9,
//                  .epoch = 4, ...};
//   PTC_RETURN_IF_ERROR(StartFlight(t, job.state, job.event));
//   PTC_RETURN_IF_ERROR(PersistLocked());  // then start the driver
#ifndef PTC_COORDINATOR_FLIGHT_H_
#define PTC_COORDINATOR_FLIGHT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace ptc {

enum class FlightPhase {
  kIdle,     // no change in flight (target_version 0)
  kStaging,  // started: its target is staged on the hosts, not decided
  kDecided,  // its commit is decided: it only ends committed
};

FlightPhase PhaseOf(const proto::CoordinatorState::Job& job);

// What a change is to make the job's committed state.
struct FlightTarget {
  std::string config;
  // Host name and GPU of every rank of `config`, in rank order.
  std::vector<std::string> rank_hosts;
  std::vector<int32_t> rank_devices;
  // The hosts it places the job on, in order (empty: those of rank_hosts,
  // in rank order).
  std::vector<std::string> hosts;
  int64_t version = 0;  // a new number of the job (rule 1)
  int64_t epoch = 0;    // the plan epoch, above every one before
  int64_t step = 0;     // the training step the version holds
  // The snapshot directory it restores from (empty: from the hosts).
  std::string restore_dir;
  // Hosts whose source version is released after the commit.
  std::vector<std::string> release_hosts;
  std::string reason;  // who asked (ReconfigureEvent.reason)
};

// idle -> staging: records the target (target_* fields, last_epoch) and
// sets the event to PHASE_STAGING for `target.epoch`.
absl::Status StartFlight(const FlightTarget& target,
                         proto::CoordinatorState::Job& job,
                         proto::ReconfigureEvent& event);

// staging -> decided: the target's fingerprints are proven; once this
// record is durable the change only ends committed.
absl::Status DecideFlight(proto::CoordinatorState::Job& job,
                          proto::ReconfigureEvent& event);

// decided: `hosts` (targets) committed the decided version.
absl::Status AcknowledgeFlight(const std::vector<std::string>& hosts,
                               proto::CoordinatorState::Job& job);

// decided -> idle: the target becomes the job's committed layout, in a
// new layout epoch (rule 2: open saves end). Targets that never
// acknowledged, when some did, no longer hold the version (they died
// after the decision): they become lost hosts, and are returned.
absl::StatusOr<std::vector<std::string>> CommitFlight(
    proto::CoordinatorState::Job& job, proto::ReconfigureEvent& event);

// staging -> idle: the target is dropped, the committed state stays;
// the event says PHASE_ABORTED and `why`.
absl::Status AbortFlight(const std::string& why,
                         proto::CoordinatorState::Job& job,
                         proto::ReconfigureEvent& event);

}  // namespace ptc

#endif  // PTC_COORDINATOR_FLIGHT_H_
