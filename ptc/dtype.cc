#include "ptc/dtype.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {
namespace {

struct DTypeInfo {
  DType dtype;
  int64_t size;
  const char* name;
};

constexpr DTypeInfo kInfo[kNumDTypes] = {
    {DType::kFloat32, 4, "fp32"},        {DType::kFloat16, 2, "fp16"},
    {DType::kBFloat16, 2, "bf16"},       {DType::kFloat8E4M3, 1, "fp8_e4m3"},
    {DType::kFloat8E5M2, 1, "fp8_e5m2"}, {DType::kInt8, 1, "int8"},
    {DType::kInt16, 2, "int16"},         {DType::kInt32, 4, "int32"},
    {DType::kInt64, 8, "int64"},         {DType::kUInt8, 1, "uint8"},
    {DType::kBool, 1, "bool"},           {DType::kRaw, 1, "raw"},
};

constexpr DType kAll[kNumDTypes] = {
    DType::kFloat32,    DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
    DType::kFloat8E5M2, DType::kInt8,    DType::kInt16,    DType::kInt32,
    DType::kInt64,      DType::kUInt8,   DType::kBool,     DType::kRaw};

}  // namespace

int64_t ElementSize(DType dtype) { return kInfo[static_cast<int>(dtype)].size; }

absl::string_view DTypeName(DType dtype) {
  return kInfo[static_cast<int>(dtype)].name;
}

const DType* AllDTypes() { return kAll; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (name == info.name) return info.dtype;
  }
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  std::vector<std::string> names;
  for (const DTypeInfo& info : kInfo) names.push_back(info.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name,
                                                 "'; expected one of ",
                                                 absl::StrJoin(names, ", ")));
}

}  // namespace ptc
