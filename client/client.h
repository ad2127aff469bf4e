// The client library a training process links: one rank's view of its
// job's state in ptc. It talks to the host's ptcd over the local Unix
// socket (regions move through daemon-owned shared memory: saves are one
// copy into the daemon, loads are read-only mappings with no copy) and to
// the coordinator for the job's layout and to report completed saves.
//
//   PTC_ASSIGN_OR_RETURN(auto client, Client::Connect({
//       .socket_path = "/run/ptcd/ptcd.sock", .coordinator = "coord:7000",
//       .job = "gpt-7b", .rank = rank}));
//   // Save step 1200 (the coordinator gives the save its version): fill
//   // each of this rank's regions, then commit.
//   PTC_ASSIGN_OR_RETURN(auto save, client->BeginSave(1200));
//   for (int i = 0; i < client->regions().size(); ++i) {
//     PTC_ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, save->Buffer(i));
//     CopyMyShard(client->regions()[i], dst);
//   }
//   PTC_RETURN_IF_ERROR(save->PutSmallObject("iteration", EncodeStep(1200)));
//   ...every small object of the model spec...
//   PTC_RETURN_IF_ERROR(save->Commit().status());
//   // After a reconfiguration, the new ranks load the committed version.
//   PTC_ASSIGN_OR_RETURN(auto state, client->Load());
//   PTC_ASSIGN_OR_RETURN(auto bytes, state->Region(0));    // zero-copy
//   PTC_RETURN_IF_ERROR(state->Read(1, my_tensor_bytes));  // or a copy
#ifndef PTC_CLIENT_CLIENT_H_
#define PTC_CLIENT_CLIENT_H_

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plan/hot_plan.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"
#include "ptc/packs.h"
#include "ptc/parallel_config.h"
#include "ptc/small_object.h"
#include "ptc/tensor_decl.h"
#include "tensor_store/local_client.h"

namespace ptc {

struct ClientOptions {
  // The host's ptcd (its --socket).
  std::string socket_path = "/run/ptcd/ptcd.sock";
  // The coordinator, host:port.
  std::string coordinator = "127.0.0.1:7000";
  std::string job;
  // This process's rank in the job's current parallel config.
  int rank = -1;
  // The job's token (from its registration; ptcctl token), which the
  // coordinator and ptcd need where the cluster has a token key. Empty:
  // $PTC_JOB_TOKEN.
  std::string token;
  // Deadline of each coordinator call.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Nonzero: bind to the job's pending hot switch with this serial
  // (JobStatus.pending_serial) instead of its committed layout: rank,
  // config(), regions() and layout_epoch() (the current + 1) are the
  // switch's target, and a save is the switch's save, whose commit makes
  // the target the job's layout. FAILED_PRECONDITION once the switch is no
  // longer pending.
  int64_t pending_serial = 0;
  // Reach the coordinator through the host's ptcd (its coordinator relay)
  // when it relays to `coordinator`, over one connection per host instead
  // of one per process; false, or PTC_COORDINATOR_RELAY=0: directly. With
  // TLS a relayed call needs the job's token.
  bool coordinator_relay = true;
};

// One region this rank holds: a hyper-rectangle of a tensor of the model
// spec, in the tensor's global coordinates, as row-major bytes.
struct RankRegion {
  int tensor = 0;  // index in spec().tensors
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;  // the tensor's global shape
  Region region;
  int64_t bytes = 0;
};

// The ranks of a job that the placement puts on one host, and their
// GPUs: what a host's launcher starts there (no ptcd needed).
struct HostRanks {
  std::string config;
  int world_size = 0;
  int64_t layout_epoch = 0;
  std::vector<std::pair<int, int>> ranks;  // (rank, GPU), ascending
  // What a launcher needs besides: the job's committed version, the phase
  // of its change (kPhaseNone if none ran), whether its processes follow
  // changes themselves (AutoPolicy.live), and the address of rank 0's
  // host as it registered (HOST:PORT; empty if unknown).
  int64_t committed_version = 0;
  proto::ReconfigurePhase phase = proto::PHASE_NONE;
  bool live = false;
  std::string rank0_host_address;
};
// NOT_FOUND for an unknown job; an empty list for a host with no rank.
// With `socket_path` (the host's ptcd, its --socket), asked through the
// daemon's coordinator relay where it relays to this coordinator (as
// Client does: the coordinator holds one connection per host, however
// many of its processes ask at once), else on a channel of its own.
absl::StatusOr<HostRanks> RanksOnHost(
    const std::string& coordinator, const std::string& job,
    const std::string& host, absl::Duration timeout = absl::Seconds(30),
    const std::string& socket_path = "");

// A host's agent: the process on `gpu` of `host` exited with `exit_code`
// under `layout_epoch` while its GPU had a rank. Returns whether the
// coordinator changes the job for it (automatic changes on).
absl::StatusOr<bool> ReportProcessExit(const std::string& coordinator,
                                       const std::string& job,
                                       const std::string& host, int gpu,
                                       int exit_code, int64_t layout_epoch,
                                       absl::Duration timeout = absl::Seconds(30));

// The job as a process that follows it sees it (Client::Follow): the
// newest event of the coordinator's Watch stream.
struct JobEvent {
  bool known = false;  // false until the first event arrives
  int64_t layout_epoch = 0;
  int64_t committed_version = 0;
  // The newest save that could not commit and was deleted (0: none): a
  // process waiting for version V to commit stops once this is >= V, and
  // saves again.
  int64_t dropped_save = 0;
  // A change the processes are asked to save for (empty: none).
  std::string pending_config;
  // It is a hot switch (its processes move the state), and its serial.
  bool pending_hot = false;
  int64_t pending_serial = 0;
  // How the last committed change moved the state ("store", "hot switch").
  std::string path;
  // The change in flight or the last one: its plan epoch, phase, why it
  // started and, if it aborted, why.
  int64_t plan_epoch = 0;
  proto::ReconfigurePhase phase = proto::PHASE_NONE;
  std::string reason;
  std::string error;
  // How many events this process's stream has told it, this one included
  // (0: none, or an event asked for, FetchEvent): a waiter passes the
  // count it has seen to Client::WaitEvent.
  int64_t received = 0;
};

// Follows a job's Watch stream (WatchRequest.follow) in a thread of its
// own, following it again 200 ms after it breaks (the coordinator went
// away or restarted). The coordinator holds no thread per stream.
class JobWatch {
 public:
  ~JobWatch() { Stop(); }
  // Follows `job` over `stub`, which must outlive the following (Stop, or
  // this object). Idempotent while following.
  void Start(proto::Coordinator::Stub* stub, const std::string& job);
  // Stops following; Latest() keeps the last event, Start follows again.
  void Stop();
  JobEvent Latest() const;
  // The newest event once the stream has told more than `after` events,
  // or when `timeout` passes (the newest event then, told or not).
  JobEvent Wait(int64_t after, absl::Duration timeout) const;

 private:
  mutable absl::Mutex mu_;
  JobEvent latest_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

// A job followed from outside its processes (a host's agent): the job's
// Watch stream, and the ranks it places on a host asked over the same
// channel, so that whoever watches is told of a change rather than asking.
class JobFollower {
 public:
  // Starts following at once; the first event comes when the coordinator
  // answers (Latest().known is false until then).
  JobFollower(const std::string& coordinator, const std::string& job);
  JobEvent Latest() const { return watch_.Latest(); }
  // RanksOnHost over this follower's channel.
  absl::StatusOr<HostRanks> RanksOn(const std::string& host,
                                    absl::Duration timeout = absl::Seconds(30));

 private:
  std::string coordinator_;
  std::string job_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  JobWatch watch_;  // declared after stub_: it stops before the stub goes
};

class Client {
 public:
  ~Client();
  // Connects to the ptcd at options.socket_path and reads the job from the
  // coordinator. Errors say what to fix: no ptcd at the socket, an unknown
  // job, a rank outside the job's config, or a ptcd on another host than
  // the one the job places this rank on.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);

  // Re-reads the job (config, hosts, committed version) from the
  // coordinator, e.g. after a reconfiguration; the rank stays the same.
  absl::Status Refresh();
  // Becomes the rank the job's placement now puts on this host's GPU
  // `device` (a live process after a change) and reads the job, from one
  // answer of the coordinator; returns the rank, or -1 where the placement
  // puts none there (the client stays as it was, as on error). A client
  // bound to a hot switch (pending_serial) takes RanksOn and Rebind.
  absl::StatusOr<int> RebindToDevice(int device);
  // Becomes `rank` of the job's current config (a live process after a
  // change) and re-reads the job; on error the client stays as it was.
  absl::Status Rebind(int rank);
  // Follows the job in the background (the coordinator's Watch stream,
  // reconnecting when it breaks); LatestEvent() is then what the stream
  // said last. Idempotent. The coordinator holds no thread per stream
  // (a callback method): every process of a live job follows its own, and
  // is told rather than asking (FetchEvent) while it waits.
  void Follow();
  // Stops following (LatestEvent keeps the last event).
  void Unfollow();
  JobEvent LatestEvent() const;
  // Sleeps until the stream tells something new (an event whose
  // `received` is beyond `after`), at most `timeout`, and returns the
  // newest event: a waiting process is woken by the news, not by a clock.
  JobEvent WaitEvent(int64_t after, absl::Duration timeout) const;
  // The job's state now, as an event (one ListJobs call, asked again
  // within `patience`; the client's rpc_timeout if zero).
  absl::StatusOr<JobEvent> FetchEvent(
      absl::Duration patience = absl::ZeroDuration());
  // Meets the job's other processes under `layout_epoch`: rank 0 offers
  // the port of its process group's store; every rank waits (up to
  // `timeout`) until all of the epoch's ranks are there at once. Returns
  // the store's host:port; FAILED_PRECONDITION once the job has another
  // layout epoch.
  absl::StatusOr<std::string> Rendezvous(int64_t layout_epoch, int port,
                                         absl::Duration timeout);

  // The ranks the job's placement puts on `host` and their GPUs, asked
  // over this client's connection (RanksOnHost opens one per call: a live
  // process asks it after every change).
  absl::StatusOr<HostRanks> RanksOn(const std::string& host);

  const std::string& job() const { return options_.job; }
  int rank() const { return options_.rank; }
  // This ptcd's host name, as the coordinator knows it.
  const std::string& host() const { return host_; }
  // Whether this client reaches the coordinator through its ptcd's relay.
  bool relayed() const { return relayed_; }
  // The GPU the job's placement gives this rank on host() (-1: the
  // coordinator placed no device), as of the last Refresh.
  int device() const { return device_; }
  const ModelSpec& spec() const { return spec_; }
  const ParallelConfig& config() const { return config_; }
  MeshCoord coord() const { return config_.CoordOf(options_.rank); }
  int world_size() const { return config_.world_size(); }
  // The job's newest committed version (0: none yet), as of the last
  // Refresh, Load, WaitCommitted or this client's own commit of a save.
  int64_t committed_version() const { return committed_version_; }
  // The training step that version was saved at.
  int64_t committed_step() const { return committed_step_; }
  // The layout epoch of config() (the coordinator's; +1 at every change):
  // saves carry it, and a save under a stale one is refused.
  int64_t layout_epoch() const { return layout_epoch_; }
  // The regions this rank holds under config(), in spec order.
  const std::vector<RankRegion>& regions() const { return regions_; }
  // Index in regions() of `key`'s region(s); empty if this rank holds none.
  std::vector<int> RegionsOf(const std::string& key) const;

  // A save of one version by this rank.
  class Save {
   public:
    ~Save();
    // The writable bytes of regions()[i], in daemon-owned shared memory,
    // allocated on first use. Fill them row-major before Commit. With
    // `populate` false the mapping's pages are left to be faulted in by
    // whoever touches them first (cudaHostRegister pins, and so faults in,
    // every page itself: populating them before would do it twice).
    absl::StatusOr<absl::Span<uint8_t>> Buffer(int i, bool populate = true);
    // Copies `bytes` (exactly regions()[i].bytes, row-major) into region i
    // and takes their checksum during the copy, while each chunk is in
    // cache; at Commit ptcd compares it with its own checksum of what it
    // stores (DATA_LOSS if they differ). The fastest way to save a region
    // that is already contiguous in memory. The first Write of a region
    // under 8 MiB allocates it in a pack with the rank's other small
    // regions not yet allocated (ptc/packs.h: one memfd, one request).
    absl::Status Write(int i, absl::Span<const uint8_t> bytes);
    // Marks region i saved without bytes, on a hollow ptcd only (a scale
    // test's, which keeps every region's metadata and none of its bytes:
    // tools/scale_harness.py drives thousands of such ranks);
    // FAILED_PRECONDITION on a real one.
    absl::Status WriteHollow(int i);
    // A small object of the model spec for this rank (at most 60 KiB).
    absl::Status PutSmallObject(const std::string& name,
                                const std::string& bytes);
    // Publishes every region (all must have been filled) and small object
    // (all of the spec's must have been put) and reports this rank's save
    // to the coordinator. Returns true if this was the last rank and the
    // version is now committed (every host of the placement proved that it
    // holds the whole version, and replicas agree). A region another rank
    // on this host already saved is kept once, after checking that both
    // copies are equal. FAILED_PRECONDITION if the job changed its layout
    // since this client read it (the save is stale).
    // Where this rank's part cannot be published (its ptcd failed it),
    // Commit gives the version up (GiveUp) before it returns the error.
    absl::StatusOr<bool> Commit();
    // This rank will not save this version (`why`: its error, for the
    // coordinator's log): the coordinator deletes it, and the job's ranks
    // that reported it stop waiting for its commit (JobEvent.dropped_save)
    // and save again. Asked patiently (within the client's rpc_timeout);
    // OK if already given up; FAILED_PRECONDITION once Commit reported it,
    // and for a hot switch's save (its switch fails on every process
    // instead, and the change goes through the store).
    absl::Status GiveUp(const std::string& why);
    // The version the coordinator gave this save, and its training step.
    int64_t version() const { return version_; }
    int64_t step() const { return step_; }

   private:
    friend class Client;
    Save(Client* client, int64_t version, int64_t step);
    // Region i's put buffer, allocated (unmapped) on first use.
    absl::StatusOr<LocalClient::PutBuffer*> Slot(int i);
    // Commit's first part: every region and small object stored in ptcd.
    absl::Status Publish();
    // Allocates region i, if it is small, in one pack with the other small
    // regions not yet allocated (those after it first): one request and
    // one memfd for up to kMaxPackRegions of them.
    absl::Status AllocatePack(int i);
    Client* client_;
    int64_t version_;
    int64_t step_;
    std::vector<std::optional<LocalClient::PutBuffer>> buffers_;
    // Region i was handed out or written (a pack allocates regions before
    // they are written).
    std::vector<bool> filled_;
    // xxh3 of region i taken by Write (unset once Buffer(i) hands it out).
    std::vector<std::optional<uint64_t>> written_checksums_;
    std::map<std::string, std::string> small_;
    // Small objects the coordinator keeps a copy of (BeginSave's answer).
    std::vector<std::string> keep_;
    bool committed_ = false;  // published, and reported or reporting
    bool given_up_ = false;
  };
  // Starts saving this rank's state at training step `step` (>= 0): the
  // coordinator gives the save its version (every rank saving the same
  // step under the same layout writes into the same version).
  // FAILED_PRECONDITION if the job's layout changed since this client read
  // it, or the job is being reconfigured. `change_serial`: the pending
  // change this save is made for (JobStatus.pending_serial), when its ranks
  // save for it instead of switching hot: the change then goes through the
  // store from this save (0: a save of the job's own schedule).
  // `known_dropped`: the newest deleted save (JobEvent.dropped_save) this
  // rank has acted on; ABORTED if a newer one was deleted (its peers make
  // that save again together), instead of a version only this rank would
  // write (BeginSaveRequest.known_dropped). Unset: not checked.
  absl::StatusOr<std::unique_ptr<Save>> BeginSave(
      int64_t step, int64_t change_serial = 0,
      std::optional<int64_t> known_dropped = std::nullopt);

  // This rank's state in one committed version: read-only mappings of the
  // daemon's buffers (no copy) and the rank's small objects. Valid while
  // the State lives, even if the version is deleted meanwhile.
  class State {
   public:
    int64_t version() const { return version_; }
    // The regions loaded (the client's regions() when it loaded).
    const std::vector<RankRegion>& regions() const { return regions_; }
    // The bytes of regions()[i]: a read-only mapping of the daemon's
    // buffer (no copy), made on first use.
    absl::StatusOr<absl::Span<const uint8_t>> Region(int i) const;
    // Copies the bytes of regions()[i] into `dst` (exactly its size)
    // through the buffer's descriptor, mapping nothing: the fastest way
    // to load a region into memory of one's own.
    absl::Status Read(int i, absl::Span<uint8_t> dst) const;
    // xxh3-64 of regions()[i] as the daemon stored it.
    uint64_t Checksum(int i) const { return mappings_[i].checksum(); }
    // The shared memory's inode, for checking that a load copied nothing.
    ino_t Inode(int i) const { return mappings_[i].inode(); }
    absl::StatusOr<std::string> SmallObject(const std::string& name) const;

    // Releases the regions' leases together.
    ~State();

   private:
    friend class Client;
    absl::Status CheckIndex(int i) const;
    LocalClient* local_ = nullptr;
    int64_t version_ = 0;
    std::vector<RankRegion> regions_;
    mutable absl::Mutex mu_;  // maps one region at a time
    mutable std::vector<LocalClient::Mapping> mappings_;
    std::map<std::string, std::string> small_;
  };
  // Loads this rank's regions and small objects of the job's committed
  // version, as the coordinator knows it now. The first Load after a
  // Rendezvous under this client's layout (with no save open then) takes
  // the version the meeting's answer named, without asking: a layout that
  // changed since is then seen only where this client follows the job.
  // FAILED_PRECONDITION if the job has no committed version, if its layout
  // changed since this client read it (Refresh first after a
  // reconfiguration), or if this host's ptcd no longer holds it.
  absl::StatusOr<std::unique_ptr<State>> Load();

  // Waits until the coordinator has committed `version` (every rank saved).
  // ABORTED once it never will (it was deleted: a host of its placement
  // was dead as it committed, or a rank gave its save up): save again.
  absl::Status WaitCommitted(int64_t version, absl::Duration timeout);

  // The job's pending hot switch with `serial`: its target config, and,
  // for each target rank, the rank of this layout whose process runs on
  // its GPU; and the plan between the processes (hot_plan.h), the same in
  // every process. FAILED_PRECONDITION if it is no longer pending or the
  // job's layout changed since this client read it.
  struct HotSwitch {
    std::string config;
    std::vector<int> process_of;
    ProcessPlan plan;
  };
  absl::StatusOr<HotSwitch> PlanHotSwitch(int64_t serial);

 private:
  explicit Client(ClientOptions options) : options_(std::move(options)) {}
  // Takes `job` (FetchJob's answer with the layout) as this rank's view:
  // config, regions, placement, committed version.
  absl::Status Adopt(proto::JobStatus job);
  // The job as the coordinator has it; with its layout spec if asked.
  // Brief (the default): without the lists that grow with the job, and
  // with the ranks on this client's host (ListJobsRequest.brief).
  // Asked again within `patience` (the client's rpc_timeout if zero).
  absl::StatusOr<proto::JobStatus> FetchJob(
      bool include_layout = false, bool brief = true,
      absl::Duration patience = absl::ZeroDuration());

  ClientOptions options_;
  std::unique_ptr<LocalClient> local_;
  std::unique_ptr<proto::Coordinator::Stub> coordinator_;
  // Connect answered: a later read the coordinator fails UNAVAILABLE is a
  // lost connection, asked again until the call's deadline; before, three
  // attempts (where no coordinator listens, Connect fails within a second).
  bool reached_coordinator_ = false;
  bool relayed_ = false;
  int UnavailableAttempts() const { return reached_coordinator_ ? INT_MAX : 3; }
  std::string host_;
  int device_ = -1;
  ModelSpec spec_;
  ParallelConfig config_;
  int64_t committed_version_ = 0;
  int64_t committed_step_ = 0;
  // The last meeting's answer (Rendezvous): the version committed when
  // every rank of `layout_epoch` was there; Load takes it once.
  struct Met {
    int64_t layout_epoch = -1;
    int64_t committed_version = 0;
    int64_t committed_step = 0;
  };
  Met met_;
  int64_t layout_epoch_ = 0;
  std::vector<RankRegion> regions_;
  // regions_ as a save packs them (ptc/packs.h).
  std::vector<PackCandidate> pack_candidates_;
  // Follow()'s stream (declared last: it stops before coordinator_ goes).
  JobWatch watch_;
};

}  // namespace ptc

#endif  // PTC_CLIENT_CLIENT_H_
