// OnEachAddress: every address is called once, at most `max_at_once` at a
// time, and the first error comes back. ReleaseOn, built on it, does not
// wait long for a host that does not answer.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/reconfigure_driver.h"
#include "tensor_store/internal/testing.h"

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

TEST_CASE(
    "ReleaseOn releases a version on the hosts that answer and gives up on "
    "one that does not within seconds",
    "[coordinator]") {
  // A host that keeps its connections but answers nothing (stopped).
  testing::SilentStore silent;
  auto live = testing::StartDaemon(int64_t{64} << 20);
  const Shape shape = {16};
  REQUIRE(live->client->Declare("j", {{"w", DType::kFloat32, shape}}).ok());
  std::vector<float> w(16, 1.0f);
  REQUIRE(live->client->Put("j", 1, "w", Region::Full(shape), w.data(), 16 * 4)
              .ok());
  REQUIRE(live->client->Commit("j", 1).ok());
  const absl::Time start = absl::Now();
  ReleaseOn({silent.address(), live->address()}, "j", 1);
  const absl::Duration took = absl::Now() - start;
  CHECK(silent.calls() == 1);
  // The call's default deadline is 30 s; a release gives each host 3.
  CHECK(took < absl::Seconds(10));
  auto list = live->client->List("j");
  REQUIRE(list.ok());
  for (const proto::JobInfo& j : list->jobs())
    for (const proto::VersionInfo& v : j.versions()) CHECK(v.version() != 1);
}

}  // namespace
}  // namespace ptc
