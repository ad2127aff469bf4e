// The coordinator, as this host's training processes reach it: a gRPC
// server on a Unix socket that relays the Coordinator service's calls over
// the daemon's one connection to the coordinator. At 2,048 hosts x 8 GPUs
// the coordinator holds 2,048 connections (and their TLS sessions and
// HTTP/2 buffers) instead of 16,384 (docs/scale.md).
//
// What is relayed, and as whom:
// - Only methods of ptc.proto.Coordinator (others: UNIMPLEMENTED). Each
//   call's one request is forwarded (every Coordinator method takes one;
//   nothing after it is read), and the answers come back message by
//   message (unary calls and the Watch stream alike), with the call's
//   deadline and cancellation and the coordinator's status unchanged.
//   With TLS a call without a job token is refused here
//   (UNAUTHENTICATED).
// - From the caller's metadata only its job token (`ptc-job-token`) goes
//   on, and the relay marks the call relayed (`ptc-relayed`). The
//   coordinator treats a relayed call from a host's certificate as a job's
//   client with that token (common/authz.h): a process gains no right of
//   the host's, and needs its job's token as it would calling directly.
// - Who may connect is who may use the daemon's local socket
//   (common/local_peer.h), checked at accept. At most `max_calls` calls at
//   once, and `max_calls_per_user` of one user's (the uid the connection
//   was accepted from): RESOURCE_EXHAUSTED beyond, so that one local user
//   cannot take every slot from another's job. A call counts from its
//   request on (one that never sends it holds no slot, and a connection
//   at most 2 x max_calls streams); requests above the coordinator's own
//   size limit are refused here; a connection idle for five minutes is
//   closed.
//
// Threads: one accepting connections; calls run on gRPC's callback
// threads, never blocking them. Stop() (or the destructor) cancels calls
// in flight and returns once every one has finished.
//
//   PTC_ASSIGN_OR_RETURN(auto relay, CoordinatorRelay::Start(
//       {.socket_path = "/run/ptcd/coordinator.sock",
//        .coordinator = "coord:7000"}));
#ifndef PTC_PTCD_COORDINATOR_RELAY_H_
#define PTC_PTCD_COORDINATOR_RELAY_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/local_peer.h"

namespace ptc {

struct CoordinatorRelayOptions {
  std::string socket_path;
  // The coordinator address(es), as ptcd's agent is given them.
  std::string coordinator;
  LocalAccess access;
  // Calls relayed at once (a process's Watch stream and its one call in
  // flight: 8 GPUs need 16).
  int max_calls = 1024;
  // Of those, one user's at most.
  int max_calls_per_user = 512;
};

// The relay's socket next to a ptcd's local socket: "-coordinator" before
// its ".sock" (/run/ptcd/ptcd.sock: /run/ptcd/ptcd-coordinator.sock), or
// ".coordinator" after a path without one.
std::string RelaySocketFor(const std::string& local_socket);

class CoordinatorRelay {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorRelay>> Start(
      CoordinatorRelayOptions options);
  ~CoordinatorRelay();
  CoordinatorRelay(const CoordinatorRelay&) = delete;
  CoordinatorRelay& operator=(const CoordinatorRelay&) = delete;

  void Stop();
  const std::string& socket_path() const { return options_.socket_path; }
  // Calls being relayed now.
  int active_calls() const { return active_.load(); }

  class Call;

 private:
  class Service;

  explicit CoordinatorRelay(CoordinatorRelayOptions options);
  void AcceptLoop();
  // The uid of the connection gRPC names `peer` ("fd:N" for one added
  // from a descriptor); -1 if not known.
  int64_t UserOf(const std::string& peer) const;
  // Counts a call of `user` against the bounds (RESOURCE_EXHAUSTED with
  // the reason beyond them); GiveSlot when it ends.
  absl::Status TakeSlot(int64_t user);
  void GiveSlot(int64_t user);

  CoordinatorRelayOptions options_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};
  mutable absl::Mutex slots_mu_;
  std::map<int, int64_t> user_of_fd_ ABSL_GUARDED_BY(slots_mu_);
  std::map<int64_t, int> calls_of_user_ ABSL_GUARDED_BY(slots_mu_);
  std::unique_ptr<grpc::GenericStub> upstream_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread accept_thread_;
};

}  // namespace ptc

#endif  // PTC_PTCD_COORDINATOR_RELAY_H_
