#include "common/scratch_buffers.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace ptc {
namespace {

TEST_CASE("scratch buffers: a returned buffer is leased again, not made anew",
          "[common]") {
  ScratchBuffers pool(/*max_idle=*/2, absl::Hours(1));
  char* first = nullptr;
  {
    ScratchBuffers::Lease a = pool.Take(3 << 20);
    REQUIRE(a.data() != nullptr);
    REQUIRE(a.size() >= size_t{3} << 20);
    std::memset(a.data(), 7, a.size());  // writable, every byte
    first = a.data();
  }
  CHECK(pool.idle() == 1);
  ScratchBuffers::Lease b = pool.Take(1 << 20);  // smaller: the same buffer
  CHECK(b.data() == first);
  CHECK(pool.idle() == 0);
  b.Reserve(64 << 20);  // larger: another one; the small one goes back
  CHECK(b.size() >= size_t{64} << 20);
  CHECK(pool.idle() == 1);
  b.Discard();
  CHECK(b.data() == nullptr);
  CHECK(pool.idle() == 1);
}

TEST_CASE("scratch buffers: at most max_idle wait, the largest kept",
          "[common]") {
  ScratchBuffers pool(/*max_idle=*/2, absl::Hours(1));
  {
    ScratchBuffers::Lease a = pool.Take(2 << 20);
    ScratchBuffers::Lease b = pool.Take(8 << 20);
    ScratchBuffers::Lease c = pool.Take(4 << 20);
  }
  CHECK(pool.idle() == 2);
  CHECK(pool.idle_bytes() == (size_t{8} << 20) + (size_t{4} << 20));
  ScratchBuffers::Lease none = pool.Empty();  // holds nothing until Reserve
  CHECK(none.data() == nullptr);
  none.Reserve(0);
  CHECK(none.data() == nullptr);
}

TEST_CASE("scratch buffers: an idle buffer is unmapped after idle_for",
          "[common]") {
  ScratchBuffers pool(/*max_idle=*/4, absl::Milliseconds(50));
  { ScratchBuffers::Lease a = pool.Take(1 << 20); }
  CHECK(pool.idle() == 1);
  // The trimming thread frees it without another call; waited for without
  // a bound on the machine's speed.
  while (pool.idle() != 0) absl::SleepFor(absl::Milliseconds(10));
  CHECK(pool.idle_bytes() == 0);
}

TEST_CASE("scratch buffers: a moved lease gives its buffer back once",
          "[common]") {
  ScratchBuffers pool(/*max_idle=*/4, absl::Hours(1));
  {
    ScratchBuffers::Lease a = pool.Take(1 << 20);
    ScratchBuffers::Lease b = std::move(a);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move)
    ScratchBuffers::Lease c;
    c = std::move(b);
    CHECK(c.data() != nullptr);
  }
  CHECK(pool.idle() == 1);
}

}  // namespace
}  // namespace ptc
