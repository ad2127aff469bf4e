#include "ptc/dtype.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("dtype: every dtype has its size and round-trips by name",
          "[ptc][dtype]") {
  const int64_t sizes[kNumDTypes] = {4, 2, 2, 1, 1, 1, 2, 4, 8, 1, 1, 1};
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = AllDTypes()[i];
    CHECK(ElementSize(t) == sizes[i]);
    auto parsed = ParseDType(DTypeName(t));
    REQUIRE(parsed.ok());
    CHECK(*parsed == t);
  }
  CHECK(*ParseDType("bfloat16") == DType::kBFloat16);
}

TEST_CASE("dtype: an unknown name is INVALID_ARGUMENT naming it",
          "[ptc][dtype]") {
  auto parsed = ParseDType("fp12");
  REQUIRE(!parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(parsed.status().message().find("fp12") != std::string::npos);
}

}  // namespace
}  // namespace ptc
