#include "coordinator/meetings.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {

absl::StatusOr<std::string> Meetings::Arrive(const std::string& job,
                                             int64_t epoch, int32_t ranks,
                                             int32_t rank,
                                             const std::string& offered,
                                             absl::Time now) {
  Meeting& meet = meetings_[job];
  if (meet.epoch != epoch || meet.seen.size() != static_cast<size_t>(ranks)) {
    meet = Meeting{};
    meet.epoch = epoch;
    meet.seen.assign(ranks, absl::InfinitePast());
    meet.held.assign(ranks, 0);
    meet.here.assign(ranks, false);
  }
  if (rank == 0) meet.address = offered;
  // A rank back after it was absent (its call went away, or it was silent
  // too long): the last look counted it absent, and a held call is not
  // asked again until its hold ends, so look again now.
  if (meet.here[rank] && meet.held[rank] == 0 &&
      now - meet.seen[rank] > kMeetingPresence)
    meet.scanned = absl::InfinitePast();
  if (!meet.here[rank]) {
    meet.here[rank] = true;
    ++meet.arrived;
  }
  meet.seen[rank] = now;
  if (meet.met) return meet.address;
  if (meet.address.empty()) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 of layout epoch ", epoch,
                     " has not offered its address yet; retry"));
  }
  const bool all_arrived = meet.arrived == ranks;
  if (now - meet.scanned >= kMeetingScan ||
      (all_arrived && meet.scanned_arrived < ranks)) {
    meet.scanned = now;
    meet.scanned_arrived = meet.arrived;
    meet.absent_count = 0;
    meet.absent_shown.clear();
    for (int r = 0; r < ranks; ++r) {
      if (meet.held[r] > 0 || now - meet.seen[r] <= kMeetingPresence) continue;
      ++meet.absent_count;
      if (meet.absent_shown.size() < kMeetingAbsentShown)
        meet.absent_shown.push_back(r);
    }
  }
  if (!all_arrived || meet.absent_count > 0) {
    const int absent = std::max(meet.absent_count, 1);
    return absl::UnavailableError(absl::StrCat(
        ranks - absent, " of the ", ranks, " ranks of layout epoch ", epoch,
        " are here; waiting for rank",
        meet.absent_shown.size() > 1 ? "s " : " ",
        absl::StrJoin(meet.absent_shown, ", "),
        static_cast<size_t>(absent) > meet.absent_shown.size() ? ", ..." : "",
        "; retry"));
  }
  meet.met = true;
  return meet.address;
}

Meetings::Meeting* Meetings::Find(const std::string& job, int64_t epoch,
                                  int32_t rank) {
  auto it = meetings_.find(job);
  if (it == meetings_.end() || it->second.epoch != epoch || rank < 0 ||
      static_cast<size_t>(rank) >= it->second.seen.size())
    return nullptr;
  return &it->second;
}

bool Meetings::Hold(const std::string& job, int64_t epoch, int32_t rank) {
  Meeting* meet = Find(job, epoch, rank);
  if (meet == nullptr || meet->held[rank] >= kMeetingHeldPerRank) return false;
  ++meet->held[rank];
  return true;
}

void Meetings::Release(const std::string& job, int64_t epoch, int32_t rank,
                       absl::Time now, bool gone) {
  Meeting* meet = Find(job, epoch, rank);
  if (meet == nullptr || meet->held[rank] == 0) return;
  // Another call of the rank still held keeps it present.
  if (--meet->held[rank] > 0) return;
  meet->seen[rank] = gone ? absl::InfinitePast() : now;
  // Counted absent at the next look, not up to kMeetingScan later.
  if (gone) meet->scanned = absl::InfinitePast();
}

}  // namespace ptc
