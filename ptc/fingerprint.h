// The partition-invariant fingerprint of a tensor's values: the sum, mod
// 2^64, over elements of a 64-bit hash of (global flat index, value bytes).
// Because a sum does not care about order or grouping, the fingerprints of
// disjoint pieces add up to the fingerprint of their union: a coordinator
// can prove that a re-partitioned tensor holds exactly the old values.
//
//   uint64_t f = FingerprintRegion(buf, box, box, shape, ElementSize(dtype));
//   // f(A) + f(B) == f(A u B) for disjoint A, B
#ifndef PTC_PTC_FINGERPRINT_H_
#define PTC_PTC_FINGERPRINT_H_

#include <cstdint>

#include "absl/types/span.h"
#include "ptc/region.h"

namespace ptc {

// Fingerprint of the elements of `what` (inside `box`) read from `data`, a
// dense row-major buffer holding `box` of a tensor of `shape`. Elements are
// at most 8 bytes.
uint64_t FingerprintRegion(const void* data, const Region& box,
                           const Region& what, absl::Span<const int64_t> shape,
                           int64_t element_size);

// The fingerprint of `what` in a hollow store (one that keeps regions'
// metadata but no bytes: the scale harness's hosts), whose every element
// reads as a function of its global flat index alone: the sum over the
// elements of a hash that is linear in the index, computed in closed form
// from the region's bounds (no bytes, O(rank)). Like FingerprintRegion it
// adds up over disjoint pieces, so a hollow cluster's changes are proven
// the way a real one's are: a re-partitioned tensor must hold every
// element exactly once.
uint64_t HollowFingerprint(const Region& what, absl::Span<const int64_t> shape,
                           int64_t element_size);

// The same sum computed by one kernel: every kernel gives the same value;
// FingerprintRegion uses the fastest this CPU runs. For tests and
// benchmarks; a kernel must be one that FingerprintKernelRuns.
enum class FingerprintKernel { kScalar, kAvx2, kAvx512 };
FingerprintKernel BestFingerprintKernel();
bool FingerprintKernelRuns(FingerprintKernel kernel);
uint64_t FingerprintRegionWith(FingerprintKernel kernel, const void* data,
                               const Region& box, const Region& what,
                               absl::Span<const int64_t> shape,
                               int64_t element_size);

}  // namespace ptc

#endif  // PTC_PTC_FINGERPRINT_H_
