#include "ptc/data_cursor.h"

#include <catch2/catch.hpp>
#include <random>
#include <set>

namespace ptc {
namespace {

TEST_CASE("data cursor: each epoch is a permutation of the dataset",
          "[ptc][cursor]") {
  for (int64_t n : {1, 2, 7, 64, 1000}) {
    DataCursor c{11, n, 0, 1};
    std::set<int64_t> seen;
    for (int64_t p = 0; p < n; ++p) seen.insert(SampleAt(c, p));
    CHECK(static_cast<int64_t>(seen.size()) == n);
    CHECK(*seen.begin() == 0);
    CHECK(*seen.rbegin() == n - 1);
  }
}

TEST_CASE(
    "data cursor: changes of dp and batch size consume every sample "
    "exactly once",
    "[ptc][cursor]") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t n = 50 + rng() % 200;
    DataCursor c{rng(), n, 0, 1 + static_cast<int64_t>(rng() % 17)};
    std::vector<int> count(n, 0);
    while (c.consumed + c.global_batch <= n) {
      const int dp = 1 + rng() % 8;
      for (int r = 0; r < dp; ++r) {
        for (int64_t s : NextSamples(c, r, dp)) ++count[s];
      }
      Advance(&c);
      if (rng() % 3 == 0) c.global_batch = 1 + rng() % 17;
      // Saved with the state and restored by the next config.
      auto restored = DecodeCursor(EncodeCursor(c));
      REQUIRE(restored.ok());
      c = *restored;
    }
    for (int64_t s = 0; s < c.consumed; ++s) {
      // The first `consumed` positions of epoch 0 hold distinct samples.
      CHECK(count[SampleAt(c, s)] == 1);
    }
  }
}

TEST_CASE("data cursor: bytes that are not a cursor are refused",
          "[ptc][cursor]") {
  DataCursor c{7, 100, 40, 8};
  std::string bytes = EncodeCursor(c);
  CHECK(bytes.size() == 40);
  auto back = DecodeCursor(bytes);
  REQUIRE(back.ok());
  CHECK(back->seed == 7);
  CHECK(back->consumed == 40);
  CHECK(DecodeCursor("short").status().code() ==
        absl::StatusCode::kInvalidArgument);
  bytes[0] = 'X';
  CHECK(!DecodeCursor(bytes).ok());
  CHECK(!DecodeCursor(EncodeCursor({7, 0, 0, 8})).ok());
}

}  // namespace
}  // namespace ptc
