#include "ptc/fingerprint.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

namespace ptc {
namespace {

// The definition, element by element: the sum of Mix(key(flat) ^ bits).
uint64_t Reference(const std::vector<uint8_t>& bytes, int64_t first_flat,
                   int element_size) {
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  uint64_t sum = 0;
  for (size_t i = 0; i * element_size < bytes.size(); ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, &bytes[i * element_size], element_size);
    const uint64_t key = (first_flat + i + 1) * 0x9e3779b97f4a7c15ULL;
    sum += mix(key ^ bits);
  }
  return sum;
}

TEST_CASE(
    "fingerprint: every kernel, element size and row length gives the "
    "defined sum",
    "[ptc][fingerprint]") {
  // Rows of every length around the vectorized steps (8 elements in AVX2,
  // 16 in AVX-512, each handing its tail to the next), at every
  // alignment, for each element size and each kernel this CPU runs.
  const FingerprintKernel kernel =
      GENERATE(FingerprintKernel::kScalar, FingerprintKernel::kAvx2,
               FingerprintKernel::kAvx512);
  if (!FingerprintKernelRuns(kernel)) {
    WARN("kernel " << static_cast<int>(kernel)
                   << " does not run on this CPU: not checked here");
    return;
  }
  std::mt19937_64 rng(5);
  for (int size : {1, 2, 4, 8}) {
    for (int64_t n = 0; n <= 37; ++n) {
      for (int64_t offset = 0; offset < 3; ++offset) {
        const Shape shape = {n + offset};
        std::vector<uint8_t> bytes((n + offset) * size + 1);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        const Region box = Region::Full(shape);
        Region what = box;
        what.mutable_dim(0).begin = offset;
        std::vector<uint8_t> row(bytes.begin() + offset * size,
                                 bytes.begin() + (offset + n) * size);
        INFO("kernel " << static_cast<int>(kernel) << ", element size " << size
                       << ", " << n << " elements from " << offset);
        CHECK(FingerprintRegionWith(kernel, bytes.data(), box, what, shape,
                                    size) == Reference(row, offset, size));
      }
    }
  }
}

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

TEST_CASE(
    "fingerprint: the fastest kernel agrees with the scalar one on a "
    "large tensor",
    "[ptc][fingerprint]") {
  // 2-D, a sub-box whose rows start at odd offsets: long rows through the
  // vector loops, flat indices far from 0.
  const Shape shape = {37, 1031};
  const Region full = Region::Full(shape);
  std::vector<uint16_t> values(full.volume());
  std::mt19937 rng(11);
  for (uint16_t& v : values) v = static_cast<uint16_t>(rng());
  Region what = full;
  what.mutable_dim(0) = {3, 35};
  what.mutable_dim(1) = {5, 1030};
  INFO("fastest kernel here: " << static_cast<int>(BestFingerprintKernel()));
  CHECK(FingerprintRegion(values.data(), full, what, shape, 2) ==
        FingerprintRegionWith(FingerprintKernel::kScalar, values.data(), full,
                              what, shape, 2));
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

TEST_CASE("hollow fingerprint: the closed form is the element-by-element sum",
          "[ptc][fingerprint]") {
  const Shape shape = {9, 7, 5};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    Region box = Region::Full(shape);
    for (int d = 0; d < 3; ++d) {
      const int64_t a = rng() % shape[d], b = rng() % shape[d];
      box.mutable_dim(d) = {std::min(a, b), std::max(a, b) + 1};
    }
    uint64_t sum = 0;
    for (int64_t i = box.dim(0).begin; i < box.dim(0).end; ++i)
      for (int64_t j = box.dim(1).begin; j < box.dim(1).end; ++j)
        for (int64_t k = box.dim(2).begin; k < box.dim(2).end; ++k) {
          const int64_t flat = (i * shape[1] + j) * shape[2] + k;
          sum += 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(flat + 1) +
                 0xC2B2AE3D27D4EB4Full * 4;
        }
    CHECK(HollowFingerprint(box, shape, 4) == sum);
  }
  // Pieces add up; a piece missing or held twice does not.
  const Region full = Region::Full(shape);
  Region a = full, b = full;
  a.mutable_dim(1).end = 3;
  b.mutable_dim(1).begin = 3;
  CHECK(HollowFingerprint(a, shape, 2) + HollowFingerprint(b, shape, 2) ==
        HollowFingerprint(full, shape, 2));
  CHECK(HollowFingerprint(a, shape, 2) * 2 !=
        HollowFingerprint(full, shape, 2));
  CHECK(HollowFingerprint(Region::Full({0, 4}), {0, 4}, 4) == 0);
}

}  // namespace
}  // namespace ptc
