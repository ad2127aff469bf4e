#include "common/checksum.h"

#include <xxhash.h>

#include "common/checksum_avx2.h"
#include "common/cpu.h"

namespace ptc {

// Checksums run on every byte saved, moved and verified: the AVX2 build of
// xxh3 where the CPU has AVX2, the library's (SSE2) elsewhere.
struct StreamingChecksum::State {
  const bool avx2 = CpuHasAvx2();
  void* s = avx2 ? internal::Xxh3Avx2Create() : XXH3_createState();
  ~State() {
    if (avx2) {
      internal::Xxh3Avx2Free(s);
    } else {
      XXH3_freeState(static_cast<XXH3_state_t*>(s));
    }
  }
};

uint64_t Checksum(const void* data, size_t size) {
  return CpuHasAvx2() ? internal::Xxh3Avx2(data, size)
                      : XXH3_64bits(data, size);
}

StreamingChecksum::StreamingChecksum() : state_(new State) {
  if (!state_->avx2) XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_->s));
}

StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::Update(const void* data, size_t size) {
  if (state_->avx2) {
    internal::Xxh3Avx2Update(state_->s, data, size);
  } else {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_->s), data, size);
  }
}

uint64_t StreamingChecksum::Digest() const {
  return state_->avx2
             ? internal::Xxh3Avx2Digest(state_->s)
             : XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_->s));
}

}  // namespace ptc
