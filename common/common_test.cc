#include <xxhash.h>

#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "common/address.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"

namespace ptc {
namespace {

TEST_CASE("checksum: streaming equals one-shot over any chunking", "[common]") {
  std::vector<uint8_t> data(100000);
  std::iota(data.begin(), data.end(), 0);
  StreamingChecksum s;
  for (size_t off = 0; off < data.size();) {
    const size_t n = std::min<size_t>(7777, data.size() - off);
    s.Update(data.data() + off, n);
    off += n;
  }
  CHECK(s.Digest() == Checksum(data.data(), data.size()));
  data[500] ^= 1;
  CHECK(s.Digest() != Checksum(data.data(), data.size()));
}

TEST_CASE("checksum: equals the xxhash library's xxh3 for every size",
          "[common]") {
  // Every length through xxh3's short-input paths (0-240 bytes) and its
  // stripes and blocks (64 bytes, 1 KiB), then a few large ones, one-shot
  // and streamed in random chunks: whichever build runs (AVX2 where the
  // CPU has it), the values are xxh3's.
  std::mt19937_64 rng(3);
  std::vector<uint8_t> data((3 << 20) + 17);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 2100; ++n) sizes.push_back(n);
  for (size_t n : {size_t{65536}, size_t{1} << 20, data.size()})
    sizes.push_back(n);
  for (size_t n : sizes) {
    INFO(n << " bytes");
    const uint64_t want = XXH3_64bits(data.data() + 1, n);
    REQUIRE(Checksum(data.data() + 1, n) == want);
    StreamingChecksum s;
    for (size_t off = 0; off < n;) {
      const size_t k = std::min<size_t>(1 + rng() % 5000, n - off);
      s.Update(data.data() + 1 + off, k);
      off += k;
    }
    REQUIRE(s.Digest() == want);
  }
}

TEST_CASE("grpc status: codes and messages survive both ways", "[common]") {
  const absl::Status s =
      absl::DataLossError("checksum mismatch in region [0:4]");
  const grpc::Status g = ToGrpcStatus(s);
  CHECK(g.error_code() == grpc::StatusCode::DATA_LOSS);
  CHECK(FromGrpcStatus(g) == s);
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST_CASE("metrics: counters are shared by name", "[common]") {
  GetCounter("ptc_test_total").Add(3);
  GetCounter("ptc_test_total").Add();
  int64_t value = -1;
  for (auto& [name, v] : CounterValues()) {
    if (name == "ptc_test_total") value = v;
  }
  CHECK(value == 4);
}

TEST_CASE("logging: named loggers and a checked level", "[common]") {
  CHECK(Log("tensor_store") == Log("tensor_store"));
  CHECK(Log("tensor_store")->name() == "tensor_store");
  CHECK(SetLogLevel("warn").ok());
  CHECK(SetLogLevel("loud").code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("address: HOST:PORT with a name, IPv4 or bracketed IPv6",
          "[common]") {
  auto a = ParseHostPort("gpu-node-17:7070");
  REQUIRE(a.ok());
  CHECK(a->host == "gpu-node-17");
  CHECK(a->port == 7070);
  auto v6 = ParseHostPort("[fd00::7]:1");
  REQUIRE(v6.ok());
  CHECK(v6->host == "fd00::7");
  CHECK(ParseHostPort("127.0.0.1:0", /*allow_port_zero=*/true).ok());
  for (const char* bad :
       {":::::", "", "host", "host:", ":7070", "host:0", "host:65536",
        "host:-1", "host:7070x", "[fd00::7:7070", "[nonsense]:7070",
        "fd00::7:7070", "a b:7070", "host\n:7070", "[]:7070"}) {
    INFO(bad);
    auto parsed = ParseHostPort(bad);
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(ParseHostPort(std::string(300, 'a') + ":1").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ptc
