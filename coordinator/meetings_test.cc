#include "coordinator/meetings.h"

#include <catch2/catch.hpp>

#include "absl/status/status.h"

namespace ptc {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

std::string Message(const absl::StatusOr<std::string>& s) {
  return std::string(s.status().message());
}

TEST_CASE("the ranks meet once every one is there at once") {
  Meetings m;
  // Rank 1 first: rank 0 has offered nothing yet.
  auto r1 = m.Arrive("j", 3, 3, 1, "", kT0);
  CHECK(absl::IsUnavailable(r1.status()));
  CHECK(Message(r1).find("rank 0 of layout epoch 3 has not offered") !=
        std::string::npos);
  auto r0 = m.Arrive("j", 3, 3, 0, "10.0.0.1:29500", kT0);
  CHECK(absl::IsUnavailable(r0.status()));
  CHECK(Message(r0).find("2 of the 3 ranks of layout epoch 3 are here; "
                         "waiting for rank 2") != std::string::npos);
  auto r2 = m.Arrive("j", 3, 3, 2, "", kT0 + absl::Milliseconds(10));
  REQUIRE(r2.ok());
  CHECK(*r2 == "10.0.0.1:29500");
  // The others learn it on their next ask, however late.
  CHECK(*m.Arrive("j", 3, 3, 0, "10.0.0.1:29500", kT0 + absl::Minutes(5)) ==
        "10.0.0.1:29500");
  CHECK(*m.Arrive("j", 3, 3, 1, "", kT0 + absl::Minutes(5)) ==
        "10.0.0.1:29500");
}

TEST_CASE("a rank that stopped asking holds the meeting") {
  Meetings m;
  REQUIRE(!m.Arrive("j", 1, 2, 1, "", kT0).ok());
  // Rank 1 died; rank 0 comes long after its last ask.
  const absl::Time later = kT0 + kMeetingPresence + absl::Seconds(1);
  auto r0 = m.Arrive("j", 1, 2, 0, "h:1", later);
  CHECK(absl::IsUnavailable(r0.status()));
  CHECK(Message(r0).find("1 of the 2 ranks") != std::string::npos);
  CHECK(Message(r0).find("waiting for rank 1") != std::string::npos);
  // It asks again (a new process of the same epoch): met.
  auto r1 = m.Arrive("j", 1, 2, 1, "", later + kMeetingScan);
  REQUIRE(r1.ok());
  CHECK(*r1 == "h:1");
}

TEST_CASE("a new epoch is a new meeting; the wait names a few ranks") {
  Meetings m;
  REQUIRE(!m.Arrive("j", 1, 20, 0, "a:1", kT0).ok());
  for (int r = 1; r < 19; ++r) REQUIRE(!m.Arrive("j", 1, 20, r, "", kT0).ok());
  REQUIRE(m.Arrive("j", 1, 20, 19, "", kT0).ok());  // the last one
  // Epoch 2 has 40 ranks: only rank 0 is there.
  auto r0 = m.Arrive("j", 2, 40, 0, "b:1", kT0 + absl::Seconds(1));
  CHECK(absl::IsUnavailable(r0.status()));
  CHECK(Message(r0).find("1 of the 40 ranks of layout epoch 2 are here; "
                         "waiting for ranks 1, 2, 3, 4, 5, 6, 7, 8, ...") !=
        std::string::npos);
  // Another job's meeting is its own.
  CHECK(!m.Arrive("k", 2, 2, 1, "", kT0).ok());
  m.Forget("j");
  CHECK(absl::IsUnavailable(m.Arrive("j", 2, 40, 1, "", kT0).status()));
}

TEST_CASE("a rank whose call is held is present however long it waits") {
  Meetings m;
  REQUIRE(!m.Arrive("j", 1, 2, 1, "", kT0).ok());
  REQUIRE(m.Hold("j", 1, 1));
  // Long past kMeetingPresence, rank 1 is still waiting at the coordinator.
  const absl::Time later = kT0 + kMeetingPresence + absl::Seconds(10);
  auto r0 = m.Arrive("j", 1, 2, 0, "h:1", later);
  REQUIRE(r0.ok());
  CHECK(*r0 == "h:1");
  m.Release("j", 1, 1, later, /*gone=*/false);
}

TEST_CASE("a rank whose held call went away is absent at once") {
  Meetings m;
  REQUIRE(!m.Arrive("j", 1, 2, 1, "", kT0).ok());
  REQUIRE(m.Hold("j", 1, 1));
  // Twice (a call its process gave up on, not yet seen to end, and the one
  // it asked again): one gone leaves the rank present.
  REQUIRE(!m.Arrive("j", 1, 2, 1, "", kT0).ok());
  REQUIRE(m.Hold("j", 1, 1));
  m.Release("j", 1, 1, kT0, /*gone=*/true);
  REQUIRE(m.Arrive("j", 1, 2, 0, "h:1", kT0).ok());

  // Epoch 2: rank 1's only call goes away within kMeetingPresence of its
  // ask; rank 0 then waits for it.
  REQUIRE(!m.Arrive("j", 2, 2, 1, "", kT0).ok());
  REQUIRE(m.Hold("j", 2, 1));
  m.Release("j", 2, 1, kT0 + absl::Milliseconds(10), /*gone=*/true);
  auto r0 = m.Arrive("j", 2, 2, 0, "h:2", kT0 + absl::Milliseconds(20));
  CHECK(absl::IsUnavailable(r0.status()));
  CHECK(Message(r0).find("waiting for rank 1") != std::string::npos);
  // Rank 0 is held; rank 1 asks again within kMeetingScan of that look:
  // looked at again, met.
  REQUIRE(m.Hold("j", 2, 0));
  auto r1 = m.Arrive("j", 2, 2, 1, "", kT0 + absl::Milliseconds(30));
  REQUIRE(r1.ok());
  CHECK(*r1 == "h:2");
  // A release for a meeting gone to another epoch, or a rank it does not
  // have, changes nothing.
  m.Release("j", 1, 1, kT0, /*gone=*/true);
  CHECK_FALSE(m.Hold("j", 2, 7));
  CHECK_FALSE(m.Hold("j", 1, 0));
  m.Release("j", 2, -1, kT0, /*gone=*/true);
  m.Release("j", 2, 0, kT0, /*gone=*/false);
  CHECK(m.Arrive("j", 2, 2, 0, "h:2", kT0 + absl::Seconds(1)).ok());
}

TEST_CASE("a rank holds a few calls at once, no more") {
  Meetings m;
  REQUIRE(!m.Arrive("j", 1, 2, 1, "", kT0).ok());
  for (int i = 0; i < kMeetingHeldPerRank; ++i) CHECK(m.Hold("j", 1, 1));
  CHECK_FALSE(m.Hold("j", 1, 1));
  // One ends: one more may be held.
  m.Release("j", 1, 1, kT0, /*gone=*/false);
  CHECK(m.Hold("j", 1, 1));
}

}  // namespace
}  // namespace ptc
