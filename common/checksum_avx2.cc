// Compiled with -mavx2 (see BUILD.bazel): xxhash's own AVX2 code, inlined
// here with its symbols renamed so that it cannot clash with the library.
#include "common/checksum_avx2.h"

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace ptc::internal {

uint64_t Xxh3Avx2(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

void* Xxh3Avx2Create() {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  return s;
}

void Xxh3Avx2Free(void* state) {
  XXH3_freeState(static_cast<XXH3_state_t*>(state));
}

void Xxh3Avx2Update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}

uint64_t Xxh3Avx2Digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}

}  // namespace ptc::internal
