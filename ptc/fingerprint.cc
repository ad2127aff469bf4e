#include "ptc/fingerprint.h"

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common/cpu.h"

namespace ptc {
namespace {

inline uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The fingerprint terms of `n` consecutive elements of `size` bytes whose
// first global index is `flat`: Mix(index key ^ value bits), where the
// index keys (multiples of the golden ratio) differ in their high bits, so
// that no value of another element can produce an element's term. One
// mix per element: verification reads a whole version on each side. A
// fixed size lets the compiler turn the load into one instruction; two
// accumulators keep both multipliers busy.
template <int kSize>
uint64_t SumRow(const char* p, int64_t flat, int64_t n) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  uint64_t sum0 = 0, sum1 = 0;
  uint64_t index = (static_cast<uint64_t>(flat) + 1) * kGolden;
  int64_t k = 0;
  for (; k + 1 < n; k += 2, p += 2 * kSize) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, p, kSize);
    std::memcpy(&b, p + kSize, kSize);
    sum0 += Mix(index ^ a);
    sum1 += Mix((index + kGolden) ^ b);
    index += 2 * kGolden;
  }
  if (k < n) {
    uint64_t a = 0;
    std::memcpy(&a, p, kSize);
    sum0 += Mix(index ^ a);
  }
  return sum0 + sum1;
}

// The same sum, four elements per step in AVX2 (verification is
// compute-bound: two 64-bit multiplies per element). AVX2 has no 64-bit
// multiply; x * c mod 2^64 is built from three 32 x 32 -> 64 products.
__attribute__((target("avx2"))) inline __m256i MulConst(__m256i x, __m256i c_lo,
                                                        __m256i c_hi) {
  const __m256i lo = _mm256_mul_epu32(x, c_lo);
  const __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), c_lo),
                       _mm256_mul_epu32(x, c_hi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

__attribute__((target("avx2"))) inline __m256i MixAvx2(__m256i x, __m256i c1_lo,
                                                       __m256i c1_hi,
                                                       __m256i c2_lo,
                                                       __m256i c2_hi) {
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
  x = MulConst(x, c1_lo, c1_hi);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
  x = MulConst(x, c2_lo, c2_hi);
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

// Four consecutive elements of kSize bytes, zero-extended to 64 bits.
template <int kSize>
__attribute__((target("avx2"))) inline __m256i Load4(const char* p) {
  if constexpr (kSize == 1) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(v));
  } else if constexpr (kSize == 2) {
    return _mm256_cvtepu16_epi64(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (kSize == 4) {
    return _mm256_cvtepu32_epi64(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
}

template <int kSize>
__attribute__((target("avx2"))) uint64_t SumRowAvx2(const char* p, int64_t flat,
                                                    int64_t n) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  constexpr uint64_t kC1 = 0xbf58476d1ce4e5b9ULL, kC2 = 0x94d049bb133111ebULL;
  const __m256i c1_lo = _mm256_set1_epi64x(kC1 & 0xffffffffULL);
  const __m256i c1_hi = _mm256_set1_epi64x(kC1 >> 32);
  const __m256i c2_lo = _mm256_set1_epi64x(kC2 & 0xffffffffULL);
  const __m256i c2_hi = _mm256_set1_epi64x(kC2 >> 32);
  // Lane j of `index` is the key of element k + j (and of k + 4 + j in
  // `index4`): (flat + k + j + 1) * golden.
  const uint64_t first = (static_cast<uint64_t>(flat) + 1) * kGolden;
  __m256i index = _mm256_set_epi64x(first + 3 * kGolden, first + 2 * kGolden,
                                    first + kGolden, first);
  const __m256i step8 = _mm256_set1_epi64x(8 * kGolden);
  __m256i index4 = _mm256_add_epi64(index, _mm256_set1_epi64x(4 * kGolden));
  __m256i sum0 = _mm256_setzero_si256(), sum1 = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8, p += 8 * kSize) {
    const __m256i a = _mm256_xor_si256(index, Load4<kSize>(p));
    const __m256i b = _mm256_xor_si256(index4, Load4<kSize>(p + 4 * kSize));
    sum0 = _mm256_add_epi64(sum0, MixAvx2(a, c1_lo, c1_hi, c2_lo, c2_hi));
    sum1 = _mm256_add_epi64(sum1, MixAvx2(b, c1_lo, c1_hi, c2_lo, c2_hi));
    index = _mm256_add_epi64(index, step8);
    index4 = _mm256_add_epi64(index4, step8);
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(sum0, sum1));
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  if (k < n) sum += SumRow<kSize>(p, flat + k, n - k);
  return sum;
}

template <int kSize>
uint64_t SumRowBest(const char* p, int64_t flat, int64_t n) {
  return CpuHasAvx2() ? SumRowAvx2<kSize>(p, flat, n)
                      : SumRow<kSize>(p, flat, n);
}

}  // namespace

uint64_t FingerprintRegion(const void* data, const Region& box,
                           const Region& what, absl::Span<const int64_t> shape,
                           int64_t element_size) {
  if (what.empty()) return 0;
  const int rank = what.rank();
  const char* base = static_cast<const char*>(data);
  if (rank == 0) {
    uint64_t bits = 0;
    std::memcpy(&bits, base, element_size);
    return Mix(0x9e3779b97f4a7c15ULL ^ bits);
  }
  // Walk the rows (last dimension) of `what`.
  std::vector<int64_t> idx(rank);
  for (int d = 0; d < rank; ++d) idx[d] = what.dim(d).begin;
  const int64_t row = what.dim(rank - 1).size();
  uint64_t sum = 0;
  while (true) {
    int64_t flat = 0, off = 0;
    for (int d = 0; d < rank; ++d) {
      flat = flat * shape[d] + idx[d];
      off = off * box.dim(d).size() + (idx[d] - box.dim(d).begin);
    }
    const char* p = base + off * element_size;
    switch (element_size) {
      case 1:
        sum += SumRowBest<1>(p, flat, row);
        break;
      case 2:
        sum += SumRowBest<2>(p, flat, row);
        break;
      case 4:
        sum += SumRowBest<4>(p, flat, row);
        break;
      default:
        sum += SumRowBest<8>(p, flat, row);
        break;
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < what.dim(d).end) break;
      idx[d] = what.dim(d).begin;
    }
    if (d < 0) return sum;
  }
}

}  // namespace ptc
