// OnEachAddress: every address is called once, at most `max_at_once` at a
// time, and the first error comes back.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/reconfigure_driver.h"

namespace ptc {
namespace {

TEST_CASE(
    "OnEachAddress calls every address once, a bounded number at a time, "
    "and returns the first error",
    "[coordinator]") {
  std::vector<std::string> addresses;
  for (int i = 0; i < 300; ++i) addresses.push_back("host" + std::to_string(i));
  std::mutex mu;
  std::multiset<std::string> called;
  std::atomic<int> running{0}, most{0};
  auto call = [&](const std::string& a) {
    const int now = ++running;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    {
      std::lock_guard<std::mutex> lock(mu);
      called.insert(a);
    }
    --running;
    return a == "host7" ? absl::UnavailableError("host7 is down")
                        : absl::OkStatus();
  };
  const absl::Status s = OnEachAddress(addresses, call, /*max_at_once=*/16);
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(called.size() == addresses.size());
  CHECK(std::set<std::string>(called.begin(), called.end()).size() ==
        addresses.size());
  CHECK(most.load() <= 16);
  CHECK(most.load() > 1);  // they do run at once

  SECTION("no addresses: nothing called, OK") {
    CHECK(OnEachAddress({}, call).ok());
  }
}

}  // namespace
}  // namespace ptc
