#include "common/checksum.h"

#include <xxhash.h>

namespace ptc {

struct StreamingChecksum::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

uint64_t Checksum(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

StreamingChecksum::StreamingChecksum() : state_(new State) {
  XXH3_64bits_reset(state_->s);
}

StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::Update(const void* data, size_t size) {
  XXH3_64bits_update(state_->s, data, size);
}

uint64_t StreamingChecksum::Digest() const {
  return XXH3_64bits_digest(state_->s);
}

}  // namespace ptc
