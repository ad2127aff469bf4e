// xxh3-64 built for AVX2 (the same values as the xxhash library, 2-2.5x
// faster from cache on CPUs that have AVX2). Internal to checksum.cc, which
// calls these only where the CPU supports AVX2.
#ifndef PTC_COMMON_CHECKSUM_AVX2_H_
#define PTC_COMMON_CHECKSUM_AVX2_H_

#include <cstddef>
#include <cstdint>

namespace ptc::internal {

uint64_t Xxh3Avx2(const void* data, size_t size);

// A streaming state, opaque outside checksum_avx2.cc.
void* Xxh3Avx2Create();
void Xxh3Avx2Free(void* state);
void Xxh3Avx2Update(void* state, const void* data, size_t size);
uint64_t Xxh3Avx2Digest(const void* state);

}  // namespace ptc::internal

#endif  // PTC_COMMON_CHECKSUM_AVX2_H_
