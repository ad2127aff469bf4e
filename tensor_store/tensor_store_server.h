// The ptcd daemon as a handle: the store, its gRPC service and its local
// Unix-socket server, started together and stopped in the destructor.
// Tests start it in-process on localhost:0; ptcd's main() starts it from
// flags and a config file.
//
//   PTC_ASSIGN_OR_RETURN(auto ptcd, TensorStoreServer::Start({
//       .listen_address = "127.0.0.1:0", .socket_path = dir + "/ptcd.sock"}));
//   auto client = StoreClient::Connect(absl::StrCat("127.0.0.1:",
//   ptcd->port()));
#ifndef PTC_TENSOR_STORE_TENSOR_STORE_SERVER_H_
#define PTC_TENSOR_STORE_TENSOR_STORE_SERVER_H_

#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "tensor_store/local_server.h"
#include "tensor_store/store.h"
#include "tensor_store/tensor_store_service.h"

namespace ptc {

struct TensorStoreServerOptions {
  // host:port for gRPC; port 0 picks a free port (see port()).
  std::string listen_address = "127.0.0.1:0";
  // Unix socket for local clients; empty: no local server.
  std::string socket_path;
  int64_t memory_limit_bytes = int64_t{8} << 30;
  // Pre-allocated memory kept ready for local saves (see SparePool); 0: none.
  int64_t spare_pool_bytes = 0;
  // Fingerprint committed versions in the background (see StoreOptions).
  bool fingerprint_committed = true;
  // Keep metadata, no bytes (StoreOptions::hollow): a scale test's host.
  bool hollow = false;
  // Largest gRPC message accepted; larger ones fail with RESOURCE_EXHAUSTED.
  int max_message_bytes = 8 << 20;
  // A save (a gRPC Put stream, or a local put) not finished this long after
  // it reserved its memory is cancelled and the memory freed.
  absl::Duration put_timeout = absl::Minutes(10);
  // Users besides the daemon's own and root allowed on the local socket.
  std::vector<uid_t> allowed_uids;
  // The group whose members may use the local socket; nullopt: the
  // daemon's own group.
  std::optional<gid_t> allowed_gid;
  // This host's name in the cluster (ptcd --name), for local clients.
  std::string host_name;
  // Told to local clients (Hello): the socket of the daemon's coordinator
  // relay and the coordinator it relays to; empty: none.
  std::string coordinator_relay;
  std::string coordinator;
  // The hosts admitted to read each job here (the transformer's AdmitPeers
  // fills it; the store's reads by hosts check it). Shared with the
  // services below that need it.
  std::shared_ptr<PeerAdmissions> peer_admissions =
      std::make_shared<PeerAdmissions>();
  // More services on the same port, built over the store (ptcd adds the
  // state transformer this way; tensor_store does not depend on it).
  std::vector<std::function<std::unique_ptr<grpc::Service>(Store*)>> services;
};

class TensorStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<TensorStoreServer>> Start(
      TensorStoreServerOptions options);
  ~TensorStoreServer() { Shutdown(absl::ZeroDuration()); }

  int port() const { return port_; }
  Store* store() { return &store_; }
  LocalServer* local() { return local_.get(); }

  // Stops taking new calls and local connections, lets calls in flight
  // finish for up to `drain`, then cancels the rest. Idempotent.
  void Shutdown(absl::Duration drain);
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  explicit TensorStoreServer(const TensorStoreServerOptions& options)
      : store_(StoreOptions{options.memory_limit_bytes,
                            options.spare_pool_bytes,
                            options.fingerprint_committed, options.hollow}) {}

  Store store_;
  std::unique_ptr<LocalServer> local_;
  std::unique_ptr<TensorStoreService> service_;
  std::vector<std::unique_ptr<grpc::Service>> extra_services_;
  std::unique_ptr<grpc::Server> server_;
  // Read by PrometheusText; declared last, so unregistered first.
  std::vector<std::unique_ptr<Gauge>> gauges_;
  int port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_TENSOR_STORE_SERVER_H_
