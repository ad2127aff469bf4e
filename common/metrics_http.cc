#include "common/metrics_http.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

constexpr int kTimeoutMs = 2000;
constexpr size_t kMaxRequest = 8192;

// Writes all of `data` or gives up after the timeout.
void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, kTimeoutMs) != 1) return;
    const ssize_t n =
        send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    done += n;
  }
}

// The request's head (up to the blank line), or empty after the timeout.
std::string ReadHead(int fd) {
  std::string head;
  char buffer[1024];
  while (head.size() < kMaxRequest && !absl::StrContains(head, "\r\n\r\n") &&
         !absl::StrContains(head, "\n\n")) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, kTimeoutMs) != 1) return "";
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return head;
    head.append(buffer, n);
  }
  return head;
}

std::string Response(const char* status, const std::string& type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address,
                                              const std::string& what) {
  PTC_ASSIGN_OR_RETURN(HostPort hp,
                       ParseHostPort(address, /*allow_port_zero=*/true));
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  const std::string port = std::to_string(hp.port);
  if (const int e = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " address '", address, "': ", gai_strerror(e)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 ||
      listen(fd, 16) != 0) {
    const std::string why = std::strerror(errno);
    freeaddrinfo(found);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("serving ", what, " on ", address, ": ", why));
  }
  freeaddrinfo(found);
  struct sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<struct sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6
                ? reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port
                : reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
  return std::make_pair(fd, bound_port);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address) {
  PTC_ASSIGN_OR_RETURN(HostPort hp,
                       ParseHostPort(address, /*allow_port_zero=*/true));
  PTC_ASSIGN_OR_RETURN(const auto listening, ListenTcp(address, "metrics"));
  const auto [fd, bound_port] = listening;
  std::unique_ptr<MetricsServer> s(new MetricsServer(fd, bound_port));
  s->thread_ = std::thread([m = s.get()] { m->Loop(); });
  Log("metrics")->info("metrics on http://{}:{}/metrics", hp.host, bound_port);
  return s;
}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void ServeConnections(int fd, const std::atomic<bool>& stopping,
                      const std::function<void(int conn)>& serve) {
  while (!stopping) {
    const int conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (stopping) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    serve(conn);
    close(conn);
  }
}

void MetricsServer::Loop() {
  ServeConnections(fd_, stopping_, [](int conn) {
    const std::string head = ReadHead(conn);
    if (absl::StartsWith(head, "GET /metrics ") ||
        absl::StartsWith(head, "GET /metrics?")) {
      WriteAll(conn, Response("200 OK", "text/plain; version=0.0.4",
                              PrometheusText()));
    } else if (!head.empty()) {
      WriteAll(conn, Response("404 Not Found", "text/plain",
                              "ptc serves GET /metrics only\n"));
    }
  });
}

}  // namespace ptc
