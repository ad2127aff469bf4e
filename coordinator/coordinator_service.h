// ptc-coordinator's service (proto/coordinator.proto): the registries of
// hosts and jobs, commits of saved versions, reconfigurations driven to an
// atomic commit (reconfigure_driver.h), and dead-host detection.
//
// Durability: every change of the metadata is written to the control
// store (control_store.h: the state directory, or etcd) as one
// transaction before it is acknowledged. A reconfiguration records
// its target before it starts and its commit decision (once fingerprints
// are proven) before any host commits. A coordinator that restarts with a
// reconfiguration on disk finishes the commit if it was decided, and aborts
// the staged version otherwise: afterwards the job is at exactly v or v+1
// on every host.
//
// The rules that keep a job's state (docs/consistency.md has them for
// users; each is enforced where the comment names it):
//  1. Version numbers are the coordinator's: a save gets its version from
//     BeginSave, a change its target at Reconfigure, from one counter per
//     job (state.next_version); the training step is metadata. A save and
//     a change never share a number.
//  2. A job's layout has an epoch (state.layout_epoch: 1 at registration,
//     +1 when a change commits). BeginSave and ReportSaved carry the epoch
//     the rank computed its regions under; a stale one is refused.
//  3. On a host, a save's version is written only by saves, a staged
//     version only by its own plan epoch (Store::CreateStaged). An abort
//     deletes only staged versions of its epoch or older, never a save's.
//  4. A save commits when every rank reported it and every host of the
//     placement proves that it holds all of the version's regions and small
//     objects (sealing it there); replicas on different hosts must have
//     equal checksums. Otherwise the save fails and its version is deleted.
//  5. A change commits once its fingerprints are proven and the decision
//     is durable. Before the decision, a target or source host that goes
//     silent aborts it (the abort skips hosts that are dead); after it,
//     the commit finishes on the live targets, and dead targets become
//     lost hosts of the new version.
//  6. Hosts list their versions in every heartbeat; whatever is neither
//     the committed version, an open save of the current layout, nor the
//     target of the change in flight is reclaimed.
//  7. A host declared dead that returns as the same process is a source
//     again once it proves it holds its share of the committed version; a
//     new process (or a failed proof) leaves it lost.
//
// State: the handlers work over managers that each own a part of it and,
// where it is durable, its records: the host registry (host_registry.h),
// the job table (job_table.h; each job's change in flight moves through
// flight.h's transitions, its saves through saves_state.h's), automatic
// changes (auto_changes.h), the meetings of a job's processes
// (meetings.h). PersistLocked writes what they changed as one
// transaction. Effects on the hosts are carried out by the drivers
// (reconfigure_driver.h, snapshot_writer.h) outside the lock.
//
// Threads: gRPC handler threads (Watch streams hold none: watchers.h);
// one worker thread per reconfiguration in flight; one monitor thread (heartbeat deadlines, retries of decided
// commits); one prover (proofs of returned hosts); the snapshotter and the
// auto loop. All state is guarded by mu_; no RPC
// to a ptcd is made while holding it.
#ifndef PTC_COORDINATOR_COORDINATOR_SERVICE_H_
#define PTC_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/auto_changes.h"
#include "coordinator/control_store.h"
#include "coordinator/flight.h"
#include "coordinator/host_probes.h"
#include "coordinator/host_registry.h"
#include "coordinator/job_table.h"
#include "coordinator/kept_small_objects.h"
#include "coordinator/meetings.h"
#include "coordinator/save_proof.h"
#include "coordinator/watchers.h"
#include "plan/plan.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/snapshot.pb.h"
#include "ptc/layout.h"
#include "ptc/layout_cache.h"
#include "ptc/model_spec.h"
#include "tensor_store/store_client.h"

namespace ptc {

struct CoordinatorOptions {
  // The local state directory (created if missing, and it must be
  // writable), where the durable control state lives unless `store` (a
  // control_store.h implementation, e.g. etcd) is given.
  std::string state_dir;
  std::shared_ptr<ControlStore> store;
  // A host that has not sent a heartbeat for this long is dead.
  absl::Duration host_timeout = absl::Seconds(5);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Beyond this many heartbeats a second from all hosts together, the
  // interval and the timeout stretch with the cluster (HostRegistry::Cadence).
  double max_heartbeats_per_second = 500;
  // A host dead this long that no job names is removed from the registry.
  absl::Duration host_expiry = absl::Hours(24);
  // Most saves of a job open at once (steps begun, not yet committed); a
  // new one beyond this supersedes the oldest.
  int max_open_saves = 8;
};

// A host's registration, checked field by field: a name of 1 to 253
// letters, digits, '.', '-' or '_'; a HOST:PORT address; 1 to
// kMaxGpusPerHost GPUs; a bandwidth from 0 (the default) to
// kMaxHostBandwidth; memory >= 0. INVALID_ARGUMENT names the field.
absl::Status ValidateHost(const proto::HostStatus& h);

// An automatic-change policy, checked field by field (a pinned config
// must run the spec); INVALID_ARGUMENT names the field.
absl::Status ValidateAutoPolicy(const proto::AutoPolicy& policy,
                                const ModelSpec& spec);

// A stream's heartbeats marked answer_when_needed are answered at least
// this often (and whenever the answer says something): within the 10 s
// after which a host's channel to the coordinator, having read nothing,
// pings it (kPatientKeepaliveTimeMs; any frame read puts the ping off).
// Answered less often, every host's connection would cost the coordinator
// a ping and its answer every 10 s instead.
inline constexpr absl::Duration kHeartbeatAnswerEvery = absl::Seconds(8);

// Whether a heartbeat that came on a stream is answered with `resp`: it
// asks for an answer to every beat, or `resp` says something the host
// does not know (known = false, versions to reclaim, an interval other
// than `told_seconds`, the last one written on the stream; 0: none yet),
// or the stream's last answer was written `since_answer` ago, at least
// kHeartbeatAnswerEvery.
bool HeartbeatNeedsAnswer(const proto::HeartbeatRequest& req,
                          const proto::HeartbeatResponse& resp,
                          double told_seconds, absl::Duration since_answer);

// Watch, Rendezvous and Heartbeats are callback methods: no thread waits
// per watcher (watchers.h), per rank waiting for its job's meeting or per
// host's heartbeat stream. (The unary Heartbeat is not: as a callback
// method it cost the coordinator more CPU per call than in the pool, with
// gRPC 1.51 and 512 hosts.)
class CoordinatorService final
    : public proto::Coordinator::WithCallbackMethod_Heartbeats<
          proto::Coordinator::WithCallbackMethod_Rendezvous<
              proto::Coordinator::WithCallbackMethod_Watch<
                  proto::Coordinator::Service>>> {
 public:
  // Loads the state (if any) and settles reconfigurations that were in
  // flight when the previous coordinator stopped.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(
      CoordinatorOptions options);
  ~CoordinatorService() override;

  grpc::Status RegisterHost(grpc::ServerContext*,
                            const proto::RegisterHostRequest*,
                            proto::RegisterHostResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest*,
                         proto::HeartbeatResponse*) override;
  // A host's heartbeats on one stream, each message answered as Heartbeat
  // answers it (those marked answer_when_needed when HeartbeatNeedsAnswer
  // says). At most kMaxHeartbeatStreams at once; beyond them a stream
  // is refused RESOURCE_EXHAUSTED (the host sends Heartbeat calls instead).
  grpc::ServerBidiReactor<proto::HeartbeatRequest, proto::HeartbeatResponse>*
  Heartbeats(grpc::CallbackServerContext* ctx) override;
  static constexpr int kMaxHeartbeatStreams = 1 << 16;
  grpc::Status RegisterJob(grpc::ServerContext*,
                           const proto::RegisterJobRequest*,
                           proto::RegisterJobResponse*) override;
  grpc::Status BeginSave(grpc::ServerContext*, const proto::BeginSaveRequest*,
                         proto::BeginSaveResponse*) override;
  grpc::Status ReportSaved(grpc::ServerContext*,
                           const proto::ReportSavedRequest*,
                           proto::ReportSavedResponse*) override;
  grpc::Status Reconfigure(grpc::ServerContext*,
                           const proto::ReconfigureRequest*,
                           proto::ReconfigureResponse*) override;
  grpc::Status Prepare(grpc::ServerContext*, const proto::ReconfigureRequest*,
                       proto::PrepareResponse*) override;
  grpc::ServerWriteReactor<proto::ReconfigureEvent>* Watch(
      grpc::CallbackServerContext* ctx,
      const proto::WatchRequest* req) override;
  grpc::Status Abort(grpc::ServerContext*, const proto::AbortRequest*,
                     proto::AbortResponse*) override;
  grpc::Status ForgetJob(grpc::ServerContext*, const proto::ForgetJobRequest*,
                         proto::ForgetJobResponse*) override;
  // What the metrics gauges show.
  struct Counts {
    int hosts_alive = 0;
    int hosts_dead = 0;
    int jobs = 0;
    int changes_in_flight = 0;
    // Clients open to ask hosts with late heartbeats directly.
    int probes_open = 0;
    // Rendezvous calls waiting at the coordinator for their job's meeting.
    int meeting_calls_held = 0;
  };
  Counts GetCounts();

  grpc::Status ListHosts(grpc::ServerContext*, const proto::ListHostsRequest*,
                         proto::ListHostsResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const proto::ListJobsRequest*,
                        proto::ListJobsResponse*) override;
  grpc::Status JobToken(grpc::ServerContext*, const proto::JobTokenRequest*,
                        proto::JobTokenResponse*) override;
  // Snapshots (snapshot_rpc.cc).
  grpc::Status Snapshot(grpc::ServerContext* ctx,
                        const proto::SnapshotRequest* req,
                        grpc::ServerWriter<proto::SnapshotEvent>* writer) override;
  grpc::Status Restore(grpc::ServerContext* ctx,
                       const proto::RestoreRequest* req,
                       proto::ReconfigureResponse* resp) override;

  // Automatic changes (auto_rpc.cc).
  grpc::Status Advise(grpc::ServerContext* ctx, const proto::AdviseRequest* req,
                      proto::AdviseResponse* resp) override;
  grpc::Status SetAutoPolicy(grpc::ServerContext* ctx,
                             const proto::SetAutoPolicyRequest* req,
                             proto::SetAutoPolicyResponse* resp) override;
  grpc::Status ChangeHosts(grpc::ServerContext* ctx,
                           const proto::ChangeHostsRequest* req,
                           proto::ChangeHostsResponse* resp) override;
  // A rank's call waits at the coordinator until its job's meeting is
  // met, as long as its deadline allows (meetings.h: kMeetingHoldLeast to
  // kMeetingHoldMost; then UNAVAILABLE: ask again at once).
  grpc::ServerUnaryReactor* Rendezvous(grpc::CallbackServerContext* ctx,
                                       const proto::RendezvousRequest* req,
                                       proto::RendezvousResponse* resp) override;
  grpc::Status ReportProcessExit(grpc::ServerContext* ctx,
                                 const proto::ReportProcessExitRequest* req,
                                 proto::ReportProcessExitResponse* resp) override;
  // What the last restart did with reconfigurations it found in flight,
  // one line per job ("job j: resumed the commit of epoch 3").
  std::vector<std::string> recovery_log() const;

 private:
  using Job = JobTable::Job;
  // A Rendezvous call's reactor: told when the call is cancelled while
  // held (its process or connection went away).
  class RendezvousReactor;
  // A host's stream of heartbeats (Heartbeats).
  class HeartbeatStream;
  // A heartbeat, by call or on a stream, once admitted: the host is alive
  // (or told to register again), and told what to reclaim.
  void Beat(const proto::HeartbeatRequest& req, proto::HeartbeatResponse* resp);
  // Rendezvous calls waiting for their meeting (answered when it is met,
  // or at `until`).
  struct Held {
    grpc::ServerUnaryReactor* reactor;
    proto::RendezvousRequest req;
    proto::RendezvousResponse* resp;
    absl::Time until;
  };
  // The registered hosts as a placement sees them (ids index `names`),
  // with the GPUs and store bytes that jobs other than the one placed use.
  struct Resources {
    std::vector<std::string> names;
    Cluster cluster;
    std::vector<bool> alive;
    // Alive, but heartbeats more than two intervals late (PlanInput::late).
    std::vector<bool> late;
    std::vector<std::vector<int32_t>> taken;
    std::vector<int64_t> memory;
    std::map<int32_t, std::string> addresses;
  };
  struct Flight;
  struct Planned;
  // A snapshot a change reads from: regions no live host holds (a
  // recovery), or everything (a restore).
  struct SnapshotUse {
    std::string dir;
    proto::SnapshotManifest manifest;
    bool restore = false;
  };

  explicit CoordinatorService(CoordinatorOptions options)
      : options_(std::move(options)) {}

  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION if `epoch` is not the job's layout epoch (rule 2).
  absl::Status CheckLayoutEpochLocked(const Job& job, int64_t epoch,
                                      int32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job a rank's save call is for, after the checks both save calls
  // make: a known job, a rank of its layout, its current layout epoch, no
  // change in flight.
  absl::StatusOr<Job*> SavingJobLocked(const std::string& name, int32_t rank,
                                       int64_t layout_epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for a hot switch's save (BeginSaveRequest.pending_serial):
  // the job's pending hot change with that serial, a rank of its target,
  // the layout epoch after the current one.
  absl::StatusOr<Job*> HotSavingJobLocked(const std::string& name,
                                          int32_t rank, int64_t layout_epoch,
                                          int64_t serial)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copies the coordinator keeps of save `version` (a hot switch's
  // when `hot`), made at its first BeginSave with the plan of what its
  // ranks send (kept_small_objects.h).
  KeptSmallObjects& KeptForSaveLocked(Job& job, int64_t version, bool hot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A small object for the coordinator to read and keep: target rank
  // `rank`'s `name`, read as rank `read_rank`'s copy (the source's during
  // a change, the rank's own after it) from the ptcd at `address`.
  struct ToKeep {
    int32_t rank = 0;
    std::string name;
    std::string address;
    int32_t read_rank = 0;
  };
  using ReadCopies = std::map<std::pair<std::string, int32_t>, std::string>;
  // Reads `objects` of `version` of `job`, by (name, target rank): at most
  // 256, 2 s each, 10 s in all, none once `stop` (if given) is true; a
  // host that fails once is not asked again. What was not read is in
  // `not_read` (one line each).
  static ReadCopies ReadSmallObjects(const std::string& job, int64_t version,
                                     const std::vector<ToKeep>& objects,
                                     std::vector<std::string>* not_read,
                                     const std::atomic<bool>* stop = nullptr);
  // Once `flight` is decided: the copies kept of its source version's
  // small objects, as the plan moved them, are the new version's, and so
  // are those read from their sources during the change (`read`).
  // Returns the objects the new version needs kept that neither covered:
  // each as its rank, name and the address of the host that holds it
  // now, for KeepFromHosts.
  std::vector<ToKeep> CarryKeptLocked(Job& job, const Flight& flight,
                                      const ReadCopies& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads `objects` of version `version` from their hosts and keeps them
  // (while the version is the job's committed one), bounded as
  // ReadSmallObjects since the job's next change waits for this. One that
  // is not read is kept from the next save.
  void KeepFromHosts(const std::string& job, int64_t version,
                     const std::vector<ToKeep>& objects)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The hot switch's save `version` (proven on the target's hosts) makes
  // the pending change the job's committed layout.
  absl::Status CommitHotSwitchLocked(Job& job, int64_t version, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks every host of the job's placement to prove and seal `version`
  // (rule 4); the error says which host lacks what or which replicas
  // disagree.
  absl::Status CommitSaveOnHosts(const std::string& job, int64_t version,
                                 const std::shared_ptr<const ModelSpec>& spec,
                                 const std::string& config,
                                 const std::vector<std::string>& rank_hosts);
  // Proves the hosts the registry holds to be proven (rule 7); one that
  // does not answer is asked again next round.
  void VerifyReturnedHosts();
  // Runs VerifyReturnedHosts every 200 ms on a thread of its own: a proof
  // (a fingerprint of the host's share) may take long, and the monitor
  // must go on judging heartbeats meanwhile.
  void ProverLoop();
  // Cancels changes in flight that involve `host`, just declared dead.
  void CancelFlightsOnLocked(const std::string& host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the job's decided change (CommitFlight, flight.h: its target
  // becomes the committed state) and brings what the coordinator keeps
  // beside the record up to date (store bytes per host, reported saves,
  // ranks). Returns the targets lost after the decision.
  absl::StatusOr<std::vector<std::string>> CommitFlightLocked(Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Host name of every rank under the job's committed config and hosts
  // (empty if a host is unknown).
  std::vector<std::string> RankHostsLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Host name and GPU of every rank of the committed config: the placement
  // chosen for it (contiguous on its hosts for state from before
  // placements were stored).
  std::pair<std::vector<std::string>, std::vector<int32_t>> RankPlacementLocked(
      const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Resources ResourcesLocked(const std::string& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Load();
  void Recover();
  void MonitorLoop();
  // Judges the answers of the hosts asked directly (their heartbeats
  // late): alive, dead, or asked again; true if a host was marked dead.
  bool JudgeProbesLocked(std::vector<HostProbes::Answer> answers,
                         absl::Time started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes a decided commit; true if done.
  bool FinishDecidedCommit(const std::string& job);
  // Records a new job (its hosts must be registered and have a GPU per
  // rank; `shape` is its ranks and state bytes) and persists it.
  absl::Status AddJob(const proto::RegisterJobRequest& req,
                      std::shared_ptr<const ModelSpec> spec,
                      proto::RegisterJobResponse* resp);
  // What PlanChange gathers under the lock besides `Planned`'s part.
  struct ChangeInputs {
    std::shared_ptr<const ModelSpec> spec;
    std::vector<std::string> from_hosts;
    Resources res;
    std::pair<std::vector<std::string>, std::vector<int32_t>> source_ranks;
    std::vector<std::string> lost;  // alive, but without the job's state
    // The copies kept of the committed version's small objects, or null.
    std::shared_ptr<const KeptSmallObjects> kept;
    std::thread finished;  // the job's last worker, ended: joined unlocked
  };
  // PlanChange's checks of the job and what it reads of the job and the
  // hosts.
  absl::Status GatherChangeLocked(const proto::ReconfigureRequest& req,
                                  bool need_committed,
                                  const SnapshotUse* snapshot, Planned& out,
                                  ChangeInputs& in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans `req` for its job (checks included; a committed version only if
  // `need_committed`); starts nothing.
  absl::StatusOr<Planned> PlanChange(const proto::ReconfigureRequest& req,
                                     bool need_committed,
                                     const SnapshotUse* snapshot = nullptr);
  // What the advisor compares of PlanChange's plan: its summary, and
  // whether its placement survives any one host's loss from memory.
  struct Outline {
    PlanSummary summary;
    bool survives_host_loss = false;
  };
  // With `keep`, the plan itself is kept there too (to start it).
  absl::StatusOr<Outline> OutlineOf(const proto::ReconfigureRequest& req,
                                    std::shared_ptr<Planned>* keep = nullptr);
  // What the watchers of the job see now (mu_ held); the change's whole
  // event only if `change` (a watcher that is not a follower needs it).
  Watchers::Events EventsLocked(const Job& job, bool change) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PlanChange, then StartChange.
  absl::Status PlanAndStart(const proto::ReconfigureRequest& req,
                            bool need_committed, const SnapshotUse* snapshot,
                            proto::ReconfigureResponse* resp);
  // Points the driver's request of `planned` at the flight's input and
  // plan, and gives it the coordinator's view of the hosts (alive,
  // heard from lately, addresses) and a replan that shows in the job's
  // event.
  void ConnectDriver(const proto::ReconfigureRequest& req,
                     const Planned& planned);
  // The target of a planned change of `job` (its version is set by the
  // caller: a new number of the job's, under the lock).
  static FlightTarget TargetOf(const Planned& planned, const Job& job,
                               const std::string& reason);
  // The driver's call once the change's fingerprints are proven: decides
  // the commit and persists the decision (or fails, and the driver
  // aborts).
  absl::Status DecideChange(const std::string& job);
  // Starts a planned change (DoReconfigure's second half); `reason` says
  // who asked (ReconfigureEvent.reason).
  absl::Status StartChange(const proto::ReconfigureRequest& req,
                           Planned planned, proto::ReconfigureResponse* resp,
                           const std::string& reason = "requested");
  // Writes a snapshot of the job's committed version (Snapshot's work;
  // also the periodic snapshotter's). `progress` may be null.
  absl::StatusOr<proto::SnapshotEvent> DoSnapshot(
      const proto::SnapshotRequest& req,
      const std::function<void(const proto::SnapshotEvent&)>& progress);
  absl::Status DoRestore(const proto::RestoreRequest& req,
                         proto::ReconfigureResponse* resp);
  // The newest complete snapshot under `root`, read by a live host.
  absl::StatusOr<SnapshotUse> ReadSnapshotVia(const std::string& job,
                                              const std::string& root,
                                              const std::vector<std::string>& hosts);
  // Takes periodic snapshots (jobs with a snapshot policy), one at a time.
  void SnapshotLoop();
  // `advised`: the plan of `req` the advisor made (DoAdvise's `single`),
  // started instead of planning it again; only for a change that starts
  // now (not after_save), whose request is the one the advisor planned.
  absl::Status DoReconfigure(const proto::ReconfigureRequest& req,
                             proto::ReconfigureResponse* resp,
                             const std::string& reason = "requested",
                             std::shared_ptr<Planned> advised = nullptr);
  // Records `req` as the job's pending change: its processes save at their
  // next step, and the auto loop starts it from that save.
  // `placement` (host and GPU per target rank) is where it was planned:
  // a hot change (req.hot) keeps it if every GPU of it runs a process of
  // the job now, and goes through the store otherwise.
  absl::Status SetPendingLocked(Job& job, const proto::ReconfigureRequest& req,
                                const std::string& reason,
                                const std::vector<std::string>& rank_hosts = {},
                                const std::vector<int32_t>& rank_devices = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rendezvous's answer for `req` now (it counts the rank as here).
  absl::StatusOr<proto::RendezvousResponse> RendezvousLocked(
      const proto::RendezvousRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The held calls of the job's meeting under `epoch`, taken from held_.
  std::vector<Held> TakeHeldLocked(const std::string& job, int64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A held call was cancelled: its rank is absent from now, and the call
  // is finished (if no answer took it first).
  void HeldCancelled(grpc::ServerUnaryReactor* reactor)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers held calls (no lock held: a reaction may run here).
  static void Tell(const std::vector<Held>& held,
                   const absl::StatusOr<proto::RendezvousResponse>& answer);
  // Answers held calls whose time is up, every 100 ms.
  void HoldLoop();
  // The advisor's candidates for the job, planned and chosen. With
  // `single`, the plan of the chosen candidate is kept there when it was
  // the only one planned (a pinned config, or one alone within the
  // margin): an automatic change after a death starts that plan rather
  // than planning the same change twice (each plan of a 16,384-GPU job
  // takes most of a second). Planned candidates are not all kept: each
  // plan of such a job holds a gigabyte or more.
  absl::Status DoAdvise(const proto::AdviseRequest& req,
                        proto::AdviseResponse* resp,
                        std::shared_ptr<Planned>* single = nullptr);
  // Changes jobs with automatic changes whose hosts died, were drained or
  // grew, and starts pending changes once their save committed.
  void AutoLoop();
  // One automatic decision for `job` (no lock held).
  void RunAutoChange(const std::string& job, const std::string& reason,
                     bool save_first, bool must_change = false);
  absl::Status DoPrepare(const proto::ReconfigureRequest& req,
                         proto::PrepareResponse* resp);
  // Queues on every target host of `planned` spares of the sizes it will
  // write: what it stages (regions it stores as they are are linked, not
  // written), or with `all` every region it holds; each host's call
  // within `timeout`.
  absl::Status PrepareTargets(const proto::ReconfigureRequest& req,
                              const Planned& planned, bool all,
                              absl::Duration timeout,
                              proto::PrepareResponse* resp);
  absl::Status DoBeginSave(const proto::BeginSaveRequest& req,
                           proto::BeginSaveResponse* resp);
  absl::Status DoReportSaved(const proto::ReportSavedRequest& req,
                             proto::ReportSavedResponse* resp);
  // A rank gives its save up (ReportSavedRequest.failed): the version is
  // deleted and the job's processes are told.
  absl::Status GiveUpSave(const proto::ReportSavedRequest& req);
  absl::Status DoForgetJob(const proto::ForgetJobRequest& req,
                           proto::ForgetJobResponse* resp);
  void RunFlight(std::shared_ptr<Flight> flight);

  const CoordinatorOptions options_;
  mutable absl::Mutex mu_;
  HostRegistry hosts_ ABSL_GUARDED_BY(mu_);
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> recovery_log_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
  // The monitor thread's questions to hosts whose heartbeats are late: a
  // connection per host being asked, closed once the host answers or is
  // marked dead (at most the overdue hosts' count, not one per host that
  // was ever late).
  HostProbes probes_;
  std::atomic<int> heartbeat_streams_{0};  // open Heartbeats streams
  std::thread snapshotter_;
  // Jobs with a snapshot being written (one at a time per job).
  std::set<std::string> snapshotting_ ABSL_GUARDED_BY(mu_);
  std::thread auto_changer_;
  std::thread prover_;
  // What the auto loop remembers of each job, and its judgement.
  AutoChanges auto_changes_ ABSL_GUARDED_BY(mu_);
  // Per job: the meeting of its processes under its layout epoch.
  Meetings meetings_ ABSL_GUARDED_BY(mu_);
  // Rendezvous calls waiting for their meeting, by their reactor (a
  // cancelled call finds its own at once: 16,384 processes cancel
  // together when a meeting is abandoned).
  absl::flat_hash_map<grpc::ServerUnaryReactor*, Held> held_
      ABSL_GUARDED_BY(mu_);
  std::thread holder_;
  // What ListJobs says of each job's survival, for the placement it was
  // judged on (config, every rank's host and each host's domain): worked
  // out outside mu_, once per placement.
  struct Survival {
    std::string placement;
    std::string text;
    bool any_host = false;
  };
  Survival JudgeSurvival(const std::shared_ptr<const ModelSpec>& spec,
                         const std::string& config, const Placement& placement,
                         const Cluster& cluster, bool small_objects_kept);
  absl::Mutex survival_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, Survival> survival_ ABSL_GUARDED_BY(survival_mu_);
  // Periodic snapshots that failed: not retried before this time.
  std::map<std::string, absl::Time> snapshot_retry_ ABSL_GUARDED_BY(mu_);
  // The jobs' layouts that were used last (a save's commit, a change, a
  // survival judgement each need one; at 16,384 ranks a build takes
  // ~0.25 s): the committed layout is built once, not at every save and
  // change. Thread-safe on its own; taken under mu_ or not.
  LayoutCache layouts_;
  // Each job's save proof under its last placement (what each host must
  // hold, by id once a host keeps it). Thread-safe on its own.
  ShareCache shares_;
  // The Watch streams; their publisher reads the watched jobs' events
  // under mu_ every round. Declared last: stopped first.
  std::unique_ptr<Watchers> watchers_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_COORDINATOR_SERVICE_H_
