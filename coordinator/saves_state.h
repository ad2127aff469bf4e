// The saves of a job: the transitions of its record that saves make, pure
// (no lock, no hosts, no store). A save is opened by its ranks' BeginSave
// (one version per step and layout epoch, from the job's one counter:
// rule 1), collects their reports, and once every rank reported, the
// coordinator proves it on the hosts (rule 4) and commits it here, or
// drops it. The caller persists the record after a transition that
// changed it, and releases the versions a transition returns.
//
//   bool opened = false;
//   int64_t v = OpenSave(job, step, options.max_open_saves, &opened);
//   if (opened) PTC_RETURN_IF_ERROR(PersistLocked());
//   ...
//   PTC_ASSIGN_OR_RETURN(SaveReport r, ReportSave(job, v, rank, false));
//   if (r.complete) ... prove on the hosts, then CommitSave or DropSave
#ifndef PTC_COORDINATOR_SAVES_STATE_H_
#define PTC_COORDINATOR_SAVES_STATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_table.h"

namespace ptc {

// The version a rank saves `step` into under the job's layout: the one its
// other ranks' BeginSave opened, or a new one (`*opened`). Beyond
// `max_open` open saves the oldest (not a hot switch's) is superseded:
// nothing owns its version any more, and the hosts' heartbeats reclaim it.
int64_t OpenSave(JobTable::Job& job, int64_t step, int max_open, bool* opened);

// The same for a hot switch's save (the job's pending change, saved by its
// target's processes): one version for every target rank, under the next
// layout epoch; opening it restarts the switch's save timeout at `now_unix`.
int64_t OpenHotSave(JobTable::Job& job, int64_t step, double now_unix,
                    bool* opened);

// A pending hot switch waits for this save (its pending_after_version)
// until its processes begin a save for it in their layout (the switch did
// not start on every process): no periodic save turns it into a change
// through the store.
inline constexpr int64_t kAwaitingOwnSave = INT64_MAX;

// The ranks began saving `version` for the pending change of serial
// `serial` (BeginSaveRequest.change_serial): a pending hot switch of that
// serial starts through the store once `version` commits. True if the
// record changed (persist it); a serial no longer pending changes nothing.
bool SaveIsForChange(JobTable::Job& job, int64_t serial, int64_t version);

struct SaveReport {
  bool complete = false;  // every rank of the save reported it
  int64_t step = 0;       // the save's training step
};
// Rank `rank` reports that it saved `version` (a hot switch's save if
// `hot`). FAILED_PRECONDITION when the version is not a save in progress;
// UNAVAILABLE while another save of the job is being committed (report
// again).
absl::StatusOr<SaveReport> ReportSave(JobTable::Job& job, int64_t version,
                                      int32_t rank, bool hot);

// The save of `version` (a regular one, proven on every host) becomes the
// committed version: older open saves and the previous committed version
// are superseded (returned, to release), lost hosts are cleared (every
// host of the placement proved its share).
std::vector<int64_t> CommitSave(JobTable::Job& job, int64_t version,
                                int64_t step);

// The save of `version` failed (its hosts could not prove it, or a rank
// gave it up): it is no longer open, its version goes (returned, to
// release), and the job's dropped_save says so to its processes.
std::vector<int64_t> DropSave(JobTable::Job& job, int64_t version);

}  // namespace ptc

#endif  // PTC_COORDINATOR_SAVES_STATE_H_
