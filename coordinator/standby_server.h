// What a coordinator that stands by (it did not win etcd's election)
// serves at its address until it leads: every Coordinator call is
// answered UNAVAILABLE with the leader's address, and gRPC's health
// service says NOT_SERVING. The leader's server says SERVING
// (coordinator_server.cc). A channel given every coordinator's address
// (common/channel.h) sends its calls only to the one that serves, so
// ptcd, clients and ptcctl follow the leader; a caller given a standby's
// address alone is told where the leader is.
//
//   PTC_ASSIGN_OR_RETURN(auto standby, StandbyServer::Start(
//       "10.0.0.7:7000", [&] { return etcd->SeenLeader(); }));
//   ... etcd->Campaign(...) ...  // blocks until this coordinator leads
//   standby->Shutdown();         // the port is free for the leader's server
#ifndef PTC_COORDINATOR_STANDBY_SERVER_H_
#define PTC_COORDINATOR_STANDBY_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ptc {

class StandbyServer {
 public:
  // Listens at `listen_address` (port 0 picks one). `leader` returns the
  // leading coordinator's address as last seen (empty if none leads).
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen_address, std::function<std::string()> leader);
  ~StandbyServer();
  int port() const { return port_; }
  // Stops listening and ends the calls in progress; the port is free when
  // it returns.
  void Shutdown();

 private:
  class Redirect;
  StandbyServer() = default;
  std::unique_ptr<Redirect> redirect_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// What a standby answers every call with: UNAVAILABLE naming the leader
// (`leader` empty: none leads now).
std::string StandbyMessage(const std::string& leader);

}  // namespace ptc

#endif  // PTC_COORDINATOR_STANDBY_SERVER_H_
