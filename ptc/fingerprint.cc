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
// multiply; x * c mod 2^64 = lo(x) lo(c) + ((lo(x) hi(c) + hi(x) lo(c))
// mod 2^32) << 32 takes one 32 x 32 -> 64 product for the first term and
// one 32-bit multiply of x by c with its halves swapped (`c_swap`) for
// both cross terms, whose low halves are all that count: two multiplies
// where three products took three.
__attribute__((target("avx2"))) inline __m256i MulConst(__m256i x, __m256i c_lo,
                                                        __m256i c_swap) {
  const __m256i lo = _mm256_mul_epu32(x, c_lo);
  // Per 64-bit lane: [lo(x) hi(c), hi(x) lo(c)] mod 2^32 (low, high).
  __m256i cross = _mm256_mullo_epi32(x, c_swap);
  // Their sum in the high half; the low half cleared.
  cross = _mm256_add_epi32(cross, _mm256_slli_epi64(cross, 32));
  cross = _mm256_and_si256(
      cross, _mm256_set1_epi64x(static_cast<int64_t>(0xffffffff00000000ULL)));
  return _mm256_add_epi64(lo, cross);
}

__attribute__((target("avx2"))) inline __m256i MixAvx2(__m256i x, __m256i c1_lo,
                                                       __m256i c1_swap,
                                                       __m256i c2_lo,
                                                       __m256i c2_swap) {
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
  x = MulConst(x, c1_lo, c1_swap);
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
  x = MulConst(x, c2_lo, c2_swap);
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
  const __m256i c1_swap = _mm256_set1_epi64x((kC1 >> 32) | (kC1 << 32));
  const __m256i c2_lo = _mm256_set1_epi64x(kC2 & 0xffffffffULL);
  const __m256i c2_swap = _mm256_set1_epi64x((kC2 >> 32) | (kC2 << 32));
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
    sum0 = _mm256_add_epi64(sum0, MixAvx2(a, c1_lo, c1_swap, c2_lo, c2_swap));
    sum1 = _mm256_add_epi64(sum1, MixAvx2(b, c1_lo, c1_swap, c2_lo, c2_swap));
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

// The same sum, eight elements per step in AVX-512, whose 64-bit lane
// multiply is one instruction (measured on a 2-core Xeon VM: 1.4-2x the
// AVX2 rate on fp32).
template <int kSize>
__attribute__((target("avx512f,avx512dq"))) inline __m512i Load8(
    const char* p) {
  if constexpr (kSize == 1) {
    return _mm512_cvtepu8_epi64(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (kSize == 2) {
    return _mm512_cvtepu16_epi64(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (kSize == 4) {
    return _mm512_cvtepu32_epi64(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    return _mm512_loadu_si512(p);
  }
}

__attribute__((target("avx512f,avx512dq"))) inline __m512i MixAvx512(
    __m512i x, __m512i c1, __m512i c2) {
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
  x = _mm512_mullo_epi64(x, c1);
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
  x = _mm512_mullo_epi64(x, c2);
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

template <int kSize>
__attribute__((target("avx512f,avx512dq"))) uint64_t SumRowAvx512(const char* p,
                                                                  int64_t flat,
                                                                  int64_t n) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  const __m512i c1 = _mm512_set1_epi64(0xbf58476d1ce4e5b9ULL);
  const __m512i c2 = _mm512_set1_epi64(0x94d049bb133111ebULL);
  // Lane j of `index` is the key of element k + j (and of k + 8 + j in
  // `index8`): (flat + k + j + 1) * golden.
  const uint64_t first = (static_cast<uint64_t>(flat) + 1) * kGolden;
  __m512i index = _mm512_add_epi64(
      _mm512_set1_epi64(first),
      _mm512_mullo_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi64(kGolden)));
  const __m512i step16 = _mm512_set1_epi64(16 * kGolden);
  __m512i index8 = _mm512_add_epi64(index, _mm512_set1_epi64(8 * kGolden));
  __m512i sum0 = _mm512_setzero_si512(), sum1 = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16, p += 16 * kSize) {
    const __m512i a = _mm512_xor_si512(index, Load8<kSize>(p));
    const __m512i b = _mm512_xor_si512(index8, Load8<kSize>(p + 8 * kSize));
    sum0 = _mm512_add_epi64(sum0, MixAvx512(a, c1, c2));
    sum1 = _mm512_add_epi64(sum1, MixAvx512(b, c1, c2));
    index = _mm512_add_epi64(index, step16);
    index8 = _mm512_add_epi64(index8, step16);
  }
  uint64_t sum = static_cast<uint64_t>(
      _mm512_reduce_add_epi64(_mm512_add_epi64(sum0, sum1)));
  if (k < n) sum += SumRowAvx2<kSize>(p, flat + k, n - k);
  return sum;
}

template <int kSize>
uint64_t SumRowWith(FingerprintKernel kernel, const char* p, int64_t flat,
                    int64_t n) {
  switch (kernel) {
    case FingerprintKernel::kAvx512:
      return SumRowAvx512<kSize>(p, flat, n);
    case FingerprintKernel::kAvx2:
      return SumRowAvx2<kSize>(p, flat, n);
    case FingerprintKernel::kScalar:
      break;
  }
  return SumRow<kSize>(p, flat, n);
}

}  // namespace

FingerprintKernel BestFingerprintKernel() {
  if (CpuHasAvx512Dq()) return FingerprintKernel::kAvx512;
  if (CpuHasAvx2()) return FingerprintKernel::kAvx2;
  return FingerprintKernel::kScalar;
}

bool FingerprintKernelRuns(FingerprintKernel kernel) {
  switch (kernel) {
    case FingerprintKernel::kAvx512:
      return CpuHasAvx512Dq();
    case FingerprintKernel::kAvx2:
      return CpuHasAvx2();
    case FingerprintKernel::kScalar:
      break;
  }
  return true;
}

uint64_t FingerprintRegion(const void* data, const Region& box,
                           const Region& what, absl::Span<const int64_t> shape,
                           int64_t element_size) {
  static const FingerprintKernel best = BestFingerprintKernel();
  return FingerprintRegionWith(best, data, box, what, shape, element_size);
}

uint64_t FingerprintRegionWith(FingerprintKernel kernel, const void* data,
                               const Region& box, const Region& what,
                               absl::Span<const int64_t> shape,
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
        sum += SumRowWith<1>(kernel, p, flat, row);
        break;
      case 2:
        sum += SumRowWith<2>(kernel, p, flat, row);
        break;
      case 4:
        sum += SumRowWith<4>(kernel, p, flat, row);
        break;
      default:
        sum += SumRowWith<8>(kernel, p, flat, row);
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

uint64_t HollowFingerprint(const Region& what, absl::Span<const int64_t> shape,
                           int64_t element_size) {
  // sum over elements of kMul * (index + 1) + kAdd * element_size, mod
  // 2^64. The indexes of a box sum, dimension by dimension, to the sum of
  // the coordinates along it times the stride, times the box's extent in
  // the other dimensions.
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  constexpr uint64_t kAdd = 0xC2B2AE3D27D4EB4Full;
  const int rank = what.rank();
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d)
    count *= static_cast<uint64_t>(what.dim(d).size());
  if (count == 0) return 0;
  uint64_t index_sum = 0;
  uint64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const uint64_t len = static_cast<uint64_t>(what.dim(d).size());
    const uint64_t lo = static_cast<uint64_t>(what.dim(d).begin);
    // lo + (lo+1) + ... + (lo+len-1) = len * (2 lo + len - 1) / 2, one
    // factor of which is even.
    const uint64_t twice = 2 * lo + len - 1;
    const uint64_t coords =
        len % 2 == 0 ? (len / 2) * twice : len * (twice / 2);
    uint64_t others = 1;
    for (int e = 0; e < rank; ++e)
      if (e != d) others *= static_cast<uint64_t>(what.dim(e).size());
    index_sum += coords * others * stride;
    stride *= static_cast<uint64_t>(shape[d]);
  }
  return kMul * (index_sum + count) +
         kAdd * static_cast<uint64_t>(element_size) * count;
}

}  // namespace ptc
