#include "common/logging.h"

#include "catch2/catch.hpp"

namespace ptc {
namespace {

TEST_CASE("log limits: a flood is held back per kind and counted",
          "[common]") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t held = -1;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(LogAllowed("test refused Put", &held, 3, t0));
    CHECK(held == 0);
  }
  for (int i = 0; i < 50; ++i)
    CHECK_FALSE(LogAllowed("test refused Put", &held, 3, t0 + absl::Milliseconds(i)));
  // Another kind is not held back by this one.
  CHECK(LogAllowed("test refused Read", &held, 3, t0));
  // The next second lets it through again and says what was held back.
  REQUIRE(LogAllowed("test refused Put", &held, 3, t0 + absl::Seconds(1)));
  CHECK(held == 50);
  CHECK(SuppressedNote(held) == " (50 more like it not logged)");
  CHECK(SuppressedNote(0).empty());
}

}  // namespace
}  // namespace ptc
