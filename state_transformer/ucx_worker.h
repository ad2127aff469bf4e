// One UCX worker per ptcd, for bulk bytes between daemons: tagged sends to
// a peer worker's address and tagged receives into the caller's buffer.
// UCX picks the path (shared memory or CMA between processes of one
// machine, TCP between machines, RDMA where the NICs have it). Addresses
// are exchanged only through ptcd's authenticated, epoch-checked gRPC
// calls; nothing is read from a peer's memory without its daemon sending it.
//
// Thread-safe (UCS_THREAD_MODE_MULTI): any thread may send, receive and
// progress the worker. Endpoints to peers are cached by address.
//
//   PTC_ASSIGN_OR_RETURN(auto w, UcxWorker::Create());
//   PTC_ASSIGN_OR_RETURN(auto r, w->PostReceive(tag, buf, n));
//   ... ask the peer to Send(w->address(), tag, ...) ...
//   PTC_ASSIGN_OR_RETURN(size_t got, w->Wait(r.get(), absl::Seconds(60)));
#ifndef PTC_STATE_TRANSFORMER_UCX_WORKER_H_
#define PTC_STATE_TRANSFORMER_UCX_WORKER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ptc {

class UcxWorker {
 public:
  // A receive posted with PostReceive; Wait completes it (or cancels it on
  // timeout); the buffer must stay valid until then.
  struct Receive {
    void* request = nullptr;  // ucp request, until completed or cancelled
  };

  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's address, for peers to send to.
  const std::string& address() const { return address_; }

  absl::StatusOr<std::unique_ptr<Receive>> PostReceive(uint64_t tag,
                                                       void* buffer,
                                                       size_t size);
  // Drives the worker until the receive completes and returns the bytes
  // received. Cancels it and returns DEADLINE_EXCEEDED after `timeout`, or
  // CANCELLED as soon as `give_up` (polled while waiting) returns true.
  absl::StatusOr<size_t> Wait(Receive* receive, absl::Duration timeout,
                              const std::function<bool()>& give_up = nullptr);
  // Cancels a posted receive that will not be waited for.
  void Cancel(Receive* receive);

  // Sends `size` bytes with `tag` to the worker at `peer` and waits until
  // the buffer may be reused.
  absl::Status Send(const std::string& peer, uint64_t tag, const void* buffer,
                    size_t size, absl::Duration timeout);

 private:
  UcxWorker() = default;
  // Drives the worker until `request` completes, `deadline`, or `give_up`.
  absl::Status Progress(void* request, absl::Time deadline, const char* what,
                        const std::function<bool()>& give_up = nullptr);

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string address_;
  absl::Mutex mu_;
  std::map<std::string, void*> endpoints_ ABSL_GUARDED_BY(mu_);  // ucp_ep_h
};

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_UCX_WORKER_H_
