// ptc-coordinator as a handle: the service on a gRPC port, stopped in the
// destructor. Tests start it in-process on localhost:0.
//
//   PTC_ASSIGN_OR_RETURN(auto c, CoordinatorServer::Start({"127.0.0.1:0",
//   {dir}}));
#ifndef PTC_COORDINATOR_COORDINATOR_SERVER_H_
#define PTC_COORDINATOR_COORDINATOR_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "coordinator/coordinator_service.h"

namespace ptc {

struct CoordinatorServerOptions {
  std::string listen_address = "127.0.0.1:0";
  CoordinatorOptions service;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorServerOptions options);
  ~CoordinatorServer() { Shutdown(); }
  int port() const { return port_; }
  CoordinatorService* service() { return service_.get(); }
  void Shutdown();

 private:
  CoordinatorServer() = default;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  // Read by PrometheusText; declared last, so unregistered first.
  std::vector<std::unique_ptr<Gauge>> gauges_;
  int port_ = 0;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_COORDINATOR_SERVER_H_
