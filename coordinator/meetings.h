// The meeting of a job's processes under a layout epoch (Rendezvous):
// nobody forms process groups before every rank is there at once. Rank 0
// offers its process-group store's address; each rank asks until every
// rank has been seen within kMeetingPresence, and then gets the address.
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

// A rank not heard from for this long is absent (ranks ask every 50 ms).
inline constexpr absl::Duration kMeetingPresence = absl::Seconds(5);
// Who is absent is looked up over every rank at most this often (a look
// is O(ranks)), and at once when the last rank first arrives.
inline constexpr absl::Duration kMeetingScan = absl::Milliseconds(100);
// How long a rank's call waits at the coordinator for the meeting before
// it is answered UNAVAILABLE (and asks again at once): well within
// kMeetingPresence, so that a waiting rank stays present.
inline constexpr absl::Duration kMeetingHold = absl::Seconds(1);
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
  // Drops the job's meeting (the job was forgotten).
  void Forget(const std::string& job) { meetings_.erase(job); }

 private:
  struct Meeting {
    int64_t epoch = 0;
    std::string address;  // rank 0's process group store; empty until offered
    std::vector<absl::Time> seen;  // per rank: when it last asked
    int arrived = 0;               // ranks that asked at least once
    bool met = false;              // every rank was there at once
    // Who was absent at the last look over every rank.
    absl::Time scanned = absl::InfinitePast();
    int scanned_arrived = -1;
    int absent_count = 0;
    std::vector<int> absent_shown;  // the first few absent ranks
  };
  std::map<std::string, Meeting> meetings_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_MEETINGS_H_
