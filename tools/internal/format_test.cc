#include "tools/internal/format.h"

#include <catch2/catch.hpp>

namespace ptc::tools {
namespace {

TEST_CASE("format: bytes, seconds and percentages read well", "[tools]") {
  CHECK(HumanBytes(512) == "512 B");
  CHECK(HumanBytes(3.0 * (1 << 30)) == "3.00 GiB");
  CHECK(HumanSeconds(0.0123) == "12.3 ms");
  CHECK(PercentOver(105, 100) == "+5.0%");
}

}  // namespace
}  // namespace ptc::tools
