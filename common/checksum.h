// xxh3-64 checksums of stored regions, one-shot or streaming.
//
//   uint64_t c = Checksum(data, n);
//   StreamingChecksum s; s.Update(a, na); s.Update(b, nb); s.Digest();
#ifndef PTC_COMMON_CHECKSUM_H_
#define PTC_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ptc {

uint64_t Checksum(const void* data, size_t size);

class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size);
  // Checksum of everything so far; equal to Checksum() of the concatenation.
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ptc

#endif  // PTC_COMMON_CHECKSUM_H_
