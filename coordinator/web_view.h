// The coordinator's read-only web view: a page (HTML, CSS and JavaScript
// shipped in the binary; nothing fetched from elsewhere) that shows the
// cluster's hosts, its jobs, where each job's ranks run, and a change in
// flight, refreshed every second from /api/hosts and /api/jobs, which
// answer exactly what `ptcctl hosts --json` and `ptcctl jobs --json`
// print (coordinator/status_json.h). The view asks the coordinator over
// gRPC like any client, with the coordinator's own certificate.
//
// HTTPS with the coordinator's certificate and key (HTTP only for a
// coordinator run --insecure). Its one credential is a viewer token read
// from a file, never the admin key: a browser opens /?token=TOKEN once,
// which sets an HttpOnly, Secure, SameSite=Strict cookie and leads to the
// page; scripts may send "Authorization: Bearer TOKEN". Everything else is
// 401 without it. One thread answers one request at a time; a client that
// stops sending is dropped after 2 s. Off unless ptc-coordinator gets
// --web-listen and --web-token-file.
//
//   WebView::Options o;
//   o.listen = "0.0.0.0:7443"; o.token = ReadToken(file);
//   o.tls_cert = cert; o.tls_key = key; o.coordinator = "127.0.0.1:7000";
//   PTC_ASSIGN_OR_RETURN(auto view, WebView::Start(o));
#ifndef PTC_COORDINATOR_WEB_VIEW_H_
#define PTC_COORDINATOR_WEB_VIEW_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/coordinator.grpc.pb.h"

namespace ptc {

class WebView {
 public:
  struct Options {
    std::string listen;  // HOST:PORT; port 0 picks one
    // PEM files; both empty: plain HTTP (a coordinator without TLS).
    std::string tls_cert, tls_key;
    std::string token;        // the viewer's credential, 16 bytes or more
    std::string coordinator;  // the gRPC address the view asks
  };
  static absl::StatusOr<std::unique_ptr<WebView>> Start(Options options);
  ~WebView();

  int port() const { return port_; }

  // The token in `path`'s first line (whitespace trimmed): at least 16
  // characters of [A-Za-z0-9._~-].
  static absl::StatusOr<std::string> ReadToken(const std::string& path);

 private:
  struct Tls;
  WebView(Options options, int fd, int port);
  void Loop();
  void Serve(int conn);
  // The JSON of /api/hosts, /api/jobs and /api/layout, from the
  // coordinator; NOT_FOUND for another path or an unknown job.
  absl::StatusOr<std::string> Api(
      const std::string& path, const std::map<std::string, std::string>& query);

  const Options options_;
  const int fd_;
  const int port_;
  std::unique_ptr<Tls> tls_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_WEB_VIEW_H_
