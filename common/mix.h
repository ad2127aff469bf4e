// SplitMix64's finalizer: a fast, well-mixed 64-bit hash of a 64-bit value.
// Used for deterministic permutations and synthetic test values.
#ifndef PTC_COMMON_MIX_H_
#define PTC_COMMON_MIX_H_

#include <cstdint>

namespace ptc {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace ptc

#endif  // PTC_COMMON_MIX_H_
