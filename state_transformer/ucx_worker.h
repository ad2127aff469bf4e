// One UCX worker per ptcd, for bulk bytes between daemons: tagged sends to
// a peer worker's address and tagged receives into the caller's buffer.
// UCX picks the path: eager messages, or a rendezvous in which the
// receiver reads the send's buffer (RDMA on a cluster, CMA on one
// machine) for the length of that one send. Addresses are exchanged only
// through ptcd's epoch-checked gRPC calls.
//
// The context has no one-sided operations (UCP_FEATURE_RMA/AMO): where no
// transport can read or write memory by itself (TCP; shared memory that
// UCX did not allocate), UCX 1.13 serves a peer's get or put in software,
// copying from or to whatever address the peer names, with no check of
// the key against a registration (docs/security.md). Without the feature
// the worker installs no handler for those messages, so no peer reads or
// writes a ptcd's memory except the bytes the ptcd itself sends it.
//
// A serving worker is thread-safe (UCS_THREAD_MODE_MULTI): any thread may
// send, receive and progress it, and a background thread progresses it,
// so peers' sends complete. A non-serving worker belongs to one thread at
// a time: UCX's multi-thread lock costs more than the copy when several
// threads pull at once. Endpoints to peers are cached, up to a bound: past
// it, the one least recently used that no send is using is closed (each
// holds a mapping of the peer's shared-memory queue, which outlives the
// peer; a daemon's peers' workers come and go over months of changes).
//
//   PTC_ASSIGN_OR_RETURN(auto w, UcxWorker::Create());
//   PTC_ASSIGN_OR_RETURN(auto r, w->PostReceive(tag, buf, n));
//   ... ask the peer to Send(w->address(), tag, ...) ...
//   PTC_ASSIGN_OR_RETURN(size_t got, w->Wait(r.get(), absl::Seconds(60)));
#ifndef PTC_STATE_TRANSFORMER_UCX_WORKER_H_
#define PTC_STATE_TRANSFORMER_UCX_WORKER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"

namespace ptc {

class UcxWorker {
 public:
  // A receive posted with PostReceive; Wait completes it (or cancels it on
  // timeout); the buffer must stay valid until then.
  struct Receive {
    void* request = nullptr;  // ucp request, until completed or cancelled
  };

  // A daemon's worker (`serve`): shared by threads, progressed in the
  // background so peers' sends complete. Otherwise a worker for
  // one thread at a time (no locks, no background thread), such as each
  // pulling thread's: the owner progresses it while waiting.
  // `max_endpoints`: how many endpoints to peers it keeps open.
  static constexpr int kMaxEndpoints = 1024;
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(
      bool serve = true, int max_endpoints = kMaxEndpoints);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's address, for peers to send to.
  const std::string& address() const { return address_; }
  // Endpoints to peers open now, and ever closed while the worker lives
  // (the least recently used beyond the bound, and broken ones).
  int open_endpoints();
  int64_t closed_endpoints();

  absl::StatusOr<std::unique_ptr<Receive>> PostReceive(uint64_t tag,
                                                       void* buffer,
                                                       size_t size);
  // Drives the worker until the receive completes and returns the bytes
  // received. Cancels it and returns DEADLINE_EXCEEDED after `timeout`, or
  // CANCELLED as soon as `give_up` (polled while waiting) returns true.
  absl::StatusOr<size_t> Wait(Receive* receive, absl::Duration timeout,
                              const std::function<bool()>& give_up = nullptr);
  // Drives the worker until `done()` or `deadline`.
  void ProgressUntil(const std::function<bool()>& done, absl::Time deadline);
  // Cancels a posted receive that will not be waited for.
  void Cancel(Receive* receive);

  // True after Abandon: receives may still be in flight into the caller's
  // buffers, so the worker must be destroyed
  // (which ends them) before those buffers are freed, and not used again.
  bool broken() const { return broken_; }
  // After a transfer with a peer failed part-way: the worker is never
  // progressed again, and its destruction skips the graceful close (which
  // progresses it). A peer killed while writing into this worker's
  // shared-memory queue leaves a half-written message there that UCX
  // would trip over (seen: an assertion aborting ptcd). Destroying it
  // still tears down its transports, ending any DMA into the caller's
  // buffers. Posted receives are dropped without completing.
  void Abandon() {
    broken_ = true;
    abandoned_ = true;
  }

  // One tagged message: `size` bytes at `data`.
  struct SendOp {
    uint64_t tag;
    const void* data;
    size_t size;
  };
  // Sends every op to the worker at `peer`, one after the other, and waits
  // until all buffers may be reused; DEADLINE_EXCEEDED if one takes longer
  // than `timeout`, CANCELLED as soon as `give_up` says so (the caller's
  // call was cancelled, or the daemon drains).
  absl::Status Send(const std::string& peer, absl::Span<const SendOp> ops,
                    absl::Duration timeout,
                    const std::function<bool()>& give_up = nullptr);

 private:
  // An endpoint to a peer and the sends using it now.
  struct Peer {
    void* ep = nullptr;  // ucp_ep_h
    int users = 0;
    uint64_t last_taken = 0;  // of taken_: the least recent goes first
    bool broken = false;      // forgotten; closed when no send uses it
  };

  UcxWorker() = default;
  // The endpoint to `peer` for one Send (created on first use), and its
  // return; a `broken` one is forgotten, and closed once no send uses it.
  absl::StatusOr<Peer*> TakeEndpoint(const std::string& peer);
  void GiveBack(Peer* peer, bool broken);
  // Closes `ep` (forced: no send uses it) and waits until UCX is done.
  void CloseEndpoint(void* ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs in progress_thread_ until stop_.
  void ProgressLoop();
  // Drives the worker until `request` completes, `deadline`, or `give_up`.
  absl::Status Progress(void* request, absl::Time deadline, const char* what,
                        const std::function<bool()>& give_up = nullptr);

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string address_;
  absl::Mutex mu_;
  int max_endpoints_ = kMaxEndpoints;
  std::map<std::string, std::unique_ptr<Peer>> endpoints_ ABSL_GUARDED_BY(mu_);
  // Broken endpoints that sends still used when they broke.
  std::vector<std::unique_ptr<Peer>> broken_endpoints_ ABSL_GUARDED_BY(mu_);
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t closed_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Gauge> endpoints_gauge_;  // a serving worker's
  std::atomic<bool> stop_{false};
  bool broken_ = false;
  bool abandoned_ = false;
  std::thread progress_thread_;
};

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_UCX_WORKER_H_
