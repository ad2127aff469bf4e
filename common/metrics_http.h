// Serves PrometheusText() over HTTP for a monitoring system to scrape:
// GET /metrics on `address` (HOST:PORT; port 0 picks one). One thread
// answers one request at a time, each within 2 s; anything but GET
// /metrics gets 404. ptcd and the coordinator start one with
// --metrics-listen.
//
//   PTC_ASSIGN_OR_RETURN(auto metrics, MetricsServer::Start("0.0.0.0:9470"));
#ifndef PTC_COMMON_METRICS_HTTP_H_
#define PTC_COMMON_METRICS_HTTP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"

namespace ptc {

// A listening TCP socket on `address` (HOST:PORT; port 0 picks one): its
// descriptor and bound port. `what` names the service in errors.
absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address,
                                              const std::string& what);

// Accepts connections on the listening socket `fd` until `stopping` (and
// the socket's shutdown wakes accept), one at a time: serve(conn), then
// closes it. Out of descriptors, it waits 100 ms before the next accept.
void ServeConnections(int fd, const std::atomic<bool>& stopping,
                      const std::function<void(int conn)>& serve);

class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address);
  ~MetricsServer();

  int port() const { return port_; }

 private:
  MetricsServer(int fd, int port) : fd_(fd), port_(port) {}
  void Loop();

  const int fd_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace ptc

#endif  // PTC_COMMON_METRICS_HTTP_H_
