// AutoTransport's fallback: a piece whose UCX transfer breaks part-way is
// fetched again over gRPC (the same staged bytes rewritten, nothing lost),
// and that peer uses gRPC from then on; a stale epoch is final.
#include "state_transformer/ucx_transport.h"

#include <catch2/catch.hpp>
#include <vector>

#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

// Stands in for a UCX connection that breaks: it delivers the first half of
// a piece (read from the real peer over gRPC) and then fails with `error`.
class BreaksHalfway : public PieceTransport {
 public:
  BreaksHalfway(PieceTransport* real, absl::Status error)
      : real_(real), error_(std::move(error)) {}
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override {
    ++calls;
    const int64_t half = region.volume() * element_size / 2;
    absl::Status s =
        real_->Fetch(host, job, version, tensor, region, element_size,
                     [&](int64_t off, const char* data, int64_t n) {
                       if (off < half)
                         consume(off, data, std::min(n, half - off));
                     });
    return s.ok() ? error_ : s;
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t, const std::string&,
                                               int64_t, const std::string&,
                                               int32_t) override {
    return absl::InternalError("small objects go over gRPC");
  }
  int calls = 0;

 private:
  PieceTransport* real_;
  absl::Status error_;
};

constexpr int64_t kRows = 256, kCols = 1024;  // 1 MiB of fp32

std::unique_ptr<testing::Daemon> DaemonWithRegion() {
  auto d = testing::StartDaemon();
  REQUIRE(
      d->client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  std::vector<char> bytes(kRows * kCols * 4);
  testing::FillPattern(11, 0, bytes.data(), bytes.size());
  REQUIRE(d->client
              ->Put("job", 1, "w", Region{{0, kRows}, {0, kCols}}, bytes.data(),
                    bytes.size())
              .ok());
  REQUIRE(d->client->Commit("job", 1).ok());
  return d;
}

TEST_CASE(
    "auto transport: a UCX transfer that breaks part-way is redone over "
    "gRPC, and the peer stays on gRPC",
    "[transformer]") {
  auto d = DaemonWithRegion();
  const std::map<int32_t, std::string> peers = {{1, d->address()}};
  GrpcPieceTransport probe(peers);
  auto broken = std::make_unique<BreaksHalfway>(
      &probe, absl::UnavailableError("UCX endpoint closed by peer"));
  BreaksHalfway* ucx = broken.get();
  AutoTransport transport(std::move(broken),
                          std::make_unique<GrpcPieceTransport>(peers));
  const Region r{{16, 80}, {256, 768}};  // a column slice: packed at source
  std::vector<char> got(r.volume() * 4, 0);
  std::vector<char> want(got.size());
  {
    std::vector<char> all(kRows * kCols * 4);
    testing::FillPattern(11, 0, all.data(), all.size());
    CopyRegion(all.data(), Region{{0, kRows}, {0, kCols}}, want.data(), r, r,
               4);
  }
  auto write = [&](int64_t off, const char* data, int64_t n) {
    std::memcpy(got.data() + off, data, n);
  };
  REQUIRE(transport.Fetch(1, "job", 1, "w", r, 4, write).ok());
  CHECK(got == want);
  CHECK(ucx->calls == 1);
  // The next piece from that peer goes straight to gRPC.
  std::fill(got.begin(), got.end(), 0);
  REQUIRE(transport.Fetch(1, "job", 1, "w", r, 4, write).ok());
  CHECK(got == want);
  CHECK(ucx->calls == 1);
}

TEST_CASE("auto transport: a stale plan epoch is final, not retried",
          "[transformer]") {
  auto d = DaemonWithRegion();
  const std::map<int32_t, std::string> peers = {{1, d->address()}};
  GrpcPieceTransport probe(peers);
  AutoTransport transport(
      std::make_unique<BreaksHalfway>(
          &probe, absl::AbortedError("plan epoch 3 is stale; newest is 4")),
      std::make_unique<GrpcPieceTransport>(peers));
  const Region r{{0, 4}, {0, kCols}};
  const absl::Status s = transport.Fetch(1, "job", 1, "w", r, 4,
                                         [](int64_t, const char*, int64_t) {});
  CHECK(s.code() == absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace ptc
