// The Unix-socket server through which training processes on this host
// save and load regions by shared memory (proto/local.proto).
//
// One thread per connection. Puts a connection allocated but did not
// commit are aborted, and regions it mapped are released, when it
// disconnects. A handle or lease belongs to the connection that obtained
// it; others get PERMISSION_DENIED. Only the daemon's own user, root,
// `allowed_uids` and members of the daemon's group (`allowed_gid`) may
// connect (checked with SO_PEERCRED and SO_PEERGROUPS); the socket file is
// created mode 0660. With `require_job_token`, a connection acts on one
// job: the one whose token (common/job_token.h) its Hello shows.
//
//   PTC_ASSIGN_OR_RETURN(auto local, LocalServer::Start(&store, {.socket_path =
//   p}));
#ifndef PTC_TENSOR_STORE_LOCAL_SERVER_H_
#define PTC_TENSOR_STORE_LOCAL_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/limits.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/local.pb.h"
#include "tensor_store/store.h"

namespace ptc {

struct LocalServerOptions {
  std::string socket_path;
  // Users allowed besides the daemon's own and root.
  std::vector<uid_t> allowed_uids;
  // This host's name in the cluster, told to clients that ask (Hello).
  std::string host_name;
  // Members of this group (primary or supplementary) may connect; nullopt:
  // the daemon's own group.
  std::optional<gid_t> allowed_gid;
  // Each connection must show a job token in its Hello and acts on that
  // job only.
  bool require_job_token = false;
  // A put allocated and not committed for this long is aborted and its
  // memory freed (a client that hangs must not hold it for good).
  absl::Duration put_timeout = absl::Minutes(10);
  // Clients served at once; more are refused with RESOURCE_EXHAUSTED.
  int max_clients = kMaxLocalConnections;
  // Told to clients in Hello: the socket through which the daemon relays
  // their coordinator calls, and the coordinator it relays to (empty:
  // none; ptcd/coordinator_relay.h).
  std::string coordinator_relay;
  std::string coordinator;
};

class LocalServer {
 public:
  static absl::StatusOr<std::unique_ptr<LocalServer>> Start(
      Store* store, LocalServerOptions options);
  ~LocalServer();
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  // Closes the socket and every connection, and joins their threads.
  void Stop();
  int num_clients() const { return clients_.load(); }
  const std::string& socket_path() const { return options_.socket_path; }

 private:
  struct Connection;

  LocalServer(Store* store, LocalServerOptions options, int listen_fd)
      : store_(store), options_(std::move(options)), listen_fd_(listen_fd) {}

  void AcceptLoop();
  // Joins the threads of connections that have ended.
  void ReapFinished();
  void Serve(std::shared_ptr<Connection> conn);
  // The answer to `req`, and in *fds_out the descriptors to pass with it
  // (the daemon's own: SendPacket copies them).
  proto::LocalResponse Handle(Connection* conn, const proto::LocalRequest& req,
                              std::vector<int>* fds_out);
  // The leases of one Map or MapMany (`items` of one version): each item's
  // lease, bytes, offset, checksum and descriptor into `resp`, all or
  // none.
  absl::Status MapRegions(
      Connection* conn, const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, Region>>& items,
      proto::LocalResponse* resp, std::vector<int>* fds_out);
  // With require_job_token: a Hello's token sets the connection's job;
  // every request naming a job must name that one.
  absl::Status CheckJob(Connection* conn, const proto::LocalRequest& req);
  // Aborts the connection's puts past their deadline (put_timeout).
  void AbortExpiredPuts(Connection* conn);
  absl::Status CheckOwner(uint64_t id, const Connection* conn,
                          const char* what);
  // CheckOwner, and the id is a pending put's (CheckPut) or a lease's
  // (CheckLease) of this connection.
  absl::Status CheckPut(uint64_t handle, const Connection* conn);
  absl::Status CheckLease(uint64_t lease, const Connection* conn);

  Store* store_;
  LocalServerOptions options_;
  int listen_fd_;
  // Refused connections being told why (at most kMaxRefusing at once).
  static constexpr int kMaxRefusing = 16;
  std::atomic<int> refusing_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> clients_{0};
  std::atomic<uint64_t> next_id_{1};
  std::thread accept_thread_;

  absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Connection>> connections_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
  // Handle or lease -> id of the connection that owns it.
  std::map<uint64_t, uint64_t> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_LOCAL_SERVER_H_
