#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "common/metrics_http.h"

namespace ptc {
namespace {

std::string Get(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<struct sockaddr*>(&addr),
                  sizeof(addr)) == 0);
  REQUIRE(send(fd, request.data(), request.size(), 0) ==
          static_cast<ssize_t>(request.size()));
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;)
    out.append(buffer, n);
  close(fd);
  return out;
}

TEST_CASE("metrics: Prometheus text over HTTP, one TYPE line per family",
          "[common][metrics]") {
  GetCounter("ptc_test_requests_total").Add(3);
  GetCounter(R"(ptc_test_requests_total{code="NOT_FOUND"})").Add(2);
  GetCounter("ptc_test_requests_total_other").Add(1);
  double level = 1.5;
  auto server = MetricsServer::Start("127.0.0.1:0");
  REQUIRE(server.ok());
  {
    Gauge gauge("ptc_test_level", [&] { return level; });
    Gauge twin("ptc_test_level", [] { return 2.0; });
    const std::string page =
        Get((*server)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(absl::StartsWith(page, "HTTP/1.1 200 OK\r\n"));
    CHECK(absl::StrContains(page, "text/plain; version=0.0.4"));
    CHECK(absl::StrContains(page,
                            "# TYPE ptc_test_requests_total counter\n"
                            "ptc_test_requests_total 3\n"
                            "ptc_test_requests_total{code=\"NOT_FOUND\"} 2\n"));
    CHECK(absl::StrContains(page,
                            "# TYPE ptc_test_requests_total_other counter\n"
                            "ptc_test_requests_total_other 1\n"));
    // Two gauges of one name (two daemons in a process) are summed.
    CHECK(absl::StrContains(page,
                            "# TYPE ptc_test_level gauge\n"
                            "ptc_test_level 3.5\n"));
  }
  // Gone with its owner.
  CHECK(!absl::StrContains(PrometheusText(), "ptc_test_level"));
  CHECK(absl::StartsWith(Get((*server)->port(), "GET / HTTP/1.0\r\n\r\n"),
                         "HTTP/1.1 404 Not Found"));
  CHECK(
      absl::StartsWith(Get((*server)->port(), "POST /metrics HTTP/1.0\r\n\r\n"),
                       "HTTP/1.1 404"));
  CHECK(!MetricsServer::Start("not an address").ok());
}

}  // namespace
}  // namespace ptc
