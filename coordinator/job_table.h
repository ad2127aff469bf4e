// The coordinator's job table: every registered job's durable record (its
// registration, versions, open saves, placement and change in flight:
// proto::CoordinatorState::Job, the record "jobs/NAME"), what the
// coordinator derives from it (ranks, spec, store bytes per host), what
// lives only in memory (reported saves, the last event, the worker of the
// change in flight), and the plan epochs of forgotten jobs (the record
// "cluster"), so that a job registered again under the same name never
// reuses an epoch a host may still hold staged bytes of.
//
// It owns that state and its persistence: Writes() says which records
// changed since the last transaction, Persisted() is told once it
// committed. Not thread-safe: the coordinator calls it under its lock.
//
//   JobTable jobs;
//   PTC_RETURN_IF_ERROR(jobs.Load(records, legacy, "etcd ..."));
//   JobTable::Job* job = jobs.Find("j");           // null if unknown
//   PTC_ASSIGN_OR_RETURN(JobTable::Job* known, jobs.Known("j"));
//   for (auto& [name, job] : jobs) ...
#ifndef PTC_COORDINATOR_JOB_TABLE_H_
#define PTC_COORDINATOR_JOB_TABLE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/control_store.h"
#include "coordinator/kept_small_objects.h"
#include "proto/coordinator.pb.h"
#include "ptc/layout_cache.h"
#include "ptc/model_spec.h"

namespace ptc {

// The spec of a job as its record or a registration gives it: a layout
// spec, or a built-in model's name (not both).
absl::StatusOr<std::shared_ptr<const ModelSpec>> JobSpec(
    const std::string& model, const proto::LayoutSpec* layout);
// Ranks and state bytes of a job running `config`, or why it cannot run.
absl::StatusOr<std::pair<int32_t, int64_t>> JobShape(const ModelSpec& spec,
                                                     const std::string& config);
// Store bytes per host name of `config` placed on `rank_hosts` (empty if
// either is missing); the layout from `layouts` (null: built here).
std::map<std::string, int64_t> HostBytesOf(
    const std::shared_ptr<const ModelSpec>& spec, LayoutCache* layouts,
    const std::string& config,
    const google::protobuf::RepeatedPtrField<std::string>& rank_hosts);

class JobTable {
 public:
  struct Job {
    proto::CoordinatorState::Job state;  // the durable record
    // Open save's version -> ranks that reported it (not persisted: after a
    // restart the ranks report again or a later save supersedes it).
    std::map<int64_t, std::set<int32_t>> saved;
    proto::ReconfigureEvent event;  // in flight or last
    // Ended changes before `event`, newest first (ArchiveEvent).
    std::deque<proto::ReconfigureEvent> history;
    // A save's commit is asking the hosts (no change may start meanwhile).
    bool committing_save = false;
    // Why the change in flight was cancelled by the coordinator itself
    // (a host went silent); empty if by request.
    std::string cancel_reason;
    std::atomic<bool> cancel{false};
    std::thread worker;
    bool running = false;  // the worker has not finished RunFlight yet
    int32_t ranks = 0;
    int64_t state_bytes = 0;
    // The job's layout spec (registered, or generated for its built-in
    // model); never null once the job is known.
    std::shared_ptr<const ModelSpec> spec;
    // Store bytes the committed version and the change in flight's target
    // take on each host, by name (what other jobs' placements must leave).
    std::map<std::string, int64_t> host_bytes, target_host_bytes;
    // Copies of small objects with no copy on a second host, by version
    // (kept_small_objects.h); of versions the job owns only (PruneKept).
    // The committed version's are persisted too (records "kept/...").
    std::map<int64_t, std::shared_ptr<KeptSmallObjects>> kept;
    // The plan of the layout saved last (most saves share it).
    std::shared_ptr<const KeepPlan> keep_plan;

    // Computes ranks, state bytes and store bytes per host from the
    // record (a loaded one).
    void Derive();
    // A new version number of the job (rule 1): one counter for saves and
    // changes, above every number it has used.
    int64_t NewVersion();
    // Whether the job owns `version` (rule 6): its committed version, its
    // change's target, an open save, or a number not handed out yet.
    bool OwnsVersion(int64_t version) const;
    // Whether its record names `host` (its hosts, a change's targets, lost
    // hosts).
    bool Names(const std::string& host) const;
    // What ListJobs shows of the job's record (its ranks' placement and
    // survival aside, which need the hosts), with its layout spec if
    // `include_layout`.
    void Describe(bool include_layout, proto::JobStatus* status) const;
    // Of Describe, what does not grow with the job (ListJobsRequest.brief):
    // the change in flight without its plan and its hosts' progress.
    void Brief(bool include_layout, proto::JobStatus* status) const;
    // Before `event` is replaced by a new change's: keeps it in `history`
    // (at most kHistory, without its plan's flows and placement) if it
    // ended and is not kept already.
    void ArchiveEvent();
    static constexpr size_t kHistory = 8;
    // Clears the pending change, and the hot switch's save if its
    // processes began one (its version is reclaimed).
    void ClearPending();
    // Forgets the kept copies of versions the job no longer owns.
    void PruneKept();
    // The ranks its record places on `host`, in rank order (what each of
    // its processes asks: ListJobsRequest.brief with a host), or null if
    // the record does not place every rank (RankPlacementLocked derives
    // them then). From an index built once per placement, not a scan of
    // every rank per question: 16,384 processes asking after a change of
    // a 16,384-rank job were 16,384 scans of 16,384 host names under the
    // coordinator's lock.
    const std::vector<int32_t>* RanksOn(const std::string& host);

   private:
    // RanksOn's index, of the record's rank_hosts when the layout epoch
    // and the number of ranks were `indexed_epoch_` and `indexed_ranks_`:
    // a record's placement changes only with its epoch (a registration
    // starts at 1, a commit adds 1; Derive, after a load, drops the
    // index). An answer whose ranks are no longer all on its host is
    // indexed again as well.
    std::map<std::string, std::vector<int32_t>, std::less<>> ranks_on_;
    int64_t indexed_epoch_ = -1;
    int indexed_ranks_ = -1;
  };
  using Jobs = std::map<std::string, std::unique_ptr<Job>>;

  // The job, or null if unknown.
  Job* Find(const std::string& name);
  const Job* Find(const std::string& name) const;
  // The job, or NOT_FOUND ("job 'x' is unknown").
  absl::StatusOr<Job*> Known(const std::string& name);

  Jobs::iterator begin() { return jobs_.begin(); }
  Jobs::iterator end() { return jobs_.end(); }
  Jobs::const_iterator begin() const { return jobs_.begin(); }
  Jobs::const_iterator end() const { return jobs_.end(); }
  size_t size() const { return jobs_.size(); }
  // Whether any job's record names `host`.
  bool NameHost(const std::string& host) const;

  // Registration: adds `job` (its record's name must be new; continues its
  // plan epochs after those of a forgotten job of the same name).
  Job& Add(std::unique_ptr<Job> job);
  // Undoes an Add whose registration could not be persisted.
  void Discard(const std::string& name) { jobs_.erase(name); }
  // Forgetting: removes the job and retires its plan epochs. Put() undoes
  // it (the removal could not be persisted): the job comes back and its
  // epochs are retired as they were.
  std::unique_ptr<Job> Remove(const std::string& name);
  void Put(std::unique_ptr<Job> job);
  // Jobs whose bytes ForgetJob is deleting on the hosts: not registered
  // again until it ends (the deletes would take the new job's saves).
  bool Forgetting(const std::string& name) const {
    return forgetting_.count(name) > 0;
  }
  void BeginForget(const std::string& name) { forgetting_.insert(name); }
  void EndForget(const std::string& name) { forgetting_.erase(name); }

  // Persistence. Load takes the job records ("jobs/NAME"), the cluster
  // record and jobs inside it (from coordinators before per-job records:
  // moved into records of their own by the next write), and the kept
  // copies of each job's committed version (records of other versions, or
  // an incomplete or unreadable set, are deleted by the next write: the
  // copies are kept again from the job's next save). DATA_LOSS names a
  // record that is not a job's; FAILED_PRECONDITION a job whose layout
  // this coordinator cannot read (rather than drop it on the next write).
  absl::Status Load(const std::map<std::string, std::string>& records,
                    const std::string& where);
  struct Records {
    // Per job, its record ("jobs/NAME") and its placement's
    // ("layouts/NAME").
    std::map<std::string, std::string> jobs, layouts;
    std::string cluster;
    // Per job, the records of its committed version's kept copies and
    // the copies' stamp (KeptSmallObjects::stamp) they hold.
    struct Kept {
      uint64_t stamp = 0;
      std::vector<std::string> keys;
    };
    std::map<std::string, Kept> kept;
    // Kept records of no job's committed version (deleted next).
    std::vector<std::string> stale_kept;
  };
  // Adds to `writes` the records that changed since Persisted (new or
  // changed jobs, deletes for forgotten ones, the cluster record, each
  // job's committed version's kept copies when they changed, deletes for
  // the kept copies of versions no longer committed) and returns what the
  // records hold after them, for Persisted.
  Records Writes(ControlStore::Writes* writes) const;
  void Persisted(Records records) { persisted_ = std::move(records); }
  // After a write that failed part way (CommitRecords): `written` holds the
  // records that did commit, as the store holds them now. The next Writes
  // compares with them, so that it writes back what the store holds and
  // the table does not (a change undone in memory), and the rest.
  void PartlyPersisted(const ControlStore::Writes& written);

 private:
  // Load's part for the records "kept/...".
  void LoadKept(const std::map<std::string, std::string>& records);

  Jobs jobs_;
  // CoordinatorState.retired_epochs: the last plan epoch of each
  // forgotten job.
  std::map<std::string, int64_t> retired_epochs_;
  // Each job's retired epoch before Remove, for Put.
  std::map<std::string, int64_t> retired_before_;
  std::set<std::string> forgetting_;
  Records persisted_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_JOB_TABLE_H_
