// Registration and forgetting of hosts and jobs, persistence, listings and
// the monitor of CoordinatorService.
// Reconfigurations are in reconfigure_rpc.cc.
#include "coordinator/coordinator_service.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/job_placement.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/model_spec.h"
#include "tensor_store/store_client.h"

namespace ptc {

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    CoordinatorOptions options) {
  if (options.store == nullptr) {
    PTC_ASSIGN_OR_RETURN(options.store,
                         OpenLocalControlStore(options.state_dir));
  }
  std::unique_ptr<CoordinatorService> s(
      new CoordinatorService(std::move(options)));
  PTC_RETURN_IF_ERROR(s->Load());
  s->Recover();
  {
    absl::MutexLock lock(&s->mu_);
    s->hosts_.SetCadence({s->options_.heartbeat_interval,
                          s->options_.host_timeout,
                          s->options_.max_heartbeats_per_second});
    s->auto_changes_.WaitForLateHosts(true);
  }
  s->watchers_ = std::make_unique<Watchers>(
      [p = s.get()](const std::map<std::string, bool>& jobs) {
        std::map<std::string, Watchers::Events> out;
        absl::MutexLock lock(&p->mu_);
        for (const auto& [name, change] : jobs) {
          if (const Job* job = p->jobs_.Find(name))
            out[name] = p->EventsLocked(*job, change);
        }
        return out;
      });
  s->monitor_ = std::thread([p = s.get()] { p->MonitorLoop(); });
  s->snapshotter_ = std::thread([p = s.get()] { p->SnapshotLoop(); });
  s->auto_changer_ = std::thread([p = s.get()] { p->AutoLoop(); });
  s->prover_ = std::thread([p = s.get()] { p->ProverLoop(); });
  s->holder_ = std::thread([p = s.get()] { p->HoldLoop(); });
  return s;
}

CoordinatorService::~CoordinatorService() {
  watchers_.reset();  // its publisher reads the jobs
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [name, job] : jobs_) job->cancel = true;
  }
  if (monitor_.joinable()) monitor_.join();
  if (snapshotter_.joinable()) snapshotter_.join();
  if (auto_changer_.joinable()) auto_changer_.join();
  if (prover_.joinable()) prover_.join();
  if (holder_.joinable()) holder_.join();
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, job] : jobs_) {
      if (job->worker.joinable()) workers.push_back(std::move(job->worker));
    }
  }
  for (std::thread& t : workers) t.join();
}

std::vector<std::string> CoordinatorService::recovery_log() const {
  absl::MutexLock lock(&mu_);
  return recovery_log_;
}

// state.pb holds the hosts and retired epochs; each job lives in its own
// file, rewritten only when that job changed (each file is replaced
// atomically; a job's commit decision is in one file).
absl::Status CoordinatorService::PersistLocked() {
  // One transaction of the records that changed: the cluster's, and each
  // job's that was registered, changed or forgotten since the last one.
  ControlStore::Writes writes;
  JobTable::Records jobs = jobs_.Writes(&writes);
  // Each host's registration in a record of its own (a cluster of
  // thousands of hosts rewrites only those that changed).
  HostRegistry::Records hosts = hosts_.Writes(&writes);
  if (writes.empty()) return absl::OkStatus();
  CommittedRecords done = CommitRecords(*options_.store, std::move(writes));
  if (!done.status.ok()) {
    // A change written as several transactions can fail after some of
    // them committed: the tables learn what the store holds now, so that
    // the next write compares with it (a caller that undoes its change in
    // memory then writes those records back; one that keeps it writes the
    // rest).
    jobs_.PartlyPersisted(done.written);
    hosts_.PartlyPersisted(done.written);
    return done.status;
  }
  if (!done.undeleted.empty()) {
    // Deletes of copies no version needs: one that fails is deleted by a
    // later write, not reported as this one's failure (its callers would
    // undo what the store now holds).
    Log("coordinator")
        ->warn(
            "deleting {} records of kept copies no version needs: {}; "
            "retried by the next write",
            done.undeleted.size(), done.undeleted_status.ToString());
    jobs.stale_kept = std::move(done.undeleted);
  }
  jobs_.Persisted(std::move(jobs));
  hosts_.Persisted(std::move(hosts));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CoordinatorService::CommitFlightLocked(
    Job& job) {
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> lost,
                       CommitFlight(job.state, job.event));
  job.host_bytes = job.target_host_bytes;
  job.saved.clear();  // the open saves ended with the layout epoch
  job.PruneKept();
  auto shape = JobShape(*job.spec, job.state.config());
  if (shape.ok()) std::tie(job.ranks, job.state_bytes) = *shape;
  return lost;
}

absl::Status CoordinatorService::CommitHotSwitchLocked(Job& job,
                                                       int64_t version,
                                                       int64_t step) {
  proto::CoordinatorState::Job& s = job.state;
  const proto::ReconfigureRequest pending = s.pending();
  const double began = s.pending_unix();
  // The processes staged the pending change and proved it (their save):
  // it starts, is decided and commits at once, as a change through the
  // store would.
  FlightTarget target;
  target.config = pending.to();
  target.rank_hosts = {pending.placement().rank_hosts().begin(),
                       pending.placement().rank_hosts().end()};
  target.rank_devices = {pending.placement().rank_devices().begin(),
                         pending.placement().rank_devices().end()};
  target.version = version;
  target.epoch = s.last_epoch() + 1;
  target.step = step;
  target.reason = s.pending_reason();
  const proto::CoordinatorState::Job before = s;
  job.ArchiveEvent();
  absl::Status done = StartFlight(target, s, job.event);
  if (done.ok()) done = DecideFlight(s, job.event);
  if (done.ok()) {
    job.target_host_bytes = HostBytesOf(job.spec, &layouts_, s.target_config(),
                                        s.target_rank_hosts());
    done = CommitFlightLocked(job).status();
  }
  if (!done.ok()) {
    s = before;
    return done;
  }
  job.ClearPending();
  job.event.set_path("hot switch");
  job.event.set_seconds(absl::ToUnixMicros(absl::Now()) / 1e6 - began);
  return absl::OkStatus();
}

absl::Status CoordinatorService::Load() {
  PTC_ASSIGN_OR_RETURN(auto records, options_.store->ReadAll());
  const std::string where = options_.store->Describe();
  // Hosts from before per-host records are in the cluster record.
  proto::CoordinatorState legacy;
  if (auto it = records.find(kClusterRecord); it != records.end())
    legacy.ParseFromString(it->second);  // a bad one: JobTable::Load says
  absl::MutexLock lock(&mu_);
  PTC_RETURN_IF_ERROR(jobs_.Load(records, where));
  // Known hosts get one timeout from now to heartbeat again.
  PTC_RETURN_IF_ERROR(hosts_.Load(records, legacy, absl::Now(), where));
  Log("coordinator")
      ->info("loaded {} hosts and {} jobs from {}", hosts_.size(), jobs_.size(),
             where);
  return absl::OkStatus();
}

absl::Status ValidateHost(const proto::HostStatus& h) {
  if (h.name().empty() || h.name().size() > 253 ||
      !std::all_of(h.name().begin(), h.name().end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("host name '", absl::CHexEscape(h.name().substr(0, 300)),
                     "' must be 1 to 253 letters, digits, '.', '-' or '_'"));
  }
  if (h.name() == "admin" || h.name() == "coordinator" ||
      h.name() == "client") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", h.name(), "' names a kind of caller, not a host; choose another"));
  }
  const std::string who = absl::StrCat("host ", h.name(), ": ");
  PTC_RETURN_IF_ERROR(Annotate(ParseHostPort(h.address()).status(), who));
  if (h.gpus() < 1 || h.gpus() > kMaxGpusPerHost) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, h.gpus(), " GPUs; a host has 1 to ", kMaxGpusPerHost));
  }
  if (!(h.bandwidth() >= 0 && h.bandwidth() <= kMaxHostBandwidth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "bandwidth ", h.bandwidth(), " bytes/s must be from 0 (the ",
        "default) to ", kMaxHostBandwidth));
  }
  if (h.gpu_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "GPU memory ", h.gpu_memory_bytes(), " bytes is negative"));
  }
  if (h.memory_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "memory ", h.memory_bytes(), " bytes is negative"));
  }
  PTC_RETURN_IF_ERROR(
      Annotate(ValidateDomain(h.domain()), absl::StrCat("host ", h.name())));
  // A Unix socket's path is at most 107 bytes (sun_path).
  if (h.socket().size() > 107 || h.socket().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "a socket path of ", h.socket().size(),
        " bytes or with a NUL; a Unix socket's path has at most 107"));
  }
  if (h.ucx_address().size() > 64 << 10) {
    return absl::InvalidArgumentError(absl::StrCat(who, "a UCX address of ",
                                                   h.ucx_address().size(),
                                                   " bytes; at most 64 KiB"));
  }
  return absl::OkStatus();
}

grpc::Status CoordinatorService::RegisterHost(
    grpc::ServerContext* ctx, const proto::RegisterHostRequest* req,
    proto::RegisterHostResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "RegisterHost", req);
      !denied.ok())
    return denied;
  const proto::HostStatus& h = req->host();
  if (absl::Status s = ValidateHost(h); !s.ok()) return ToGrpcStatus(s);
  absl::MutexLock lock(&mu_);
  const HostRegistry::Registered r = hosts_.Register(h, absl::Now());
  if (r.known && (r.was_dead || !r.same_process)) {
    // Its memory is gone (a new process), or not to be trusted until the
    // monitor proves it (the same process back after a silence: rule 7).
    for (auto& [name, job] : jobs_) {
      const auto& hosts = job->state.hosts();
      const auto& lost = job->state.lost_hosts();
      if (std::find(hosts.begin(), hosts.end(), h.name()) != hosts.end() &&
          std::find(lost.begin(), lost.end(), h.name()) == lost.end()) {
        job->state.add_lost_hosts(h.name());
        if (r.same_process) {
          Log("coordinator")
              ->warn(
                  "job {}: host {} is back (the same process, silent for a "
                  "while); its share of version {} will be verified before "
                  "it is used again",
                  name, h.name(), job->state.committed_version());
        } else {
          Log("coordinator")
              ->warn(
                  "job {}: host {} came back as a new process; its share of "
                  "version {} is gone",
                  name, h.name(), job->state.committed_version());
        }
      }
    }
  }
  // A host declared dead left its jobs' pools; back as the same process
  // (it was only silent), it rejoins them, so that a stall or a cut link
  // does not shrink a job for good. A new process does not: its jobs'
  // operators add it back (ptcctl hosts add).
  bool rejoined = false;
  for (auto& [name, job] : jobs_) {
    auto* left = job->state.mutable_left_pool_dead();
    auto it = std::find(left->begin(), left->end(), h.name());
    if (it == left->end() || !r.known) continue;
    left->erase(it);
    if (!r.same_process) continue;
    rejoined = true;
    const auto& pool = job->state.pool();
    if (std::find(pool.begin(), pool.end(), h.name()) == pool.end())
      job->state.add_pool(h.name());
    if (hosts_.HeldBack(h.name(), absl::Now())) {
      const HostRegistry::Host* back = hosts_.Find(h.name());
      Log("coordinator")
          ->warn(
              "job {}: host {} is back as the same process after {} "
              "false deaths within {}; it rejoins the job's pool, and the "
              "job grows onto it after {}",
              name, h.name(), back->flaps,
              absl::FormatDuration(HostRegistry::kFlapWindow),
              absl::FormatDuration(back->held_until - absl::Now()));
    } else {
      Log("coordinator")
          ->info(
              "job {}: host {} is back as the same process; it rejoins "
              "the job's pool",
              name, h.name());
    }
  }
  if (rejoined) {
    auto_changes_.HostsChanged();
    auto_changes_.Wake();
  }
  Log("coordinator")
      ->info("host {} registered at {} ({} GPUs){}", h.name(), h.address(),
             h.gpus(), r.was_dead ? ", back from the dead" : "");
  resp->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(hosts_.Find(h.name())->told));
  return ToGrpcStatus(PersistLocked());
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const proto::HeartbeatRequest* req,
                                           proto::HeartbeatResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Heartbeat", req);
      !denied.ok())
    return denied;
  Beat(*req, resp);
  return grpc::Status::OK;
}

namespace {
Counter& heartbeat_answers =
    GetCounter("ptc_coordinator_heartbeat_stream_answers_total");
}  // namespace

static_assert(kHeartbeatAnswerEvery <
                  absl::Milliseconds(kPatientKeepaliveTimeMs),
              "a host's channel would ping between the answers");

bool HeartbeatNeedsAnswer(const proto::HeartbeatRequest& req,
                          const proto::HeartbeatResponse& resp,
                          double told_seconds, absl::Duration since_answer) {
  return !req.answer_when_needed() || !resp.known() ||
         resp.reclaim_size() > 0 ||
         (resp.heartbeat_interval_seconds() > 0 &&
          resp.heartbeat_interval_seconds() != told_seconds) ||
         since_answer >= kHeartbeatAnswerEvery;
}

// One read or one write in flight at a time: a message is read, answered
// (or not: HeartbeatNeedsAnswer), and the next one read once the answer
// is written (an answer left out spares the write and its reaction,
// about 30 us of a heartbeat's 130-165 us at 512 hosts). The stream ends
// when
// the host closes its side, the connection goes, a message is refused, or
// the server shuts down; gRPC's OnDone, the last reaction, deletes it.
class CoordinatorService::HeartbeatStream final
    : public grpc::ServerBidiReactor<proto::HeartbeatRequest,
                                     proto::HeartbeatResponse> {
 public:
  HeartbeatStream(CoordinatorService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx) {}

  void Start() {
    if (grpc::Status denied =
            Admit<proto::Coordinator>(*ctx_, "Heartbeats", nullptr);
        !denied.ok()) {
      Finish(denied);
      return;
    }
    if (service_->heartbeat_streams_.load() > kMaxHeartbeatStreams) {
      Finish(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("the coordinator has ", kMaxHeartbeatStreams,
                       " heartbeat streams open; send Heartbeat calls"))));
      return;
    }
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the host closed its side, or the call ended
      Finish(grpc::Status::OK);
      return;
    }
    resp_.Clear();
    if (grpc::Status denied =
            Admit<proto::Coordinator>(*ctx_, "Heartbeats", &req_);
        !denied.ok()) {
      Finish(denied);
      return;
    }
    service_->Beat(req_, &resp_);
    const absl::Time now = absl::Now();
    if (!HeartbeatNeedsAnswer(req_, resp_, told_seconds_, now - answered_at_)) {
      StartRead(&req_);
      return;
    }
    // (An answer to a stranger tells no interval; the host keeps its own.)
    if (resp_.heartbeat_interval_seconds() > 0)
      told_seconds_ = resp_.heartbeat_interval_seconds();
    answered_at_ = now;
    heartbeat_answers.Add();
    StartWrite(&resp_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&req_);
  }

  void OnDone() override {
    service_->heartbeat_streams_.fetch_sub(1);
    delete this;
  }

 private:
  CoordinatorService* const service_;
  grpc::CallbackServerContext* const ctx_;
  proto::HeartbeatRequest req_;
  proto::HeartbeatResponse resp_;
  // The interval last written on the stream (0: none), and when.
  double told_seconds_ = 0;
  absl::Time answered_at_ = absl::InfinitePast();
};

grpc::ServerBidiReactor<proto::HeartbeatRequest, proto::HeartbeatResponse>*
CoordinatorService::Heartbeats(grpc::CallbackServerContext* ctx) {
  heartbeat_streams_.fetch_add(1);
  auto* stream = new HeartbeatStream(this, ctx);
  stream->Start();
  return stream;
}

void CoordinatorService::Beat(const proto::HeartbeatRequest& req,
                              proto::HeartbeatResponse* resp) {
  absl::MutexLock lock(&mu_);
  if (!hosts_.Heartbeat(req.name(), req.incarnation(), absl::Now())) {
    // Unknown, declared dead, or another process under the name: it must
    // register again (its state is no longer trusted as a source).
    resp->set_known(false);
    return;
  }
  resp->set_known(true);
  hosts_.NoteMemoryUsed(req.name(), req.memory_used_bytes());
  resp->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(hosts_.Find(req.name())->told));
  // Rule 6: what nothing owns any more is reclaimed. A host that is still
  // to be proven keeps everything until it is.
  if (hosts_.NeedsProof(req.name())) return;
  for (const proto::HeldVersion& v : req.versions()) {
    Job* j = jobs_.Find(v.job());
    if (j == nullptr || j->OwnsVersion(v.version()))
      continue;
    *resp->add_reclaim() = v;
    Log("coordinator")
        ->info(
            "job {}: host {} holds version {} ({}) that nothing owns; "
            "reclaiming it",
            v.job(), req.name(), v.version(),
            v.committed() ? "committed" : "uncommitted");
  }
}

void CoordinatorService::CancelFlightsOnLocked(const std::string& host) {
  for (auto& [name, job] : jobs_) {
    const auto& s = job->state;
    if (s.target_version() == 0 || s.commit_decided() || !job->running)
      continue;
    // A target that goes silent stops the change. A host that is only a
    // source does not: its targets take its pieces from other holders, and
    // the change aborts by itself if some piece has no live source left.
    const bool involved =
        std::find(s.target_hosts().begin(), s.target_hosts().end(), host) !=
        s.target_hosts().end();
    if (!involved || job->cancel) continue;
    const HostRegistry::Host* h = hosts_.Find(host);
    job->cancel_reason = absl::StrCat(
        "host ", host, " went silent (no heartbeat for ",
        absl::FormatDuration(h != nullptr ? hosts_.TimeoutOf(*h)
                                          : options_.host_timeout),
        ") during the change; version ", s.committed_version(), " stays");
    job->cancel = true;
    Log("coordinator")
        ->warn("job {} epoch {}: aborting: {}", name, s.target_epoch(),
               job->cancel_reason);
  }
}

bool CoordinatorService::JudgeProbesLocked(
    std::vector<HostProbes::Answer> answers, absl::Time started) {
  const absl::Time now = absl::Now();
  bool changed = false;
  for (HostProbes::Answer& a : answers) {
    const std::string& name = a.host;
    const HostRegistry::Host* h = hosts_.Find(name);
    if (h == nullptr || !h->status.alive()) {
      probes_.Drop(name);
      continue;
    }
    const absl::Duration silent = now - std::max(h->last_heartbeat, started);
    const absl::Duration timeout = hosts_.TimeoutOf(*h);
    if (silent <= timeout / 2) {
      // A heartbeat came: the probe's connection is not kept (one per
      // host that was ever late would stay open, pinging it).
      probes_.Drop(name);
      continue;
    }
    // A ptcd that started after this host registered is another process
    // under its name: the memory of the registered one is gone.
    if (a.uptime.ok() &&
        HostRegistry::StartedAfter(*a.uptime, a.asked, h->registered_at)) {
      a.uptime = absl::UnavailableError(absl::StrCat(
          "a ptcd started ", absl::FormatDuration(*a.uptime),
          " ago answered, after this host registered"));
    }
    // Not answered, but not yet silent for its whole timeout: asked again.
    if (!a.uptime.ok() && silent <= timeout) continue;
    if (a.uptime.ok()) {
      Log("coordinator")
          ->log(silent > timeout ? spdlog::level::warn : spdlog::level::info,
                "host {}'s heartbeats are {} late, but it answered directly: "
                "alive (a busy machine?)",
                name, absl::FormatDuration(silent));
      hosts_.HeardFrom(name, now);
      probes_.Drop(name);
      continue;
    }
    hosts_.MarkDead(name);
    // Its connection would keep trying to reach the dead host; one is
    // made afresh if the host comes back and goes quiet again.
    probes_.Drop(name);
    changed = true;
    Log("coordinator")
        ->warn("host {} missed its heartbeats for {} and did not answer "
               "directly ({}); marked dead",
               name, absl::FormatDuration(silent),
               a.uptime.status().ToString());
    CancelFlightsOnLocked(name);
  }
  return changed;
}

void CoordinatorService::MonitorLoop() {
  // Hosts known from the state on disk get a full timeout from when this
  // coordinator starts watching, not from when it read them.
  const absl::Time started = absl::Now();
  while (true) {
    std::vector<std::string> retry;
    // Hosts whose heartbeats are overdue: asked directly before they are
    // declared dead, outside the lock.
    std::vector<std::pair<std::string, std::string>> overdue;
    std::vector<absl::Duration> timeouts;  // each overdue host's
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               absl::Milliseconds(200)))
        return;
      // Late heartbeats alone do not make a host dead: on a busy machine
      // (or a busy coordinator) they arrive late while the host is fine.
      // A host silent for half the timeout is asked directly, within the
      // other half; one silent for the whole timeout that also left that
      // call unanswered (or refused it) is dead, so that the verdict on a
      // host behind a cut link comes after its timeout, not twice that.
      // The calls are asked in one round and their answers judged in a
      // later one (HostProbes): a host that does not answer holds up no
      // other host's verdict and no decided commit's retry below.
      bool changed = JudgeProbesLocked(probes_.Take(), started);
      // Hosts dead for host_expiry that no job names are forgotten: the
      // registry does not grow with every machine that ever came by.
      const absl::Time now = absl::Now();
      for (const std::string& name : hosts_.Expire(
               now, options_.host_expiry,
               [&](const std::string& h) { return jobs_.NameHost(h); })) {
        Log("coordinator")
            ->info("host {} dead for over {} and used by no job; forgotten",
                   name, absl::FormatDuration(options_.host_expiry));
        probes_.Drop(name);
        changed = true;
      }
      if (changed) PersistLocked().IgnoreError();
      for (auto& [name, j] : jobs_) {
        if (j->state.commit_decided() && !j->running) retry.push_back(name);
      }
      overdue = hosts_.Overdue(now, started);
      for (const auto& [name, address] : overdue)
        timeouts.push_back(hosts_.TimeoutOf(*hosts_.Find(name)));
    }
    // A host already being asked is not asked twice; an answer is judged
    // in the next round (its heartbeat may have come meanwhile).
    for (size_t i = 0; i < overdue.size(); ++i)
      probes_.Ask(overdue[i].first, overdue[i].second, timeouts[i] / 2);
    for (const std::string& job : retry) FinishDecidedCommit(job);
  }
}

void CoordinatorService::ProverLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               absl::Milliseconds(200)))
        return;
    }
    VerifyReturnedHosts();
  }
}

grpc::Status CoordinatorService::RegisterJob(
    grpc::ServerContext* ctx, const proto::RegisterJobRequest* req,
    proto::RegisterJobResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "RegisterJob", req);
      !denied.ok())
    return denied;
  if (absl::Status s = CheckJobName(req->job()); !s.ok())
    return ToGrpcStatus(s);
  auto spec =
      JobSpec(req->model(), req->has_layout() ? &req->layout() : nullptr);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  if (absl::Status s = AddJob(*req, *std::move(spec), resp); !s.ok())
    return ToGrpcStatus(s);
  resp->set_token(IssueJobToken(req->job()));
  // The hosts prepare the memory of the job's first save while it starts
  // and trains (within their spare pools); best effort.
  proto::ReconfigureRequest first_save;
  first_save.set_job(req->job());
  first_save.set_to(req->config());
  proto::PlacementOptions* where = first_save.mutable_placement();
  where->set_strategy(proto::PLACEMENT_EXPLICIT);
  *where->mutable_rank_hosts() = resp->placement().rank_hosts();
  *where->mutable_rank_devices() = resp->placement().rank_devices();
  proto::PrepareResponse prepared;
  if (absl::Status s = DoPrepare(first_save, &prepared); !s.ok()) {
    Log("coordinator")
        ->warn("job {}: preparing memory for its first save: {}", req->job(),
               s.ToString());
  }
  return grpc::Status::OK;
}

absl::Status CoordinatorService::AddJob(const proto::RegisterJobRequest& req,
                                        std::shared_ptr<const ModelSpec> spec,
                                        proto::RegisterJobResponse* resp) {
  PTC_ASSIGN_OR_RETURN(const auto shape, JobShape(*spec, req.config()));
  PTC_RETURN_IF_ERROR(ValidateAutoPolicy(req.auto_policy(), *spec));
  absl::MutexLock lock(&mu_);
  if (jobs_.Find(req.job()) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("job '", req.job(), "' exists"));
  }
  if (jobs_.Forgetting(req.job())) {
    return absl::UnavailableError(
        absl::StrCat("job '", req.job(),
                     "' is being forgotten; register it again when that ends"));
  }
  if (req.hosts().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", req.job(), "' needs hosts to run on"));
  }
  // Where its ranks run: checked against the hosts' GPUs (those other jobs
  // use are taken) and store memory now, not when a save runs out.
  Resources res = ResourcesLocked(req.job());
  std::vector<int> candidates;
  for (const std::string& h : req.hosts()) {
    auto it = std::find(res.names.begin(), res.names.end(), h);
    if (it == res.names.end()) {
      return absl::NotFoundError(
          absl::StrCat("host '", h, "' is not registered"));
    }
    const int id = static_cast<int>(it - res.names.begin());
    if (!res.alive[id]) {
      return absl::FailedPreconditionError(
          absl::StrCat("host '", h, "' is dead; choose live hosts"));
    }
    if (std::find(candidates.begin(), candidates.end(), id) !=
        candidates.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("host '", h, "' is named twice"));
    }
    candidates.push_back(id);
  }
  PTC_ASSIGN_OR_RETURN(const std::shared_ptr<const Layout> layout,
                       layouts_.Get(spec, req.config()));
  PlacementRequest preq;
  preq.spec = spec.get();
  preq.cluster = &res.cluster;
  preq.target = layout.get();
  preq.hosts = candidates;
  preq.alive = res.alive;
  preq.taken = res.taken;
  preq.memory = res.memory;
  preq.small_objects_kept = true;  // each save keeps them (saves.cc)
  PTC_ASSIGN_OR_RETURN(const PlacementResult placed,
                       PlaceJob(req.placement(), preq, res.names));
  auto job = std::make_unique<Job>();
  job->state.set_job(req.job());
  job->state.set_model(req.has_layout() ? spec->name : req.model());
  if (req.has_layout()) *job->state.mutable_layout() = req.layout();
  job->state.set_config(req.config());
  for (const std::string& h : UsedHosts(placed, candidates, res.names))
    job->state.add_hosts(h);
  for (int r = 0; r < placed.placement.world_size(); ++r) {
    job->state.add_rank_hosts(res.names[placed.placement.host[r]]);
    job->state.add_rank_devices(placed.placement.device[r]);
  }
  for (size_t h = 0; h < placed.host_bytes.size(); ++h) {
    if (placed.host_bytes[h] > 0)
      job->host_bytes[res.names[h]] = placed.host_bytes[h];
  }
  SetPlacementSummary(placed, PlacementStrategy(req.placement()), res.names,
                      resp->mutable_placement());
  job->state.set_layout_epoch(1);
  job->state.set_next_version(1);
  *job->state.mutable_auto_policy() = req.auto_policy();
  for (const std::string& h : req.hosts()) job->state.add_pool(h);
  std::tie(job->ranks, job->state_bytes) = shape;
  job->spec = std::move(spec);
  resp->set_ranks(job->ranks);
  resp->set_state_bytes(job->state_bytes);
  // Plan epochs continue after those of a forgotten job of the same name.
  const Job* job_ptr = &jobs_.Add(std::move(job));
  Log("coordinator")
      ->info("job {} registered: {}{} {} on {} hosts ({} tensors)", req.job(),
             req.has_layout() ? "layout spec " : "", job_ptr->state.model(),
             req.config(), job_ptr->state.hosts_size(),
             job_ptr->spec->tensors.size());
  if (absl::Status s = PersistLocked(); !s.ok()) {
    // Not registered: a retry must not find it half there.
    jobs_.Discard(req.job());
    return s;
  }
  return absl::OkStatus();
}

grpc::Status CoordinatorService::ForgetJob(grpc::ServerContext* ctx,
                                           const proto::ForgetJobRequest* req,
                                           proto::ForgetJobResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "ForgetJob", req);
      !denied.ok())
    return denied;
  return ToGrpcStatus(DoForgetJob(*req, resp));
}

absl::Status CoordinatorService::DoForgetJob(const proto::ForgetJobRequest& req,
                                             proto::ForgetJobResponse* resp) {
  if (req.job().empty()) {
    return absl::InvalidArgumentError("the job name must not be empty");
  }
  std::unique_ptr<Job> gone;
  // Every live host, not only the job's: one that a change left may still
  // hold an old version if its release failed.
  std::vector<std::string> addresses;
  std::map<std::string, std::string> name_of;  // address -> host name
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.Forgetting(req.job())) {
      return absl::UnavailableError(
          absl::StrCat("job '", req.job(), "' is already being forgotten"));
    }
    Job* found = jobs_.Find(req.job());
    if (found != nullptr) {
      const Job& job = *found;
      if (job.committing_save) {
        return absl::UnavailableError(absl::StrCat(
            "job '", req.job(), "' is committing a save; try again"));
      }
      if (job.running || job.state.target_version() != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job '", req.job(), "' is being reconfigured (epoch ",
            job.state.target_epoch(), "); abort it or let it end first"));
      }
      gone = jobs_.Remove(req.job());  // retires its plan epochs
      auto_changes_.Forget(req.job());
      meetings_.Forget(req.job());
      shares_.Forget(req.job());
      if (absl::Status s = PersistLocked(); !s.ok()) {
        jobs_.Put(std::move(gone));  // nothing forgotten
        return s;
      }
    }
    for (const auto& [name, h] : hosts_.hosts()) {
      if (!h.status.alive()) continue;
      addresses.push_back(h.status.address());
      name_of[h.status.address()] = name;
    }
    jobs_.BeginForget(req.job());
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    jobs_.EndForget(req.job());
  };
  resp->set_was_registered(gone != nullptr);
  if (gone != nullptr && gone->worker.joinable()) gone->worker.join();  // ended
  absl::Mutex mu;
  int knew = 0;  // live hosts that knew the job (if only its declarations)
  OnEachAddress(addresses, [&](const std::string& address) {
    auto deleted = StoreClient::ConnectKept(address)->DeleteJob(req.job());
    absl::MutexLock lock(&mu);
    if (deleted.ok()) ++knew;
    if (deleted.ok() && deleted->versions() > 0) {
      auto* c = resp->add_cleared();
      c->set_host(name_of[address]);
      c->set_versions(deleted->versions());
      c->set_bytes(deleted->bytes());
    } else if (!deleted.ok() &&
               deleted.status().code() != absl::StatusCode::kNotFound) {
      resp->add_not_cleared(absl::StrCat(name_of[address], " (", address,
                                         "): ", deleted.status().ToString()));
    }
    return absl::OkStatus();
  }).IgnoreError();
  if (gone == nullptr && knew == 0 && resp->not_cleared_size() == 0) {
    return absl::NotFoundError(
        absl::StrCat("job '", req.job(),
                     "' is unknown to the coordinator and to every live host"));
  }
  int64_t bytes = 0;
  for (const auto& c : resp->cleared()) bytes += c.bytes();
  Log("coordinator")
      ->info("job {} forgotten: {} bytes deleted on {} hosts{}", req.job(),
             bytes, resp->cleared_size(),
             resp->not_cleared_size() > 0
                 ? absl::StrCat("; ", resp->not_cleared_size(),
                                " hosts could not be cleared")
                 : "");
  return absl::OkStatus();
}

grpc::Status CoordinatorService::ListHosts(grpc::ServerContext* ctx,
                                           const proto::ListHostsRequest* req,
                                           proto::ListHostsResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "ListHosts", req);
      !denied.ok())
    return denied;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (const auto& [name, h] : hosts_.hosts()) {
    proto::HostStatus* s = resp->add_hosts();
    *s = h.status;
    s->set_seconds_since_heartbeat(
        absl::ToDoubleSeconds(now - h.last_heartbeat));
    s->set_held_back_seconds(hosts_.HeldBack(name, now)
                                 ? absl::ToDoubleSeconds(h.held_until - now)
                                 : 0);
  }
  return grpc::Status::OK;
}

std::vector<std::string> CoordinatorService::RankHostsLocked(
    const Job& job) const {
  return RankPlacementLocked(job).first;
}

std::pair<std::vector<std::string>, std::vector<int32_t>>
CoordinatorService::RankPlacementLocked(const Job& job) const {
  const auto& s = job.state;
  if (s.rank_hosts_size() > 0 && s.rank_hosts_size() == job.ranks &&
      s.rank_devices_size() == job.ranks) {
    return {{s.rank_hosts().begin(), s.rank_hosts().end()},
            {s.rank_devices().begin(), s.rank_devices().end()}};
  }
  auto config = job.spec->ParseConfig(s.config());
  if (!config.ok()) return {};
  Cluster cluster;
  std::vector<int> ids;
  for (const std::string& name : s.hosts()) {
    const HostRegistry::Host* h = hosts_.Find(name);
    if (h == nullptr) return {};
    ids.push_back(static_cast<int>(cluster.hosts.size()));
    cluster.hosts.push_back({name, h->status.gpus(), 25e9});
  }
  auto placement = ContiguousPlacement(cluster, ids, config->world_size());
  if (!placement.ok()) return {};
  std::pair<std::vector<std::string>, std::vector<int32_t>> out;
  for (int h : placement->host) out.first.push_back(cluster.hosts[h].name);
  out.second = placement->device;
  return out;
}

CoordinatorService::Resources CoordinatorService::ResourcesLocked(
    const std::string& job) const {
  Resources r;
  const absl::Time now = absl::Now();
  for (const auto& [name, h] : hosts_.hosts()) {
    const int32_t id = static_cast<int32_t>(r.names.size());
    r.addresses[id] = h.status.address();
    r.names.push_back(name);
    r.cluster.hosts.push_back(
        {name, h.status.gpus(),
         h.status.bandwidth() > 0 ? h.status.bandwidth() : 25e9,
         h.status.domain()});
    r.alive.push_back(h.status.alive());
    r.late.push_back(hosts_.Late(h, now));
    r.memory.push_back(h.status.memory_bytes() > 0 ? h.status.memory_bytes()
                                                   : -1);
  }
  r.taken.resize(r.names.size());
  // Names are the registry's, in order: a binary search finds each one (a
  // linear one was O(ranks x hosts) for every other job of the cluster).
  auto id_of = [&](const std::string& n) {
    auto it = std::lower_bound(r.names.begin(), r.names.end(), n);
    return it != r.names.end() && *it == n
               ? static_cast<int>(it - r.names.begin())
               : static_cast<int>(r.names.size());
  };
  for (const auto& [name, j] : jobs_) {
    if (name == job) continue;
    // Its committed ranks, and its change in flight's, hold GPUs and
    // store memory until the change ends.
    const auto [hosts, devices] = RankPlacementLocked(*j);
    auto take = [&](const std::string& h, int32_t d) {
      const int id = id_of(h);
      if (id < static_cast<int>(r.names.size())) r.taken[id].push_back(d);
    };
    for (size_t i = 0; i < hosts.size() && i < devices.size(); ++i)
      take(hosts[i], devices[i]);
    const bool in_flight = j->state.target_version() != 0;
    for (int i = 0; in_flight && i < j->state.target_rank_hosts_size() &&
                    i < j->state.target_rank_devices_size();
         ++i) {
      take(j->state.target_rank_hosts(i), j->state.target_rank_devices(i));
    }
    for (const auto* bytes : {&j->host_bytes, &j->target_host_bytes}) {
      if (bytes == &j->target_host_bytes && !in_flight) continue;
      for (const auto& [h, b] : *bytes) {
        const int id = id_of(h);
        if (id < static_cast<int>(r.names.size()) && r.memory[id] >= 0)
          r.memory[id] = std::max<int64_t>(0, r.memory[id] - b);
      }
    }
  }
  return r;
}

// What ListJobs says of a job's survival: which single host or domain loss
// its placement survives (empty if its layout cannot be built).
CoordinatorService::Survival CoordinatorService::JudgeSurvival(
    const std::shared_ptr<const ModelSpec>& spec, const std::string& config,
    const Placement& placement, const Cluster& cluster,
    bool small_objects_kept) {
  Survival judged;
  auto layout = layouts_.Get(spec, config);
  if (layout.ok() && (*layout)->world_size() == placement.world_size()) {
    const SurvivalReport report =
        CheckSurvival(*spec, **layout, placement, cluster, small_objects_kept);
    judged.text = report.Describe();
    judged.any_host = report.SurvivesAnyHost();
  }
  return judged;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx,
                                          const proto::ListJobsRequest* req,
                                          proto::ListJobsResponse* resp) {
  // A job's client sees its own job only.
  std::string only;
  if (grpc::Status denied =
          Admit<proto::Coordinator>(*ctx, "ListJobs", req, &only);
      !denied.ok())
    return denied;
  // Each job's placement, to judge its survival after the lock.
  struct Placed {
    std::shared_ptr<const ModelSpec> spec;
    std::string config, key;
    Cluster cluster;
    Placement placement;
    // The coordinator keeps every small object of the committed version
    // that has no copy on a second host.
    bool small_objects_kept = false;
  };
  std::vector<Placed> placed;
  absl::ReleasableMutexLock lock(&mu_);
  for (const auto& [name, j] : jobs_) {
    if (!only.empty() && name != only) continue;
    if (req->brief()) {
      // O(1) in the job's size but for one host's ranks: what each of a
      // job's thousands of processes asks.
      proto::JobStatus* s = resp->add_jobs();
      j->Brief(req->include_layout(), s);
      if (req->host().empty()) continue;
      // The host's ranks from the job's index; a record that does not
      // place every rank (from an older coordinator) is derived and
      // scanned.
      std::string first;
      if (const std::vector<int32_t>* mine = j->RanksOn(req->host());
          mine != nullptr) {
        for (int32_t r : *mine) {
          s->add_host_ranks(r);
          s->add_host_rank_devices(j->state.rank_devices(r));
        }
        first = j->state.rank_hosts(0);
      } else {
        const auto [rank_hosts, rank_devices] = RankPlacementLocked(*j);
        for (int r = 0; r < static_cast<int>(rank_hosts.size()); ++r) {
          if (rank_hosts[r] != req->host()) continue;
          s->add_host_ranks(r);
          s->add_host_rank_devices(
              r < static_cast<int>(rank_devices.size()) ? rank_devices[r] : -1);
        }
        if (!rank_hosts.empty()) first = rank_hosts[0];
      }
      if (const HostRegistry::Host* h = first.empty() ? nullptr : hosts_.Find(first);
          h != nullptr)
        s->set_rank0_host_address(h->status.address());
      continue;
    }
    Placed& p = placed.emplace_back();
    p.spec = j->spec;
    p.config = j->state.config();
    p.key = p.config;
    if (auto kept = j->kept.find(j->state.committed_version());
        kept != j->kept.end() && kept->second->Complete()) {
      p.small_objects_kept = true;
      p.key += "|kept";
    }
    const auto [rank_hosts, rank_devices] = RankPlacementLocked(*j);
    std::map<std::string, int> id;
    for (size_t r = 0; r < rank_hosts.size(); ++r) {
      auto [it, fresh] = id.emplace(rank_hosts[r], static_cast<int>(id.size()));
      if (fresh) {
        const HostRegistry::Host* h = hosts_.Find(rank_hosts[r]);
        const std::string domain = h == nullptr ? "" : h->status.domain();
        p.cluster.hosts.push_back({rank_hosts[r], 1, 25e9, domain});
        absl::StrAppend(&p.key, "|", rank_hosts[r], "@", domain);
      }
      p.placement.host.push_back(it->second);
      p.placement.device.push_back(r < rank_devices.size() ? rank_devices[r] : 0);
      absl::StrAppend(&p.key, ",", it->second);
    }
    proto::JobStatus* s = resp->add_jobs();
    j->Describe(req->include_layout(), s);
    if (auto kept = j->kept.find(j->state.committed_version());
        kept != j->kept.end()) {
      s->set_kept_small_objects(kept->second->size());
      s->set_small_objects_to_keep(kept->second->plan().objects);
      s->set_kept_small_object_bytes(kept->second->bytes());
    }
    *s->mutable_rank_hosts() = {rank_hosts.begin(), rank_hosts.end()};
    *s->mutable_rank_devices() = {rank_devices.begin(), rank_devices.end()};
  }
  lock.Release();
  if (!only.empty() && resp->jobs().empty()) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("job '", only, "' is unknown")));
  }
  for (size_t i = 0; i < placed.size(); ++i) {
    proto::JobStatus* s = resp->mutable_jobs(static_cast<int>(i));
    const Placed& p = placed[i];
    {
      absl::MutexLock cached(&survival_mu_);
      auto it = survival_.find(s->job());
      if (it != survival_.end() && it->second.placement == p.key) {
        s->set_survival(it->second.text);
        s->set_survives_host_loss(it->second.any_host);
        continue;
      }
    }
    Survival judged = JudgeSurvival(p.spec, p.config, p.placement, p.cluster,
                                    p.small_objects_kept);
    judged.placement = p.key;
    s->set_survival(judged.text);
    s->set_survives_host_loss(judged.any_host);
    absl::MutexLock cached(&survival_mu_);
    survival_[s->job()] = std::move(judged);
  }
  if (only.empty()) {  // forgotten jobs leave the cache
    absl::MutexLock cached(&survival_mu_);
    for (auto it = survival_.begin(); it != survival_.end();) {
      const bool listed = std::any_of(
          resp->jobs().begin(), resp->jobs().end(),
          [&](const proto::JobStatus& j) { return j.job() == it->first; });
      it = listed ? std::next(it) : survival_.erase(it);
    }
  }
  return grpc::Status::OK;
}

CoordinatorService::Counts CoordinatorService::GetCounts() {
  absl::MutexLock lock(&mu_);
  Counts c;
  c.hosts_alive = hosts_.alive_count();
  c.hosts_dead = static_cast<int>(hosts_.size()) - c.hosts_alive;
  c.jobs = static_cast<int>(jobs_.size());
  for (const auto& [name, j] : jobs_)
    if (j->state.target_version() != 0) c.changes_in_flight++;
  c.probes_open = probes_.open();
  c.meeting_calls_held = static_cast<int>(held_.size());
  return c;
}

grpc::Status CoordinatorService::JobToken(grpc::ServerContext* ctx,
                                          const proto::JobTokenRequest* req,
                                          proto::JobTokenResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "JobToken", req);
      !denied.ok())
    return denied;
  if (!JobTokensEnabled()) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        "this coordinator has no token key (token_key), so it issues no job "
        "tokens; give its processes client:JOB certificates instead"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (jobs_.Find(req->job()) == nullptr) {
      return ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("job '", req->job(), "' is unknown")));
    }
  }
  resp->set_token(IssueJobToken(req->job()));
  return grpc::Status::OK;
}

}  // namespace ptc
