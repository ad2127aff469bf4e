// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON (UTF-8, padded
// with spaces to a multiple of 8) mapping each tensor name to its dtype,
// shape and [begin, end) byte offsets into the data that follows, plus an
// optional "__metadata__" object of string values; then the tensors' raw
// little-endian row-major bytes, in order, with no gaps.
//
// ptc writes its snapshot shards and exports in it, so that any
// safetensors reader opens them.
//
//   std::vector<SafetensorsEntry> e = {{"w", DType::kFloat32, {2, 3}}};
//   std::string header = SafetensorsHeader(e, {{"format", "pt"}});
//   // write header, then 24 bytes of w
#ifndef PTC_SNAPSHOT_SAFETENSORS_H_
#define PTC_SNAPSHOT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ptc/dtype.h"
#include "ptc/region.h"

namespace ptc {

// The format's name for `dtype` ("F32", "BF16", "F8_E4M3", ...); raw
// bytes are "U8".
absl::string_view SafetensorsDType(DType dtype);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  // Set by SafetensorsHeader: the data's [begin, end) after the header.
  int64_t begin = 0;
  int64_t end = 0;
};

// The file's first bytes: length, JSON header and padding. Entries' data
// follow in order; fills each entry's begin and end. INVALID_ARGUMENT for
// duplicate or empty names or a name starting with "__".
absl::StatusOr<std::string> SafetensorsHeader(
    std::vector<SafetensorsEntry>* entries,
    const std::map<std::string, std::string>& metadata);

// A parsed header: entries (dtype by the format's name) and where the data
// starts in the file.
struct SafetensorsIndex {
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0;
    int64_t end = 0;
  };
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;
};

// Parses the first bytes of a file (at least 8 + the header length; at
// most 100 MB of header). INVALID_ARGUMENT / DATA_LOSS for bytes that are
// not a safetensors header.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsHeader(absl::string_view bytes,
                                                        int64_t file_size);

}  // namespace ptc

#endif  // PTC_SNAPSHOT_SAFETENSORS_H_
