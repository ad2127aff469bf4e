// HostProbes: a host's answer comes while another host holds its call; a
// host is not asked twice at once; dropping one cancels its call; the
// calls in flight are bounded; destroying the probes ends their calls.
#include "coordinator/host_probes.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

// Takes answers until `n` have come (at most a minute).
std::vector<HostProbes::Answer> TakeAtLeast(HostProbes& probes, size_t n) {
  std::vector<HostProbes::Answer> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (got.size() < n && absl::Now() < deadline) {
    for (HostProbes::Answer& a : probes.Take()) got.push_back(std::move(a));
    absl::SleepFor(absl::Milliseconds(10));
  }
  return got;
}

TEST_CASE(
    "HostProbes: a live host's answer comes while a silent host holds its "
    "call; a refused one fails at once; dropping the silent one cancels it",
    "[coordinator]") {
  auto live = testing::StartDaemon();
  testing::SilentStore silent;
  HostProbes probes;
  // The silent host's call would wait a minute: asking returns at once.
  const absl::Time before = absl::Now();
  REQUIRE(probes.Ask("silent", silent.address(), absl::Seconds(60)));
  REQUIRE(probes.Ask("live", live->address(), absl::Seconds(60)));
  REQUIRE(probes.Ask("gone", "127.0.0.1:1", absl::Seconds(60)));
  CHECK(absl::Now() - before < absl::Seconds(30));
  // Asked again while in flight: not asked twice.
  CHECK_FALSE(probes.Ask("silent", silent.address(), absl::Seconds(60)));

  std::vector<HostProbes::Answer> got = TakeAtLeast(probes, 2);
  REQUIRE(got.size() == 2);
  for (const HostProbes::Answer& a : got) {
    INFO(a.host);
    CHECK(a.asked >= before);
    if (a.host == "live") {
      REQUIRE(a.uptime.ok());
      CHECK(*a.uptime >= absl::ZeroDuration());
    } else {
      CHECK(a.host == "gone");
      CHECK(a.uptime.status().code() == absl::StatusCode::kUnavailable);
    }
  }
  // The silent host still holds its call.
  CHECK(probes.in_flight() == 1);
  CHECK(probes.open() == 3);
  // An answered host is asked again once its answer was taken.
  CHECK(probes.Ask("live", live->address(), absl::Seconds(60)));
  got = TakeAtLeast(probes, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].host == "live");
  CHECK(got[0].uptime.ok());

  // Dropped: its call is cancelled, no answer is given for it, and its
  // connection closes once the call ended.
  probes.Drop("silent");
  probes.Drop("live");
  probes.Drop("gone");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (probes.in_flight() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  CHECK(probes.in_flight() == 0);
  CHECK(probes.Take().empty());
  probes.Ask("live", live->address(), absl::Seconds(60));  // collects ended
  CHECK(probes.open() == 1);
}

TEST_CASE(
    "HostProbes: at most max_in_flight calls at once; destroying the probes "
    "cancels the calls in flight",
    "[coordinator]") {
  testing::SilentStore silent;
  const absl::Time before = absl::Now();
  {
    HostProbes probes(/*max_in_flight=*/3);
    for (int i = 0; i < 3; ++i) {
      CHECK(probes.Ask("host" + std::to_string(i), silent.address(),
                       absl::Seconds(60)));
    }
    CHECK_FALSE(probes.Ask("host3", silent.address(), absl::Seconds(60)));
    CHECK(probes.in_flight() == 3);
    CHECK(probes.open() == 3);  // host3 was not asked: no connection
    // A call's deadline ends it too: host0's answer comes, and another
    // host may be asked.
    probes.Drop("host0");
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (probes.in_flight() == 3 && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(10));
    CHECK(probes.Ask("host4", silent.address(), absl::Milliseconds(100)));
    std::vector<HostProbes::Answer> got = TakeAtLeast(probes, 1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].host == "host4");
    CHECK(got[0].uptime.status().code() ==
          absl::StatusCode::kDeadlineExceeded);
  }
  // The destructor did not wait out the minute-long calls.
  CHECK(absl::Now() - before < absl::Seconds(30));
}

}  // namespace
}  // namespace ptc
