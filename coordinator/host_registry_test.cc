#include "coordinator/host_registry.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

proto::HostStatus Status(const std::string& name, uint64_t incarnation) {
  proto::HostStatus h;
  h.set_name(name);
  h.set_address(name + ":7000");
  h.set_gpus(8);
  h.set_incarnation(incarnation);
  return h;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST_CASE("a host that comes back after it was declared dead") {
  HostRegistry hosts;
  HostRegistry::Registered first = hosts.Register(Status("a", 1), kT0);
  CHECK_FALSE(first.known);
  REQUIRE(hosts.Alive("a"));
  hosts.MarkDead("a");
  CHECK_FALSE(hosts.Alive("a"));
  // Dead hosts must register again: their heartbeats are refused.
  CHECK_FALSE(hosts.Heartbeat("a", 1, kT0 + absl::Seconds(1)));

  SECTION("as the same process: alive, to be proven before use") {
    HostRegistry::Registered r = hosts.Register(Status("a", 1), kT0);
    CHECK(r.known);
    CHECK(r.was_dead);
    CHECK(r.same_process);
    CHECK(hosts.Alive("a"));
    CHECK(hosts.NeedsProof("a"));
    hosts.Proven("a");
    CHECK_FALSE(hosts.NeedsProof("a"));
  }
  SECTION("as a new process: its memory is gone, nothing to prove") {
    HostRegistry::Registered r = hosts.Register(Status("a", 2), kT0);
    CHECK(r.was_dead);
    CHECK_FALSE(r.same_process);
    CHECK_FALSE(hosts.NeedsProof("a"));
    // The old process's heartbeats are not the new one's.
    CHECK_FALSE(hosts.Heartbeat("a", 1, kT0));
    CHECK(hosts.Heartbeat("a", 2, kT0));
    CHECK(hosts.Heartbeat("a", 0, kT0));
  }
}

TEST_CASE("a host that keeps coming back from false deaths is held back") {
  HostRegistry hosts;
  hosts.Register(Status("a", 1), kT0);
  absl::Time t = kT0;
  // Declared dead and back as the same process, every `gap`.
  auto flap = [&](absl::Duration gap) {
    t += gap;
    hosts.MarkDead("a");
    REQUIRE(hosts.Register(Status("a", 1), t).same_process);
  };
  flap(absl::Minutes(1));
  CHECK_FALSE(hosts.HeldBack("a", t));  // the first: jobs grow back at once
  flap(absl::Minutes(1));
  CHECK(hosts.HeldBack("a", t));
  CHECK(hosts.HeldBack("a", t + absl::Seconds(29)));
  CHECK_FALSE(hosts.HeldBack("a", t + absl::Seconds(30)));
  flap(absl::Minutes(1));
  CHECK(hosts.HeldBack("a", t + absl::Seconds(59)));
  CHECK_FALSE(hosts.HeldBack("a", t + absl::Seconds(60)));
  for (int i = 0; i < 10; ++i) flap(absl::Minutes(1));
  CHECK(hosts.HeldBack("a", t + HostRegistry::kMaxFlapHold - absl::Seconds(1)));
  CHECK_FALSE(hosts.HeldBack("a", t + HostRegistry::kMaxFlapHold));
  // Dead, it is not held back: it is not there.
  hosts.MarkDead("a");
  CHECK_FALSE(hosts.HeldBack("a", t));
  // Up for the window: the next false death is a first one again.
  hosts.Register(Status("a", 1), t);
  flap(HostRegistry::kFlapWindow + absl::Seconds(1));
  CHECK_FALSE(hosts.HeldBack("a", t));
  // A new process (a restart) is no false death.
  hosts.MarkDead("a");
  hosts.Register(Status("a", 2), t + absl::Seconds(1));
  CHECK_FALSE(hosts.HeldBack("a", t + absl::Seconds(1)));
  CHECK_FALSE(hosts.HeldBack("nowhere", t));
  // A host cannot claim a hold (or its absence): ListHosts says it.
  proto::HostStatus claims = Status("b", 1);
  claims.set_held_back_seconds(99);
  hosts.Register(claims, t);
  CHECK(hosts.Find("b")->status.held_back_seconds() == 0);
}

TEST_CASE("draining is the scheduler's word, not the host's") {
  HostRegistry hosts;
  hosts.Register(Status("a", 1), kT0);
  REQUIRE(hosts.SetDraining({"a"}, true).ok());
  CHECK(hosts.Alive("a"));
  CHECK_FALSE(hosts.Usable("a"));
  hosts.Register(Status("a", 2), kT0);  // a restart keeps it drained
  CHECK_FALSE(hosts.Usable("a"));
  // An unknown name changes nothing, not even the known ones.
  absl::Status s = hosts.SetDraining({"a", "nope"}, false);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(s.message()).find("'nope'") != std::string::npos);
  CHECK_FALSE(hosts.Usable("a"));
}

TEST_CASE("the heartbeat interval and timeout stretch as the cluster grows") {
  HostRegistry hosts;
  // 4 heartbeats a second, two per host per interval: the operator's 1 s
  // holds for two hosts.
  hosts.SetCadence({absl::Seconds(1), absl::Seconds(5), 4});
  hosts.Register(Status("a", 1), kT0);
  hosts.Register(Status("b", 1), kT0);
  CHECK(hosts.Interval() == absl::Seconds(1));
  CHECK(hosts.TimeoutOf(*hosts.Find("a")) == absl::Seconds(5));
  // Eight hosts: every 4 s, dead after 20 s.
  for (const char* h : {"c", "d", "e", "f", "g", "h"})
    hosts.Register(Status(h, 1), kT0);
  CHECK(hosts.Interval() == absl::Seconds(4));
  CHECK(hosts.Find("h")->told == absl::Seconds(4));
  // a was told 1 s; it is judged by the interval it will be told next.
  CHECK(hosts.IntervalOf(*hosts.Find("a")) == absl::Seconds(4));
  CHECK(hosts.TimeoutOf(*hosts.Find("a")) == absl::Seconds(20));
  CHECK_FALSE(hosts.Late(*hosts.Find("a"), kT0 + absl::Seconds(8)));
  CHECK(hosts.Late(*hosts.Find("a"), kT0 + absl::Seconds(8.5)));
  CHECK(hosts.Overdue(kT0 + absl::Seconds(10), kT0).empty());
  CHECK(hosts.Overdue(kT0 + absl::Seconds(10.5), kT0).size() == 8);
  // The cluster shrinks: h, told 4 s, is judged by that until it hears.
  hosts.SetCadence({absl::Seconds(1), absl::Seconds(5), 16});
  CHECK(hosts.Interval() == absl::Seconds(1));
  CHECK(hosts.TimeoutOf(*hosts.Find("h")) == absl::Seconds(20));
  // Each host is overdue at half of its own timeout: a and b were told
  // 1 s (5 s), c 1.5 s (7.5 s), d 2 s (10 s), ... h 4 s (20 s).
  std::vector<std::string> overdue;
  for (const auto& [name, address] : hosts.Overdue(kT0 + absl::Seconds(4), kT0))
    overdue.push_back(name);
  CHECK(overdue == std::vector<std::string>{"a", "b", "c"});
  CHECK(hosts.Overdue(kT0 + absl::Seconds(9), kT0).size() == 7);
  // A change from a, b and h waits on a silent source as long as h's
  // timeout, not today's 5 s; unknown names count for nothing.
  CHECK(hosts.LongestTimeoutOf({"a", "b"}) == absl::Seconds(5));
  CHECK(hosts.LongestTimeoutOf({"a", "h", "nope"}) == absl::Seconds(20));
  CHECK(hosts.LongestTimeoutOf({}) == absl::Seconds(5));
  REQUIRE(hosts.Heartbeat("h", 1, kT0 + absl::Seconds(3)));
  CHECK(hosts.TimeoutOf(*hosts.Find("h")) == absl::Seconds(5));
  CHECK(hosts.LongestTimeoutOf({"a", "h"}) == absl::Seconds(5));
}

TEST_CASE(
    "a stretched interval keeps the operator's timeout when it already spans "
    "enough intervals, and never multiplies it") {
  HostRegistry hosts;
  // A 30 s timeout at 1 s: 30 intervals. Stretched to 4 s it still spans
  // 7.5 of them, so it holds (it was 120 s: 30 s times the stretch).
  hosts.SetCadence({absl::Seconds(1), absl::Seconds(30), 4});
  for (const char* h : {"a", "b", "c", "d", "e", "f", "g", "h"})
    hosts.Register(Status(h, 1), kT0);
  CHECK(hosts.Interval() == absl::Seconds(4));
  CHECK(hosts.Timeout() == absl::Seconds(30));
  CHECK(hosts.TimeoutOf(*hosts.Find("a")) == absl::Seconds(30));
  // Sixteen hosts: every 8 s; five intervals (40 s) outlast the 30 s.
  for (const char* h : {"i", "j", "k", "l", "m", "n", "o", "p"})
    hosts.Register(Status(h, 1), kT0);
  CHECK(hosts.Interval() == absl::Seconds(8));
  CHECK(hosts.Timeout() == absl::Seconds(40));
  // An operator's timeout of 3 intervals stays 3 stretched ones.
  hosts.SetCadence({absl::Seconds(1), absl::Seconds(3), 8});
  CHECK(hosts.Interval() == absl::Seconds(4));
  CHECK(hosts.Timeout() == absl::Seconds(12));
}

TEST_CASE(
    "a ptcd younger than its host's registration is another process, judged "
    "by when it was asked, not when its answer was read") {
  const absl::Time registered = kT0;
  // Asked 60 s after the host registered, it answered "up for 61 s": the
  // registered process, also if the answer is read minutes later (a
  // probe's batch waits for its slowest host).
  CHECK_FALSE(HostRegistry::StartedAfter(absl::Seconds(61),
                                         kT0 + absl::Seconds(60), registered));
  // Up for 30 s when asked 60 s after the registration: started after it.
  CHECK(HostRegistry::StartedAfter(absl::Seconds(30), kT0 + absl::Seconds(60),
                                   registered));
  // Within a second: clocks, not another process.
  CHECK_FALSE(HostRegistry::StartedAfter(absl::Seconds(59.5),
                                         kT0 + absl::Seconds(60), registered));
  // A host known from the control store has no registration to compare.
  CHECK_FALSE(
      HostRegistry::StartedAfter(absl::Seconds(1), kT0, absl::InfinitePast()));
}

TEST_CASE("overdue hosts, and expiry of dead ones no job uses") {
  HostRegistry hosts;
  hosts.Register(Status("a", 1), kT0);
  hosts.Register(Status("b", 1), kT0);
  hosts.Register(Status("c", 1), kT0);
  REQUIRE(hosts.Heartbeat("b", 1, kT0 + absl::Seconds(4)));
  // Half the timeout (5 s by default): 2.5 s.
  auto overdue = hosts.Overdue(kT0 + absl::Seconds(5), kT0);
  REQUIRE(overdue.size() == 2);
  CHECK(overdue[0] == std::pair<std::string, std::string>{"a", "a:7000"});
  CHECK(overdue[1].first == "c");
  // Watching started later: nobody is late yet.
  CHECK(hosts.Overdue(kT0 + absl::Seconds(5), kT0 + absl::Seconds(4)).empty());
  hosts.HeardFrom("a", kT0 + absl::Seconds(5));
  CHECK(hosts.Overdue(kT0 + absl::Seconds(5), kT0).size() == 1);

  hosts.MarkDead("a");
  hosts.MarkDead("c");
  auto in_use = [](const std::string& h) { return h == "c"; };
  CHECK(hosts.Expire(kT0 + absl::Hours(1), absl::Hours(24), in_use).empty());
  CHECK(hosts.Expire(kT0 + absl::Hours(25), absl::Hours(24), in_use) ==
        std::vector<std::string>{"a"});
  CHECK(hosts.Find("a") == nullptr);
  CHECK(hosts.Find("c") != nullptr);
  CHECK(hosts.alive_count() == 1);
}

TEST_CASE("a write holds only the host records that changed") {
  HostRegistry hosts;
  hosts.Register(Status("a", 1), kT0);
  hosts.Register(Status("b", 1), kT0);
  ControlStore::Writes writes;
  auto records = hosts.Writes(&writes);
  CHECK(writes.size() == 2);
  hosts.Persisted(records);

  writes.clear();
  hosts.Persisted(hosts.Writes(&writes));
  CHECK(writes.empty());  // heartbeats are not persisted

  hosts.MarkDead("b");
  hosts.Expire(kT0 + absl::Hours(25), absl::Hours(24),
               [](const std::string&) { return false; });
  REQUIRE(hosts.SetDraining({"a"}, true).ok());
  writes.clear();
  records = hosts.Writes(&writes);
  CHECK(records.size() == 2);  // only the hosts touched are looked at
  REQUIRE(writes.size() == 2);
  CHECK(writes.at(HostRecord("b")) == std::nullopt);  // forgotten
  REQUIRE(writes.at(HostRecord("a")).has_value());
  proto::HostStatus a;
  REQUIRE(a.ParseFromString(*writes.at(HostRecord("a"))));
  CHECK(a.draining());

  // What was written loads back, and the next write holds nothing.
  std::map<std::string, std::string> stored;
  for (const auto& [key, bytes] : writes)
    if (bytes) stored[key] = *bytes;
  HostRegistry loaded;
  REQUIRE(loaded.Load(stored, proto::CoordinatorState(), kT0, "test").ok());
  CHECK(loaded.Find("a") != nullptr);
  CHECK(loaded.Find("a")->registered_at == absl::InfinitePast());
  ControlStore::Writes none;
  loaded.Writes(&none);
  CHECK(none.empty());

  stored["hosts/x"] = "not a registration";
  HostRegistry bad;
  CHECK(bad.Load(stored, proto::CoordinatorState(), kT0, "test").code() ==
        absl::StatusCode::kDataLoss);
}

TEST_CASE(
    "after a write that failed part way, the next one compares with what "
    "was written") {
  HostRegistry hosts;
  for (const char* name : {"a", "b", "c"}) hosts.Register(Status(name, 1), kT0);
  ControlStore::Writes writes;
  hosts.Persisted(hosts.Writes(&writes));
  const std::string a_before = *writes.at(HostRecord("a"));

  // Draining a and b, and forgetting c: a's record and c's delete commit
  // in an earlier transaction, b's is refused with a later one.
  REQUIRE(hosts.SetDraining({"a", "b"}, true).ok());
  hosts.MarkDead("c");
  hosts.Expire(kT0 + absl::Hours(25), absl::Hours(24),
               [](const std::string&) { return false; });
  writes.clear();
  hosts.Writes(&writes);
  REQUIRE(writes.size() == 3);
  ControlStore::Writes written = {{HostRecord("a"), writes.at(HostRecord("a"))},
                                  {HostRecord("c"), std::nullopt}};
  hosts.PartlyPersisted(written);
  writes.clear();
  SECTION("kept in memory: the rest is written") {
    hosts.Persisted(hosts.Writes(&writes));
    CHECK(writes.size() == 1);  // b's alone
    CHECK(writes.count(HostRecord("b")));
  }
  SECTION("a's drain undone in memory: its record is written back") {
    REQUIRE(hosts.SetDraining({"a"}, false).ok());
    hosts.Persisted(hosts.Writes(&writes));
    REQUIRE(writes.size() == 2);
    CHECK(*writes.at(HostRecord("a")) == a_before);
    CHECK(writes.count(HostRecord("b")));
  }
  writes.clear();
  hosts.Writes(&writes);
  CHECK(writes.empty());
}

}  // namespace
}  // namespace ptc
