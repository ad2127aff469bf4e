#include "common/open_files.h"

#include <sys/resource.h>

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("open files: the soft limit is raised to the hard one",
          "[common]") {
  rlimit old;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  REQUIRE(old.rlim_max > 64);
  rlimit low = old;
  low.rlim_cur = 64;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  const int64_t files = RaiseOpenFilesLimit();
  rlimit now;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur == old.rlim_max);
  if (old.rlim_max != RLIM_INFINITY)
    CHECK(files == static_cast<int64_t>(old.rlim_max));
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
}

}  // namespace
}  // namespace ptc
