// Drives one reconfiguration across the daemons of a job, atomically:
//   1. every target host stages version v+1 by executing its fragment
//      (ExecuteFragment; pieces from its own store and from peers);
//   2. the per-tensor fingerprints of v+1 (each element counted once across
//      target hosts) must equal those of v (each element once across live
//      source hosts): the new layout holds exactly the old values;
//   3. then v+1 is committed on every target host and v released on every
//      live source host.
// Any failure before step 3 aborts v+1 on every target host and leaves v
// exactly as it was; the error names the host and what went wrong.
//
//   PTC_ASSIGN_OR_RETURN(ReconfigureReport r, RunReconfiguration(request,
//   on_progress));
#ifndef PTC_COORDINATOR_RECONFIGURE_DRIVER_H_
#define PTC_COORDINATOR_RECONFIGURE_DRIVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "plan/plan.h"
#include "proto/snapshot.pb.h"

namespace ptc {

struct ReconfigureRequest {
  const PlanInput* input = nullptr;
  const Plan* plan = nullptr;  // validated host-level plan for `input`
  std::string job;
  int64_t source_version = 0;  // committed on the source hosts
  int64_t target_version = 0;  // new
  int64_t plan_epoch = 0;      // > every earlier epoch of the job
  // gRPC address of every host id the plan involves.
  std::map<int32_t, std::string> addresses;
  int parallel_pulls = 4;
  proto::Transport transport = proto::TRANSPORT_AUTO;
  // How long a target waits on a silent source (ExecuteFragmentRequest's
  // peer_timeout_ms): the coordinator sends twice its host timeout.
  absl::Duration peer_timeout = absl::Seconds(60);
  // Keep version v on the source hosts after the commit (default: release).
  bool keep_source = false;
  // Called once the fingerprints are proven, before any host commits: the
  // coordinator makes its commit decision durable here. An error aborts.
  std::function<absl::Status()> before_commit;
  // Set by another thread to abort: staging calls are cancelled and the
  // staged version is deleted everywhere (unless the commit was decided).
  const std::atomic<bool>* cancel = nullptr;
  // Whether a host is alive now (empty: all are). An abort skips dead
  // hosts (they clean up when they return); after the decision, a commit
  // that some host did not acknowledge is left to the caller's retries.
  std::function<bool(int32_t host)> is_alive;
  // The snapshot that pieces and small objects with source host
  // kFromSnapshot are read from (in `snapshot_dir`); the change is then
  // proven against its fingerprints.
  const proto::SnapshotManifest* snapshot = nullptr;
  std::string snapshot_dir;
  // Plans the change again for `input`, which is the request's with the
  // sources that did not answer at its start marked late (a link cut
  // before their heartbeats were late): a validated plan that sends from
  // them only what no other live host holds. Empty: the plan is kept.
  std::function<absl::StatusOr<Plan>(const PlanInput& input)> replan;
  // Whether the host's last heartbeat came within about one interval
  // (empty: none did). A source that did not answer in time but still heartbeats
  // is slow, not cut off: it is told again, and the plan kept.
  std::function<bool(int32_t host)> heard_lately;
  // The copy the coordinator keeps of source rank `rank`'s small object
  // `name` (a move's kept_rank), or null: attached to the move in its
  // target's request. Empty: none is kept.
  std::function<const std::string*(const std::string& name, int32_t rank)>
      kept_copy;
};

struct ReconfigureProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int hosts_done = 0;
  int hosts_total = 0;
  // The fragment (index in the plan) whose report this is, its bytes done
  // and whether it finished; -1 when none.
  int fragment = -1;
  int64_t fragment_bytes_done = 0;
  bool fragment_done = false;
};

struct ReconfigureReport {
  double seconds = 0;
  // Of `seconds`: building the target version on every host (moving the
  // bytes; the source's fingerprints are taken meanwhile), and proving it
  // equal to the source (the target's fingerprints, and the source's if
  // they took longer than staging).
  double staging_seconds = 0;
  double verifying_seconds = 0;
  // Of staging: telling the sources which targets pull from them, and
  // when the target hosts' fragments ended, from the first to the last
  // (min / median / max, seconds after staging's start; logged).
  double admitting_seconds = 0;
  double hosts_staged_seconds[3] = {0, 0, 0};
  int64_t bytes_moved = 0;          // all pieces, local and remote
  int64_t bytes_from_peers = 0;     // pieces that crossed hosts
  int tensors_verified = 0;         // fingerprints equal before and after
  int64_t snapshot_bytes_read = 0;  // read from the snapshot's files
};

// Fault injection for the process tests (tests/python): with the
// environment variable PTC_TEST_PAUSE=<point>:<seconds>, the coordinator
// sleeps that long at that point of every change, so that a test can kill
// or stop a host there, and logs "test fault point <point>". Points:
// after_admission (planned, the sources told who may pull, nothing staged
// yet), before_decision (fingerprints proven, not yet decided),
// after_decision (decided and durable, no host committed).
void PauseAtFailpoint(absl::string_view point);

// `progress` is called from the driver's threads, serialized.
absl::StatusOr<ReconfigureReport> RunReconfiguration(
    const ReconfigureRequest& request,
    const std::function<void(const ReconfigureProgress&)>& progress = nullptr);

// The last steps on their own, by address, for a coordinator that restarts
// with a decision on disk: commit a staged version on every host (each
// call with `deadline`, retrying an unavailable host up to `attempts`
// times; `acked`, if given, receives the addresses that acknowledged),
// abort it, or release an old version.
absl::Status CommitStagedOn(const std::vector<std::string>& addresses,
                            const std::string& job, int64_t version,
                            int64_t epoch, int attempts = 5,
                            absl::Duration deadline = absl::Seconds(10),
                            std::vector<std::string>* acked = nullptr);
void AbortStagedOn(const std::vector<std::string>& addresses,
                   const std::string& job, int64_t version, int64_t epoch,
                   absl::Duration deadline = absl::Seconds(10));
// Deletes `version` on each address, best effort (logged): each call gives
// up after `deadline`. A release is an early cleanup: a host that missed
// it (busy, cut off) drops the version, which nothing owns, when its next
// heartbeat lists it.
void ReleaseOn(const std::vector<std::string>& addresses,
               const std::string& job, int64_t version,
               absl::Duration deadline = absl::Seconds(3));
// Calls fn(address) for every address, up to `max_at_once` at a time (a
// thread each), waits for all, and returns the first error: a commit or
// release costs one round trip per `max_at_once` hosts, not one per host.
absl::Status OnEachAddress(
    const std::vector<std::string>& addresses,
    const std::function<absl::Status(const std::string&)>& fn,
    size_t max_at_once = 64);
// Calls call(address, ctx) for every address, up to `max_at_once` at a
// time, each on a context whose deadline is `deadline` from when that call
// starts: a host asked in the last of many rounds gets its whole time, not
// what the rounds before it left (at 1,024 sources, 64 at a time on a busy
// coordinator, the later rounds' calls had expired before they were made).
// Every context is cancelled once `cancel` reads true, and an address's
// once `gone(address)` says so (looked at every 200 ms); a cancelled call
// not yet made fails CANCELLED at once.
void CallEachWithin(
    const std::vector<std::string>& addresses, absl::Duration deadline,
    const std::function<void(const std::string&, grpc::ClientContext*)>& call,
    const std::atomic<bool>* cancel = nullptr,
    const std::function<bool(const std::string&)>& gone = nullptr,
    size_t max_at_once = 64);

}  // namespace ptc

#endif  // PTC_COORDINATOR_RECONFIGURE_DRIVER_H_
