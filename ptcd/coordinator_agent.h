// ptcd's link to the coordinator: registers the host, then heartbeats; if
// the coordinator forgets the host (restart, or it was declared dead), it
// registers again. Every heartbeat lists the versions the store holds, and
// the agent deletes those the coordinator says nothing owns any more.
// Runs on its own thread until destroyed.
//
//   CoordinatorAgent agent("10.0.0.1:7000", status, &store);
#ifndef PTC_PTCD_COORDINATOR_AGENT_H_
#define PTC_PTCD_COORDINATOR_AGENT_H_

#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"
#include "tensor_store/store.h"

namespace ptc {

class CoordinatorAgent {
 public:
  // `store` (may be null: nothing is listed or reclaimed) must outlive the
  // agent.
  CoordinatorAgent(std::string coordinator, proto::HostStatus host,
                   Store* store = nullptr);
  ~CoordinatorAgent();
  CoordinatorAgent(const CoordinatorAgent&) = delete;
  CoordinatorAgent& operator=(const CoordinatorAgent&) = delete;

  // True once a registration succeeded; for tests and status output.
  bool registered() const;

 private:
  void Loop();
  // Registers the host; true once it is. `interval` takes the one told;
  // `refused` is the last refusal said (each is said once).
  bool Register(proto::Coordinator::Stub& stub, absl::Duration* interval,
                std::string* refused);
  // An answer came: the loop looks now.
  void Wake();
  // Waits until `deadline`, a Wake or the agent's end; true at the end.
  bool WaitUntil(absl::Time deadline);
  bool DueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || woken_;
  }

  const std::string coordinator_;
  const proto::HostStatus host_;
  Store* const store_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ptc

#endif  // PTC_PTCD_COORDINATOR_AGENT_H_
