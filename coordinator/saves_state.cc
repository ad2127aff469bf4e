#include "coordinator/saves_state.h"

#include <algorithm>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ptc {

int64_t OpenSave(JobTable::Job& job, int64_t step, int max_open, bool* opened) {
  proto::CoordinatorState::Job& s = job.state;
  *opened = false;
  // The other ranks' save of this step in this layout (a hot switch's save
  // of the same step is another version: the target layout's, under the
  // next layout epoch).
  for (const auto& o : s.open_saves()) {
    if (o.step() == step && o.layout_epoch() == s.layout_epoch())
      return o.version();
  }
  if (s.open_saves_size() >= std::max(1, max_open)) {
    // The oldest save in progress is superseded (not a hot switch's:
    // Job::ClearPending reclaims that one).
    auto* open = s.mutable_open_saves();
    auto oldest = std::find_if(open->begin(), open->end(), [&](const auto& o) {
      return o.version() != s.hot_version();
    });
    if (oldest != open->end()) {
      job.saved.erase(oldest->version());
      open->erase(oldest);
      job.PruneKept();
    }
  }
  proto::CoordinatorState::Job::OpenSave* o = s.add_open_saves();
  o->set_version(job.NewVersion());
  o->set_step(step);
  o->set_layout_epoch(s.layout_epoch());
  *opened = true;
  return o->version();
}

int64_t OpenHotSave(JobTable::Job& job, int64_t step, double now_unix,
                    bool* opened) {
  proto::CoordinatorState::Job& s = job.state;
  *opened = false;
  if (s.hot_version() != 0) return s.hot_version();
  proto::CoordinatorState::Job::OpenSave* o = s.add_open_saves();
  o->set_version(job.NewVersion());
  o->set_step(step);
  o->set_layout_epoch(s.layout_epoch() + 1);
  s.set_hot_version(o->version());
  // The switch gets its own save timeout from now.
  s.set_pending_unix(now_unix);
  *opened = true;
  return o->version();
}

bool SaveIsForChange(JobTable::Job& job, int64_t serial, int64_t version) {
  proto::CoordinatorState::Job& s = job.state;
  if (serial == 0 || !s.has_pending() || s.pending_serial() != serial)
    return false;
  // Already waiting for this save or an older one (a change through the
  // store waits for any save newer than the committed version).
  if (s.pending_after_version() < version) return false;
  s.set_pending_after_version(version - 1);
  return true;
}

absl::StatusOr<SaveReport> ReportSave(JobTable::Job& job, int64_t version,
                                      int32_t rank, bool hot) {
  const proto::CoordinatorState::Job& s = job.state;
  auto open =
      std::find_if(s.open_saves().begin(), s.open_saves().end(),
                   [&](const auto& o) { return o.version() == version; });
  if (open == s.open_saves().end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " of job '", s.job(),
                     "' is not a save in progress (committed version ",
                     s.committed_version(),
                     "); a save writes into the version BeginSave gives it"));
  }
  if (job.committing_save) {
    return absl::UnavailableError(absl::StrCat(
        "job '", s.job(), "' is committing another save; report again"));
  }
  std::set<int32_t>& ranks = job.saved[version];
  ranks.insert(rank);
  const int32_t expected =
      hot ? s.pending().placement().rank_hosts_size() : job.ranks;
  SaveReport report;
  report.complete = static_cast<int32_t>(ranks.size()) >= expected;
  report.step = open->step();
  return report;
}

std::vector<int64_t> CommitSave(JobTable::Job& job, int64_t version,
                                int64_t step) {
  proto::CoordinatorState::Job& s = job.state;
  std::vector<int64_t> superseded;
  const int64_t previous = s.committed_version();
  s.set_committed_version(version);
  s.set_committed_step(step);
  s.clear_lost_hosts();
  // A pending hot switch's save stays open: it is of the next layout, and
  // the switch goes on (or ClearPending drops it).
  const int64_t hot = s.hot_version();
  auto* open = s.mutable_open_saves();
  for (const auto& o : *open)
    if (o.version() < version && o.version() != hot)
      superseded.push_back(o.version());
  open->erase(std::remove_if(open->begin(), open->end(),
                             [&](const auto& o) {
                               return o.version() <= version &&
                                      o.version() != hot;
                             }),
              open->end());
  for (auto it = job.saved.begin();
       it != job.saved.end() && it->first <= version;) {
    it = it->first == hot ? std::next(it) : job.saved.erase(it);
  }
  if (previous > 0) superseded.push_back(previous);
  job.PruneKept();
  return superseded;
}

std::vector<int64_t> DropSave(JobTable::Job& job, int64_t version) {
  // Its ranks that reported it wait for it to commit: told it never will.
  job.state.set_dropped_save(std::max(job.state.dropped_save(), version));
  auto* open = job.state.mutable_open_saves();
  job.saved.erase(version);
  open->erase(
      std::remove_if(open->begin(), open->end(),
                     [&](const auto& o) { return o.version() == version; }),
      open->end());
  job.PruneKept();
  return {version};
}

}  // namespace ptc
