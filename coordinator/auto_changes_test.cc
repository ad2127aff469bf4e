#include "coordinator/auto_changes.h"

#include <catch2/catch.hpp>

#include "coordinator/saves_state.h"

namespace ptc {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(100000);

proto::HostStatus Host(const std::string& name) {
  proto::HostStatus h;
  h.set_name(name);
  h.set_address(name + ":7000");
  h.set_gpus(8);
  h.set_incarnation(1);
  return h;
}

// A job on hosts a and b (pool a, b, c) at committed version 4, with
// automatic changes on (live: its processes save first).
std::unique_ptr<JobTable::Job> LiveJob() {
  auto job = std::make_unique<JobTable::Job>();
  auto& s = job->state;
  s.set_job("j");
  s.set_config("tp=1,pp=1,dp=16");
  s.add_hosts("a");
  s.add_hosts("b");
  for (const char* h : {"a", "b", "c"}) s.add_pool(h);
  s.set_committed_version(4);
  s.set_layout_epoch(2);
  s.mutable_auto_policy()->set_enabled(true);
  s.mutable_auto_policy()->set_live(true);
  return job;
}

struct World {
  HostRegistry hosts;
  AutoChanges auto_changes;
  std::unique_ptr<JobTable::Job> job = LiveJob();
  World() {
    for (const char* h : {"a", "b", "c"}) hosts.Register(Host(h), kT0);
  }
  std::optional<AutoChanges::Action> Look(
      absl::Duration after = absl::ZeroDuration()) {
    return auto_changes.Judge("j", *job, hosts, kT0 + after);
  }
};

TEST_CASE("a job is changed when what it may use changes, once") {
  World w;
  // The first look sees a pool host it does not use.
  auto first = w.Look();
  REQUIRE(first.has_value());
  CHECK(first->reason == "host c can take it");
  CHECK(first->save_first);
  CHECK_FALSE(w.Look().has_value());  // nothing new since

  SECTION("a host of the job dies: it leaves the pool, no save first") {
    w.hosts.MarkDead("b");
    auto a = w.Look();
    REQUIRE(a.has_value());
    CHECK(a->reason == "host b died");
    CHECK_FALSE(a->save_first);
    CHECK(w.job->state.pool_size() == 2);  // a, c
    // ... remembered, to rejoin if it returns as the same process.
    REQUIRE(w.job->state.left_pool_dead_size() == 1);
    CHECK(w.job->state.left_pool_dead(0) == "b");
    CHECK_FALSE(w.job->Names("c"));
  }
  SECTION("a host of the job is drained: its processes save first") {
    REQUIRE(w.hosts.SetDraining({"a"}, true).ok());
    auto a = w.Look();
    REQUIRE(a.has_value());
    CHECK(a->reason == "host a drained");
    CHECK(a->save_first);
  }
  SECTION("its policy changes") {
    w.auto_changes.PolicyChanging("j", w.job->state.auto_policy());
    w.job->state.mutable_auto_policy()->set_max_gpus(8);
    CHECK(w.auto_changes.woken());
    auto a = w.Look();
    REQUIRE(a.has_value());
    CHECK(a->reason == "its automatic-change policy changed");
  }
  SECTION(
      "a process dies: the job must change; an older epoch's does not count") {
    w.auto_changes.ProcessExited("j", 1, "old");
    CHECK_FALSE(w.Look().has_value());
    w.auto_changes.ProcessExited("j", 2,
                                 "its process on GPU 3 of a exited with 1");
    auto a = w.Look();
    REQUIRE(a.has_value());
    CHECK(a->must_change);
    CHECK(a->reason == "its process on GPU 3 of a exited with 1");
    CHECK_FALSE(w.Look().has_value());
  }
  SECTION("a change that failed is not tried again for a while") {
    w.hosts.MarkDead("b");
    w.auto_changes.Failed("j", kT0);
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    CHECK(w.Look(kAutoRetry + absl::Seconds(1)).has_value());
  }
  SECTION("a policy change that failed to start is tried again") {
    w.auto_changes.PolicyChanging("j", w.job->state.auto_policy());
    w.job->state.mutable_auto_policy()->set_max_gpus(8);
    REQUIRE(w.Look().has_value());
    w.auto_changes.Failed("j", kT0);  // e.g. no config fits
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    CHECK(w.Look(kAutoRetry + absl::Seconds(1)).has_value());
  }
  SECTION("a change that found a save committing is tried again at once") {
    w.auto_changes.PolicyChanging("j", w.job->state.auto_policy());
    w.job->state.mutable_auto_policy()->set_max_gpus(8);
    REQUIRE(w.Look().has_value());
    w.auto_changes.Failed("j", kT0, kAutoRetryAborted);  // ABORTED
    CHECK_FALSE(w.Look(kAutoRetryAborted / 2).has_value());
    CHECK(w.Look(kAutoRetryAborted + absl::Milliseconds(1)).has_value());
  }
  SECTION("a change in flight or a save committing: left alone") {
    w.hosts.MarkDead("b");
    w.job->state.set_target_version(5);
    CHECK_FALSE(w.Look().has_value());
    w.job->state.set_target_version(0);
    w.job->committing_save = true;
    CHECK_FALSE(w.Look().has_value());
  }
}

TEST_CASE(
    "a job grows onto a host back from repeated false deaths after its hold") {
  World w;
  REQUIRE(w.Look().has_value());  // c can take it (the first look)
  // c keeps being declared dead and coming back as the same process.
  absl::Time t = kT0;
  for (int i = 0; i < 2; ++i) {
    t += absl::Minutes(1);
    w.hosts.MarkDead("c");
    REQUIRE(w.hosts.Register(Host("c"), t).same_process);
  }
  const absl::Duration since = t - kT0;
  REQUIRE(w.hosts.HeldBack("c", t));
  // The pool it may use lost c (held back): a change away from it would be
  // due if the job ran there; it does not, so the look shrinks nothing...
  auto during =
      w.auto_changes.Judge("j", *w.job, w.hosts, t + absl::Seconds(1));
  REQUIRE(during.has_value());
  CHECK(during->reason == "its hosts changed");
  CHECK_FALSE(w.auto_changes.Judge("j", *w.job, w.hosts, t + absl::Seconds(20))
                  .has_value());
  // ... and once the hold ends, c can take it.
  auto after = w.auto_changes.Judge("j", *w.job, w.hosts,
                                    kT0 + since + absl::Seconds(31));
  REQUIRE(after.has_value());
  CHECK(after->reason == "host c can take it");
}

TEST_CASE("a job without automatic changes, or never saved, is not changed") {
  World w;
  w.job->state.mutable_auto_policy()->set_enabled(false);
  w.hosts.MarkDead("b");
  CHECK_FALSE(w.Look().has_value());
  w.job->state.mutable_auto_policy()->set_enabled(true);
  w.job->state.set_committed_version(0);
  CHECK_FALSE(w.Look().has_value());
}

TEST_CASE("a pending change starts after its save, or without it") {
  World w;
  auto& s = w.job->state;
  s.mutable_pending()->set_job("j");
  s.mutable_pending()->set_to("tp=1,pp=1,dp=24");
  s.set_pending_reason("requested");
  s.set_pending_after_version(4);
  s.set_pending_unix(absl::ToUnixSeconds(kT0));
  CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());  // waits for the save

  SECTION("the save committed") {
    s.set_committed_version(5);
    auto a = w.Look(absl::Seconds(1));
    REQUIRE(a.has_value());
    CHECK(a->pending);
    CHECK(a->request.to() == "tp=1,pp=1,dp=24");
    CHECK(a->reason == "requested");
  }
  SECTION("a hot switch: only a save its processes make for it counts") {
    s.mutable_pending()->set_hot(true);
    s.set_pending_after_version(kAwaitingOwnSave);
    s.set_committed_version(5);  // a periodic save
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    s.set_pending_after_version(5);  // they began version 6 for the change
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    s.set_committed_version(6);
    auto a = w.Look(absl::Seconds(1));
    REQUIRE(a.has_value());
    CHECK(a->pending);
  }
  SECTION("no save within the timeout: from the committed version") {
    auto a = w.Look(absl::Seconds(kDefaultSaveTimeout + 1));
    REQUIRE(a.has_value());
    CHECK(a->pending);
  }
  SECTION("a host died before it saved") {
    w.hosts.MarkDead("a");
    auto a = w.Look(absl::Seconds(1));
    REQUIRE(a.has_value());
    CHECK(a->pending);
  }
  SECTION("a host it would run on dies: it is dropped and planned again") {
    for (const char* h : {"a", "b", "c"}) s.mutable_pending()->add_hosts(h);
    w.hosts.MarkDead("c");  // in the pool, not (yet) the job's
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    CHECK_FALSE(s.has_pending());
    CHECK(w.auto_changes.woken());
    auto a = w.Look(absl::Seconds(1));
    REQUIRE(a.has_value());
    CHECK_FALSE(a->pending);  // judged afresh on the live hosts
  }
  SECTION("a hot switch that lost a process is dropped, then the job changes") {
    s.mutable_pending()->set_hot(true);
    s.set_hot_version(6);
    s.add_open_saves()->set_version(6);
    w.job->saved[6] = {0, 1};
    w.auto_changes.ProcessExited("j", 2, "killed");
    CHECK_FALSE(w.Look(absl::Seconds(1)).has_value());
    CHECK_FALSE(s.has_pending());
    CHECK(s.open_saves().empty());  // its save is reclaimed
    CHECK(w.job->saved.empty());
    CHECK(w.auto_changes.woken());
    auto a = w.Look(absl::Seconds(1));
    REQUIRE(a.has_value());
    CHECK(a->must_change);
    CHECK(a->reason == "a process died during a hot switch");
  }
}

TEST_CASE("a change for a death waits while another host of the job is late") {
  World w;
  // Late after two 1 s intervals; the wait: a 5 s timeout and 2 s more.
  w.auto_changes.WaitForLateHosts(true);
  REQUIRE(w.Look().has_value());  // the first look: host c can take it
  // a and b went silent at kT0 (one rack); c heartbeats. b is declared
  // dead first; a is still in doubt.
  REQUIRE(w.hosts.Heartbeat("c", 1, kT0 + absl::Seconds(4.5)));
  w.hosts.MarkDead("b");
  CHECK_FALSE(w.Look(absl::Seconds(5)).has_value());
  CHECK(w.job->state.pool_size() == 3);  // nothing changed yet

  SECTION("once a is declared dead too, one change handles both") {
    w.hosts.MarkDead("a");
    auto a = w.Look(absl::Seconds(5.5));
    REQUIRE(a.has_value());
    CHECK(a->reason == "hosts a, b died");
    CHECK(w.job->state.pool_size() == 1);  // c
  }
  SECTION("a host heard from again ends the wait") {
    REQUIRE(w.hosts.Heartbeat("a", 1, kT0 + absl::Seconds(5.5)));
    auto a = w.Look(absl::Seconds(5.6));
    REQUIRE(a.has_value());
    CHECK(a->reason == "host b died");
  }
  SECTION("the wait is bounded") {
    CHECK_FALSE(w.Look(absl::Seconds(11)).has_value());
    auto a = w.Look(absl::Seconds(12.5));
    REQUIRE(a.has_value());
    CHECK(a->reason == "host b died");
  }
}

TEST_CASE(
    "a change for a death waits only for hosts that went silent with the "
    "dead") {
  World w;
  w.auto_changes.WaitForLateHosts(true);
  REQUIRE(w.Look().has_value());  // the first look: host c can take it
  // b went silent at kT0 and is declared dead; c heartbeats. Hosts are
  // late after two 1 s intervals; the window is kSilentTogether and two
  // intervals: 7 s.
  REQUIRE(w.hosts.Heartbeat("c", 1, kT0 + absl::Seconds(10.5)));
  SECTION("a, heard until 8 s after b, stalled on its own: not waited for") {
    REQUIRE(w.hosts.Heartbeat("a", 1, kT0 + absl::Seconds(8)));
    w.hosts.MarkDead("b");
    REQUIRE(w.hosts.Late(*w.hosts.Find("a"), kT0 + absl::Seconds(11)));
    auto a = w.Look(absl::Seconds(11));
    REQUIRE(a.has_value());
    CHECK(a->reason == "host b died");
  }
  SECTION("a, heard until 6.5 s after b, may have died with it: waited for") {
    REQUIRE(w.hosts.Heartbeat("a", 1, kT0 + absl::Seconds(6.5)));
    w.hosts.MarkDead("b");
    CHECK_FALSE(w.Look(absl::Seconds(11)).has_value());
  }
}

TEST_CASE("a change's reason names at most kHostsNamed hosts") {
  CHECK(NameHosts({"a"}) == "host a");
  CHECK(NameHosts({"a", "b"}) == "hosts a, b");
  std::vector<std::string> rack;
  for (int i = 0; i < 128; ++i) rack.push_back("h" + std::to_string(i));
  CHECK(NameHosts(rack) ==
        "hosts h0, h1, h2, h3, h4, h5, h6, h7 and 120 more");
  rack.resize(kHostsNamed);
  CHECK(NameHosts(rack) == "hosts h0, h1, h2, h3, h4, h5, h6, h7");
}

}  // namespace
}  // namespace ptc
