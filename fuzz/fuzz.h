// ptc's fuzz targets: each defines LLVMFuzzerTestOneInput and is built two
// ways (fuzz/BUILD.bazel): with clang and libFuzzer (tools/fuzz.sh) to
// search, and as a Catch2 test with gcc that replays fuzz/corpus/NAME
// (seeds, and every input that ever crashed) in `bazel test //...`.
//
// Inputs that name an RPC start with one selector byte; the rest is the
// request's protobuf encoding (FuzzRequest splits them).
#ifndef PTC_FUZZ_FUZZ_H_
#define PTC_FUZZ_FUZZ_H_

#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace ptc::fuzz {

// The selector byte and the message bytes of an input.
struct FuzzRequest {
  uint8_t selector = 0;
  const uint8_t* message = nullptr;
  size_t size = 0;
};

// Protobuf logs every string field that is not UTF-8; fuzz inputs are full
// of them. Call once (a static in the target) to keep the logs readable.
inline bool QuietProtobuf() {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}

inline FuzzRequest SplitInput(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  return {data[0], data + 1, size - 1};
}

}  // namespace ptc::fuzz

#endif  // PTC_FUZZ_FUZZ_H_
