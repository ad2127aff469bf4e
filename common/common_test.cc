#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

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

}  // namespace
}  // namespace ptc
