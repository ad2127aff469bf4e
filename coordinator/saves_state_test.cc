#include "coordinator/saves_state.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

// A job of 2 ranks at committed version 3, layout epoch 2.
std::unique_ptr<JobTable::Job> NewJob() {
  auto job = std::make_unique<JobTable::Job>();
  job->state.set_job("j");
  job->state.set_committed_version(3);
  job->state.set_next_version(4);
  job->state.set_layout_epoch(2);
  job->state.add_lost_hosts("b");
  job->ranks = 2;
  return job;
}

TEST_CASE("a save: opened once per step, reported by every rank, committed") {
  auto owned = NewJob();
  JobTable::Job& job = *owned;
  bool opened = false;
  const int64_t v = OpenSave(job, 100, 8, &opened);
  CHECK(opened);
  CHECK(v == 4);
  CHECK(OpenSave(job, 100, 8, &opened) == v);  // the other rank's BeginSave
  CHECK_FALSE(opened);

  auto first = ReportSave(job, v, 0, false);
  REQUIRE(first.ok());
  CHECK_FALSE(first->complete);
  auto again = ReportSave(job, v, 0, false);  // a retried report counts once
  REQUIRE(again.ok());
  CHECK_FALSE(again->complete);
  auto last = ReportSave(job, v, 1, false);
  REQUIRE(last.ok());
  CHECK(last->complete);
  CHECK(last->step == 100);

  const int64_t older = OpenSave(job, 90, 8, &opened);  // a straggler's
  CHECK(older == 5);
  // Committing 4 supersedes the committed 3; 5 is newer and stays open.
  CHECK(CommitSave(job, v, 100) == std::vector<int64_t>{3});
  CHECK(job.state.committed_version() == 4);
  CHECK(job.state.committed_step() == 100);
  CHECK(job.state.lost_hosts().empty());
  REQUIRE(job.state.open_saves_size() == 1);
  CHECK(job.state.open_saves(0).version() == 5);
  CHECK(job.saved.count(v) == 0);

  // A report of what is no longer open.
  auto stale = ReportSave(job, v, 0, false);
  CHECK(stale.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(
      std::string(stale.status().message()).find("is not a save in progress") !=
      std::string::npos);
}

TEST_CASE(
    "saves beyond the open limit supersede the oldest; a failed one goes") {
  auto owned = NewJob();
  JobTable::Job& job = *owned;
  bool opened = false;
  const int64_t a = OpenSave(job, 1, 2, &opened);
  const int64_t b = OpenSave(job, 2, 2, &opened);
  REQUIRE(ReportSave(job, a, 0, false).ok());
  const int64_t c = OpenSave(job, 3, 2, &opened);
  REQUIRE(job.state.open_saves_size() == 2);
  CHECK(job.state.open_saves(0).version() == b);
  CHECK(job.state.open_saves(1).version() == c);
  CHECK(job.saved.count(a) == 0);

  job.committing_save = true;
  CHECK(ReportSave(job, b, 0, false).status().code() ==
        absl::StatusCode::kUnavailable);
  job.committing_save = false;

  CHECK(job.state.dropped_save() == 0);
  CHECK(DropSave(job, b) == std::vector<int64_t>{b});
  REQUIRE(job.state.open_saves_size() == 1);
  CHECK(job.state.committed_version() == 3);  // untouched
  // The job's processes are told, and the newest dropped one stays told.
  CHECK(job.state.dropped_save() == b);
  CHECK(DropSave(job, a) == std::vector<int64_t>{a});
  CHECK(job.state.dropped_save() == b);
  // Saving the step again opens a new version (the dropped one is gone).
  const int64_t again = OpenSave(job, 2, 2, &opened);
  CHECK(opened);
  CHECK(again > c);
}

TEST_CASE("a hot switch's save: one version for the target's ranks") {
  auto owned = NewJob();
  JobTable::Job& job = *owned;
  auto* pending = job.state.mutable_pending();
  pending->set_to("tp=1,pp=1,dp=3");
  for (const char* h : {"a", "a", "b"})
    pending->mutable_placement()->add_rank_hosts(h);
  bool opened = false;
  const int64_t v = OpenHotSave(job, 50, 1234.5, &opened);
  CHECK(opened);
  CHECK(job.state.hot_version() == v);
  CHECK(job.state.pending_unix() == 1234.5);
  CHECK(job.state.open_saves(0).layout_epoch() == 3);  // the next epoch's
  CHECK(OpenHotSave(job, 50, 2000, &opened) == v);
  CHECK_FALSE(opened);
  // The open limit never supersedes it.
  OpenSave(job, 60, 1, &opened);
  CHECK(job.state.open_saves(0).version() == v);

  for (int32_t r = 0; r < 2; ++r) {
    auto report = ReportSave(job, v, r, true);
    REQUIRE(report.ok());
    CHECK_FALSE(report->complete);  // 3 target ranks, not the job's 2
  }
  auto report = ReportSave(job, v, 2, true);
  REQUIRE(report.ok());
  CHECK(report->complete);
}

TEST_CASE(
    "a save the ranks make for a pending hot switch, and one that is not") {
  auto owned = NewJob();
  JobTable::Job& job = *owned;
  proto::CoordinatorState::Job& s = job.state;
  s.mutable_pending()->set_to("tp=1,pp=1,dp=2");
  s.mutable_pending()->set_hot(true);
  s.set_pending_serial(7);
  s.set_pending_after_version(kAwaitingOwnSave);
  bool opened = false;
  // The switch began: its save is open under the next epoch.
  const int64_t hot = OpenHotSave(job, 40, 1000, &opened);
  REQUIRE(ReportSave(job, hot, 0, true).ok());

  // A periodic save, not for the change: it commits, the switch stays.
  const int64_t periodic = OpenSave(job, 41, 8, &opened);
  CHECK_FALSE(SaveIsForChange(job, 0, periodic));
  CHECK_FALSE(SaveIsForChange(job, 6, periodic));  // a serial no longer pending
  CHECK(s.pending_after_version() == kAwaitingOwnSave);
  CommitSave(job, periodic, 41);
  CHECK(s.committed_version() == periodic);
  // The switch's save is still open and keeps its report.
  REQUIRE(s.open_saves_size() == 1);
  CHECK(s.open_saves(0).version() == hot);
  CHECK(job.saved.count(hot) == 1);

  // The switch did not start on every process: they save for it.
  const int64_t own = OpenSave(job, 42, 8, &opened);
  CHECK(SaveIsForChange(job, 7, own));
  CHECK(s.pending_after_version() == own - 1);
  CHECK_FALSE(SaveIsForChange(job, 7, own));  // the other rank's BeginSave
  const int64_t later = OpenSave(job, 43, 8, &opened);
  CHECK_FALSE(SaveIsForChange(job, 7, later));  // already waits for `own`
  CHECK(s.pending_after_version() == own - 1);

  // A change through the store waits for any save newer than the committed.
  s.mutable_pending()->set_hot(false);
  s.set_pending_after_version(s.committed_version());
  CHECK_FALSE(SaveIsForChange(job, 7, later));
  job.ClearPending();
  CHECK_FALSE(SaveIsForChange(job, 7, later));  // nothing pending
}

}  // namespace
}  // namespace ptc
