// Many clients at once, and a region larger than 4 GiB.
#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

using testing::CheckPattern;
using testing::FillPattern;
using testing::StartDaemon;

TEST_CASE(
    "tensor store: 32 clients put and read 1 GiB at once, every byte verified",
    "[tensor_store][concurrency]") {
  constexpr int kClients = 32;
  constexpr int64_t kRow = int64_t{32}
                           << 20;  // 32 MiB per client: 1 GiB in all
  constexpr int64_t kShared = int64_t{16} << 20;  // one region everybody reads
  auto d = StartDaemon(int64_t{3} << 30);
  REQUIRE(d->client
              ->Declare("job", {{"own", DType::kUInt8, {kClients, kRow}},
                                {"shared", DType::kUInt8, {kShared}}})
              .ok());
  REQUIRE(d->client
              ->PutWith("job", 1, "shared", Region{{0, kShared}}, kShared,
                        [](int64_t off, char* dst, int64_t n) {
                          FillPattern(999, off, dst, n);
                        })
              .ok());
  std::atomic<int> failures{0};
  std::atomic<int64_t> verified{0};
  std::atomic<int> stored{0};
  auto fail = [&](const std::string& what) {
    failures.fetch_add(1);
    UNSCOPED_INFO(what);
  };
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      auto client = StoreClient::Connect(d->address());
      // Read a shared slice while others write.
      const int64_t lo = (t * kShared) / kClients / 2;
      const Region slice{{lo, lo + kShared / 2}};
      bool ok = true;
      auto n = client->ReadWith("job", 1, "shared", slice,
                                [&](int64_t off, const char* src, int64_t k) {
                                  ok &= CheckPattern(999, lo + off, src, k);
                                });
      if (!n.ok() || !ok) return fail("shared read");
      verified += *n;
      // Put my row.
      const Region mine{{t, t + 1}, {0, kRow}};
      auto put = client->PutWith("job", 1, "own", mine, kRow,
                                 [t](int64_t off, char* dst, int64_t k) {
                                   FillPattern(t, off, dst, k);
                                 });
      if (!put.ok()) return fail(put.status().ToString());
      stored.fetch_add(1);
      // Read back mine, then a neighbour's once it is there.
      for (int who : {t, (t + 1) % kClients}) {
        const Region r{{who, who + 1}, {0, kRow}};
        absl::StatusOr<int64_t> got;
        for (int attempt = 0; attempt < 600; ++attempt) {
          got = client->ReadWith("job", 1, "own", r,
                                 [&](int64_t off, const char* src, int64_t k) {
                                   ok &= CheckPattern(who, off, src, k);
                                 });
          if (got.ok() || got.status().code() != absl::StatusCode::kNotFound)
            break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (!got.ok() || !ok || *got != kRow)
          return fail(absl::StrCat("read row ", who));
        verified += *got;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  CHECK(failures == 0);
  CHECK(stored == kClients);
  CHECK(verified >= 2 * kClients * kRow);
  WARN("moved " << (kClients * kRow + verified) / double(1 << 30) << " GiB in "
                << seconds << " s");
  CHECK(testing::DataBytesUsed(*d->client->Stats()) == kClients * kRow + kShared);
}

TEST_CASE("tensor store: a region larger than 4 GiB round-trips",
          "[tensor_store][large]") {
  constexpr int64_t kCols = int64_t{256} << 20;
  constexpr int64_t kRows = 17;  // 4.25 GiB
  constexpr int64_t kBytes = kRows * kCols;
  auto d = StartDaemon(int64_t{6} << 30);
  REQUIRE(
      d->client->Declare("job", {{"big", DType::kUInt8, {kRows, kCols}}}).ok());
  const Region all{{0, kRows}, {0, kCols}};
  auto put = d->client->PutWith(
      "job", 1, "big", all, kBytes,
      [](int64_t off, char* dst, int64_t n) { FillPattern(4242, off, dst, n); },
      int64_t{4} << 20);
  REQUIRE(put.ok());
  auto stat = d->client->Stat("job", 1, "big");
  REQUIRE(stat.ok());
  CHECK(stat->tensor().regions(0).bytes() == kBytes);
  CHECK(stat->tensor().regions(0).checksum() == *put);
  bool ok = true;
  auto got = d->client->ReadWith(
      "job", 1, "big", all,
      [&](int64_t off, const char* src, int64_t n) {
        ok &= CheckPattern(4242, off, src, n);
      },
      4 << 20);
  REQUIRE(got.ok());  // also verifies the end-to-end checksum
  CHECK(*got == kBytes);
  CHECK(ok);
  // A slice across the 4 GiB boundary: the last two rows' first MiB.
  const Region tail{{15, 17}, {0, 1 << 20}};
  got = d->client->ReadWith(
      "job", 1, "big", tail, [&](int64_t off, const char* src, int64_t n) {
        const int64_t row = 15 + off / (1 << 20), col = off % (1 << 20);
        ok &= CheckPattern(4242, row * kCols + col, src, n);
      });
  REQUIRE(got.ok());
  CHECK(ok);
}

}  // namespace
}  // namespace ptc
