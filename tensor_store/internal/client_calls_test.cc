#include "tensor_store/internal/client_calls.h"

#include <catch2/catch.hpp>
#include <vector>

namespace ptc {
namespace {

TEST_CASE(
    "client calls: bounded per connection, per job and all together; a "
    "slot given back makes room",
    "[tensor_store][limits]") {
  ClientCalls calls({/*per_connection=*/2, /*per_job=*/3, /*all=*/4});
  std::vector<ClientCalls::Slot> held;
  auto enter = [&](const char* connection, const char* job) {
    auto slot = calls.Enter(connection, job, "Put");
    if (slot.ok()) held.push_back(*std::move(slot));
    return slot.status();
  };
  REQUIRE(enter("a", "j").ok());
  REQUIRE(enter("a", "j").ok());
  absl::Status s = enter("a", "j");
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("this connection holds 2 calls"));
  REQUIRE(enter("b", "j").ok());
  s = enter("c", "j");
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("this job's clients hold 3 calls"));
  REQUIRE(enter("c", "k").ok());
  s = enter("d", "k");
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("all jobs' clients hold 4 calls"));
  CHECK(calls.active() == 4);
  held.erase(held.begin());  // one of connection a's, job j's
  CHECK(calls.active() == 3);
  REQUIRE(enter("a", "j").ok());
  held.clear();
  CHECK(calls.active() == 0);
  // A refused call leaves nothing behind.
  CHECK(enter("e", "").ok());
  CHECK(calls.active() == 1);
}

}  // namespace
}  // namespace ptc
