#include "ptc/fingerprint.h"

#include <cstring>
#include <vector>

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
        sum += SumRow<1>(p, flat, row);
        break;
      case 2:
        sum += SumRow<2>(p, flat, row);
        break;
      case 4:
        sum += SumRow<4>(p, flat, row);
        break;
      default:
        sum += SumRow<8>(p, flat, row);
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
