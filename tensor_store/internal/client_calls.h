// Bounds on the calls that jobs' clients hold at once on ptcd's gRPC
// server. Its threads are few (kMaxRpcThreads) and a streaming call holds
// one until it ends: without bounds, one client opening idle Put streams
// takes them all and ptcd answers everyone, the coordinator and peers
// included, "Server Threadpool Exhausted". Clients' calls are bounded per
// connection (one process), per job and all together, below the server's
// threads, so that the coordinator's, admins' and peers' calls (which are
// not counted) always find a thread.
//
//   ClientCalls calls;
//   PTC_ASSIGN_OR_RETURN(ClientCalls::Slot slot,
//                        calls.Enter(ctx->peer(), job, "Put"));
//   ... the call runs; its slot is given back when `slot` goes ...
//
// Thread-safe. A refusal is RESOURCE_EXHAUSTED naming the bound that was
// reached, so that a client retries later or opens fewer streams.
#ifndef PTC_TENSOR_STORE_INTERNAL_CLIENT_CALLS_H_
#define PTC_TENSOR_STORE_INTERNAL_CLIENT_CALLS_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ptc {

class ClientCalls {
 public:
  struct Bounds {
    int per_connection = 32;
    int per_job = 96;
    // At most three quarters of the server's 256 threads; the rest are
    // the coordinator's, admins' and peers'.
    int all = 192;
  };

  // One call's place; given back when destroyed. Move-only.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept { *this = std::move(o); }
    Slot& operator=(Slot&& o) noexcept;
    ~Slot();

   private:
    friend class ClientCalls;
    ClientCalls* calls_ = nullptr;
    std::string connection_, job_;
  };

  ClientCalls() : ClientCalls(Bounds{}) {}
  explicit ClientCalls(Bounds bounds) : bounds_(bounds) {}

  // A slot for a call on `connection` (the caller's address as gRPC gives
  // it) acting for `job` (empty when the call names none);
  // RESOURCE_EXHAUSTED naming `rpc` and the bound reached otherwise.
  absl::StatusOr<Slot> Enter(const std::string& connection,
                             const std::string& job, const char* rpc);

  // Calls held now, all together.
  int active() const;

 private:
  void Leave(const std::string& connection, const std::string& job);

  const Bounds bounds_;
  mutable absl::Mutex mu_;
  int all_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> connections_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_INTERNAL_CLIENT_CALLS_H_
