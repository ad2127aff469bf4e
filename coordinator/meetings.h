// The meeting of a job's processes under a layout epoch (Rendezvous):
// nobody forms process groups before every rank is there at once. Rank 0
// offers its process-group store's address; each rank asks until every
// rank is there at once (its call held at the coordinator, or asked within
// kMeetingPresence), and then gets the address.
// A process that died (or never started) would otherwise hold the others
// in their groups' connect until its timeout, unable to see the change
// its death starts; here they wait answering UNAVAILABLE, and the change
// ends the epoch.
//
// Pure (the time comes in) and not persisted: after a failover the ranks
// ask the new leader and meet again. Not thread-safe: the coordinator
// calls it under its lock.
//
//   Meetings meetings;
//   auto address = meetings.Arrive("j", epoch, ranks, rank, offered, now);
//   if (absl::IsUnavailable(address.status())) ... retry shortly
#ifndef PTC_COORDINATOR_MEETINGS_H_
#define PTC_COORDINATOR_MEETINGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ptc {

// A rank whose call is not held, not heard from for this long, is absent.
inline constexpr absl::Duration kMeetingPresence = absl::Seconds(5);
// Who is absent is looked up over every rank at most this often (a look
// is O(ranks)), and at once when the last rank first arrives.
inline constexpr absl::Duration kMeetingScan = absl::Milliseconds(100);
// How long a rank's call waits at the coordinator for the meeting before
// it is answered UNAVAILABLE (and asks again at once): as long as its
// deadline leaves room for the answer, within these bounds. While held the
// rank is present; a call that ends without its answer (the process went
// away, its connection was lost) leaves it absent at once. So a waiting
// rank asks about once per kMeetingHoldMost, not once a second: 16,384
// waiting processes are 16,384 calls held, not 16,384 calls a second.
inline constexpr absl::Duration kMeetingHoldLeast = absl::Seconds(1);
inline constexpr absl::Duration kMeetingHoldMost = absl::Seconds(20);
// Calls of one rank held at once, at most: its process's, and one it gave
// up on whose end the coordinator has not seen yet. Beyond, a call is
// answered at once, so that one client cannot fill the coordinator with
// held calls of a rank.
inline constexpr int kMeetingHeldPerRank = 4;
// How many absent ranks an answer names.
inline constexpr size_t kMeetingAbsentShown = 8;

class Meetings {
 public:
  // Rank `rank` of the job's `ranks` (checked by the caller) asks at `now`
  // under layout `epoch`; rank 0 passes the address it offers, the others
  // an empty one. A new epoch (or rank count) starts a new meeting.
  // Returns rank 0's address once every rank was there at once (and from
  // then on, to late askers of the epoch); UNAVAILABLE until then, naming
  // up to kMeetingAbsentShown ranks it waits for.
  absl::StatusOr<std::string> Arrive(const std::string& job, int64_t epoch,
                                     int32_t ranks, int32_t rank,
                                     const std::string& offered,
                                     absl::Time now);
  // Rank `rank`'s call under `epoch` is held (Arrive answered UNAVAILABLE
  // and the call waits): present until Release. False (nothing held) if
  // the rank has kMeetingHeldPerRank calls held already, or the meeting is
  // not under `epoch`.
  bool Hold(const std::string& job, int64_t epoch, int32_t rank);
  // Its held call ended at `now`: answered (present as of `now`, as any
  // ask) or `gone` (cancelled: the process or its connection went away;
  // absent at once). Nothing if the meeting moved on to another epoch.
  void Release(const std::string& job, int64_t epoch, int32_t rank,
               absl::Time now, bool gone);
  // Drops the job's meeting (the job was forgotten).
  void Forget(const std::string& job) { meetings_.erase(job); }

 private:
  struct Meeting {
    int64_t epoch = 0;
    std::string address;  // rank 0's process group store; empty until offered
    // Per rank: when it last asked (InfinitePast before it did, or once
    // its held call went away), and its calls held now (present).
    std::vector<absl::Time> seen;
    std::vector<int> held;
    std::vector<bool> here;        // per rank: asked at least once
    int arrived = 0;               // ranks that asked at least once
    bool met = false;              // every rank was there at once
    // Who was absent at the last look over every rank.
    absl::Time scanned = absl::InfinitePast();
    int scanned_arrived = -1;
    int absent_count = 0;
    std::vector<int> absent_shown;  // the first few absent ranks
  };
  // The job's meeting under `epoch` with a rank `rank`, or null.
  Meeting* Find(const std::string& job, int64_t epoch, int32_t rank);
  std::map<std::string, Meeting> meetings_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_MEETINGS_H_
