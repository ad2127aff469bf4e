#include "ptc/fingerprint.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

namespace ptc {
namespace {

TEST_CASE("fingerprint: pieces add up to the whole, whatever the partition",
          "[ptc][fingerprint]") {
  const Shape shape = {9, 7, 5};
  const Region full = Region::Full(shape);
  std::vector<float> values(full.volume());
  std::mt19937 rng(9);
  for (float& v : values) v = static_cast<float>(rng()) / 7.0f;
  const uint64_t whole = FingerprintRegion(values.data(), full, full, shape, 4);
  for (int split = 0; split < 3; ++split) {
    // Split along `split` at a random point; copy each piece to its own buffer.
    Region a = full, b = full;
    const int64_t cut = 1 + rng() % (shape[split] - 1);
    a.mutable_dim(split).end = cut;
    b.mutable_dim(split).begin = cut;
    uint64_t sum = 0;
    for (const Region& piece : {a, b}) {
      std::vector<float> buf(piece.volume());
      CopyRegion(values.data(), full, buf.data(), piece, piece, 4);
      sum += FingerprintRegion(buf.data(), piece, piece, shape, 4);
    }
    CHECK(sum == whole);
  }
}

TEST_CASE("fingerprint: a moved or changed value changes it",
          "[ptc][fingerprint]") {
  const Shape shape = {4, 4};
  const Region full = Region::Full(shape);
  std::vector<int32_t> v(16);
  for (int i = 0; i < 16; ++i) v[i] = i;
  const uint64_t f = FingerprintRegion(v.data(), full, full, shape, 4);
  std::swap(v[1], v[2]);  // same multiset of values, other positions
  CHECK(FingerprintRegion(v.data(), full, full, shape, 4) != f);
  std::swap(v[1], v[2]);
  v[7] += 1;
  CHECK(FingerprintRegion(v.data(), full, full, shape, 4) != f);
}

}  // namespace
}  // namespace ptc
