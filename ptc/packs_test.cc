#include "ptc/packs.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

std::vector<PackCandidate> Regions(const std::vector<int64_t>& bytes) {
  std::vector<PackCandidate> out;
  for (int64_t b : bytes) out.push_back({b, PackRequestBytes("layers.0.w", 2)});
  return out;
}

TEST_CASE("packs: a save's small regions go together, large ones alone",
          "[packs]") {
  // 3 small, one of 8 MiB (alone), 2 small: written in order, the first
  // pack takes the five small ones around the large one.
  const auto regions = Regions({100, 5000, 4096, 8 << 20, 1, 4097});
  std::vector<bool> taken(regions.size());
  const std::vector<size_t> first = NextPack(regions, 0, taken);
  CHECK(first == std::vector<size_t>{0, 1, 2, 4, 5});
  CHECK(PackBytes(regions, first) == 4096 + 8192 + 4096 + 4096 + 8192);
  CHECK(SaveBufferSizes(regions) ==
        std::vector<int64_t>{4096 + 8192 + 4096 + 4096 + 8192, 8 << 20});
  // Written from the middle, the pack starts there and wraps around.
  CHECK(NextPack(regions, 4, taken) == std::vector<size_t>{4, 5, 0, 1, 2});
  // A large region or one already taken starts no pack; nor does a pack
  // of one.
  CHECK(NextPack(regions, 3, taken).empty());
  taken = {true, true, true, false, false, true};
  CHECK(NextPack(regions, 4, taken).empty());
  CHECK(NextPack(regions, 9, taken).empty());
  CHECK(SaveBufferSizes(Regions({10})) == std::vector<int64_t>{10});
}

TEST_CASE("packs: a pack stops at its bounds of regions, bytes and request",
          "[packs]") {
  const auto many = Regions(std::vector<int64_t>(300, 1000));
  const std::vector<int64_t> sizes = SaveBufferSizes(many);
  REQUIRE(sizes.size() == 3);  // 128 + 128 + 44
  CHECK(sizes[0] == 128 * 4096);
  CHECK(sizes[2] == 44 * 4096);
  // 7 MiB regions: 9 fit 64 MiB.
  const auto big = Regions(std::vector<int64_t>(10, 7 << 20));
  CHECK(SaveBufferSizes(big) ==
        std::vector<int64_t>{int64_t{63} << 20, int64_t{7} << 20});
  // Long names: the request stays within its bound.
  std::vector<PackCandidate> named(
      100, {64, PackRequestBytes(std::string(1000, 'k'), 2)});
  std::vector<bool> taken(named.size());
  const size_t fit = NextPack(named, 0, taken).size();
  CHECK(fit == kMaxPackRequestBytes / named[0].request_bytes);
}

}  // namespace
}  // namespace ptc
