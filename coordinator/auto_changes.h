// Automatic changes: what the coordinator's auto loop remembers of each
// job and how it judges one. A job with an automatic-change policy is
// changed when its hosts die, are drained or join its pool, when its
// policy changes, and when one of its processes dies; a pending change
// (requested to start from the job's next save) starts once that save
// committed, or from the committed version when the save will not come.
//
// Judge is pure over the job's record, the host registry and the time; it
// says what to start, and the coordinator starts it outside its lock (the
// advisor plans candidates, a change is planned and started). Not
// persisted: after a failover the new leader judges every job afresh.
// Not thread-safe: the coordinator calls it under its lock.
//
//   AutoChanges auto_changes;
//   if (auto action = auto_changes.Judge(name, job, hosts, absl::Now()))
//     ... start action->reason's change (outside the lock)
#ifndef PTC_COORDINATOR_AUTO_CHANGES_H_
#define PTC_COORDINATOR_AUTO_CHANGES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/host_registry.h"
#include "coordinator/job_table.h"
#include "proto/coordinator.pb.h"

namespace ptc {

// "host a", "hosts a, b", and for more than kHostsNamed "hosts a, b, ...,
// h and 120 more": the reason an automatic change gives, which its event
// carries to every process of the job and the log repeats while no change
// can start (a rack of 128 hosts named in full would be 2 KiB a message).
inline constexpr size_t kHostsNamed = 8;
std::string NameHosts(const std::vector<std::string>& hosts);

// An automatic change that failed to start is not tried again for this long.
inline constexpr absl::Duration kAutoRetry = absl::Seconds(10);
// One that found the job busy a moment (ABORTED: a save committing, the job
// changed as it was planned) is tried again after this.
inline constexpr absl::Duration kAutoRetryAborted = absl::Milliseconds(500);
// How long a pending change waits for its save unless the policy says.
inline constexpr double kDefaultSaveTimeout = 60;

// Whether an automatic change may place the job of record `job` on `host`
// now: a usable host, and not one held back after repeated false deaths
// (HostRegistry::HeldBack: the job grows onto it once the hold ends)
// unless the job already runs there.
bool MayPlaceOn(const HostRegistry& hosts,
                const proto::CoordinatorState::Job& job,
                const std::string& host, absl::Time now);
// The same for a host the caller found (HostRegistry::Find): one lookup
// where a look asks it of every host of a pool.
bool MayPlaceOn(const HostRegistry::Host& host,
                const proto::CoordinatorState::Job& job, absl::Time now);

class AutoChanges {
 public:
  struct Action {
    std::string job;
    std::string
        reason;  // "host h3 died", "its automatic-change policy changed"
    // The job's processes save first (a live job whose hosts are still up).
    bool save_first = false;
    // Start the job's pending change (`request`) now.
    bool pending = false;
    proto::ReconfigureRequest request;
    // The job must leave its layout even if the advisor would keep it (a
    // process died: the others cannot go on).
    bool must_change = false;
  };

  // One look at the job at `now`: what to start, if anything. It changes
  // the job's record where the look decides it: dead hosts leave its pool
  // (ChangeHosts adds them back), and a hot switch that lost a process is
  // dropped (its change is planned again from the committed version).
  // A job with a change in flight, a save committing, or an automatic
  // change that failed less than kAutoRetry ago is left alone.
  std::optional<Action> Judge(const std::string& name, JobTable::Job& job,
                              const HostRegistry& hosts, absl::Time now);

  // Hosts that die together (a rack's power, a switch) are declared dead
  // over several of the monitor's rounds: a change started at the first
  // would place ranks on the others, abort when they are declared, and
  // wait kAutoRetry. So a due change waits while a host of the job's pool
  // is late (HostRegistry::Late: in doubt), until it is declared dead or
  // heard from again, for at most its timeout and two of its intervals
  // more. A change for a death waits only for hosts that went silent
  // with the dead: last heard no later than kSilentTogether and two of
  // the host's intervals after the last of them was (their last beats
  // lie within an interval, and the coordinator's hearing of them may
  // lag). A host late for another reason (a stall under load seconds
  // later) does not hold up every job's recovery for its timeout: at 512
  // hollow hosts one process's 128 hosts, silent 13 s after the killed
  // ones, were late through the 20 s the change waited. Off by default:
  // no wait.
  void WaitForLateHosts(bool wait) { wait_for_late_ = wait; }
  static constexpr absl::Duration kSilentTogether = absl::Seconds(5);

  // A process of the job died under layout `epoch` (`why` says how).
  void ProcessExited(const std::string& job, int64_t epoch, std::string why);
  // The job's policy is about to be replaced; `old_policy` is the one the
  // loop compares with if it has not looked at the job since.
  void PolicyChanging(const std::string& job,
                      const proto::AutoPolicy& old_policy);
  // An automatic change of the job failed to start at `now`: after `wait`
  // the job is judged afresh (what the failed look saw must not count as
  // handled: a policy change that found a save committing would otherwise
  // never be acted on).
  void Failed(const std::string& job, absl::Time now,
              absl::Duration wait = kAutoRetry) {
    retry_[job] = now + wait;
    seen_.erase(job);
  }
  // Hosts were added or drained: every job is judged afresh.
  void HostsChanged() {
    seen_.clear();
    retry_.clear();
  }
  void Forget(const std::string& job);

  // The loop looks now rather than at its next round (a save committed,
  // hosts changed, a process died).
  void Wake() { wake_ = true; }
  bool woken() const { return wake_; }
  void Woke() { wake_ = false; }

 private:
  // Per job: what the loop last judged (policy, pool hosts in service and
  // their GPUs), so that it advises again only when that changes.
  std::map<std::string, std::string> seen_;
  std::map<std::string, std::string> seen_policy_;
  // Per job: a process that died (the layout epoch it ran under, why).
  std::map<std::string, std::pair<int64_t, std::string>> process_exits_;
  // Per job: when it may be tried again after a change failed to start.
  std::map<std::string, absl::Time> retry_;
  // Per job: since when a change for a death waits for late hosts.
  std::map<std::string, absl::Time> waiting_since_;
  bool wait_for_late_ = false;
  bool wake_ = false;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_AUTO_CHANGES_H_
