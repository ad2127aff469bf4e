// Element types of tensors held by ptc, with their sizes in bytes.
//
//   PTC_ASSIGN_OR_RETURN(DType t, ParseDType("bf16"));
//   int64_t bytes = ElementSize(t) * region.volume();
#ifndef PTC_PTC_DTYPE_H_
#define PTC_PTC_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptc {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat8E4M3 = 3,
  kFloat8E5M2 = 4,
  kInt8 = 5,
  kInt16 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kUInt8 = 9,
  kBool = 10,
  // Opaque bytes (small objects, serialized state): one byte per element.
  kRaw = 11,
};

inline constexpr int kNumDTypes = 12;

// Bytes per element: 4, 2, 2, 1, 1, 1, 2, 4, 8, 1, 1, 1 in enum order.
int64_t ElementSize(DType dtype);

// Short lowercase name: "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2",
// "int8", "int16", "int32", "int64", "uint8", "bool", "raw".
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; also accepts "float32", "float16", "bfloat16".
// INVALID_ARGUMENT names the unknown string and lists the valid ones.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// All dtypes in enum order (for tests and help texts).
const DType* AllDTypes();

}  // namespace ptc

#endif  // PTC_PTC_DTYPE_H_
