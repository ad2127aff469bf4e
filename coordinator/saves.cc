// Saves of CoordinatorService: BeginSave, ReportSaved and the proof a save
// must pass on its hosts before it commits (rules 1, 2 and 4 of
// coordinator_service.h), and the proof of a host that came back (rule 7).
#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/kept_small_objects.h"
#include "coordinator/reconfigure_driver.h"
#include "coordinator/save_proof.h"
#include "coordinator/saves_state.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"
#include "tensor_store/store_client.h"

namespace ptc {

namespace {

// Tells a saving rank which of its small objects to send with its report.
void AskToKeep(const KeptSmallObjects& kept, int32_t rank,
               proto::BeginSaveResponse* resp) {
  const std::vector<std::vector<std::string>>& names = kept.plan().names;
  if (rank < 0 || rank >= static_cast<int32_t>(names.size())) return;
  for (const std::string& name : names[rank])
    resp->add_keep_small_objects(name);
}

// The objects of a rank's report, checked against what BeginSave asked it
// to send (`kept`'s plan; null: the version is not a save in progress,
// which ReportSave refuses).
absl::Status CheckKeptObjects(const proto::ReportSavedRequest& req,
                              const KeptSmallObjects* kept) {
  if (req.kept_small_objects_size() == 0 || kept == nullptr)
    return absl::OkStatus();
  const std::vector<std::string>* asked = nullptr;
  if (req.rank() >= 0 &&
      req.rank() < static_cast<int32_t>(kept->plan().names.size()))
    asked = &kept->plan().names[req.rank()];
  for (const proto::KeptSmallObject& o : req.kept_small_objects()) {
    if (asked == nullptr ||
        std::find(asked->begin(), asked->end(), o.name()) == asked->end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", req.rank(), " sends small object '", o.name().substr(0, 256),
          "' to keep, but BeginSave did not ask it for that one (it asks for "
          "objects whose every copy is on the rank's host)"));
    }
    if (static_cast<int64_t>(o.bytes().size()) > kMaxKeptSmallObjectBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "small object '", o.name(), "' of rank ", req.rank(), " has ",
          o.bytes().size(), " bytes; the coordinator keeps at most ",
          kMaxKeptSmallObjectBytes, " (send none of a larger one)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CoordinatorService::CheckLayoutEpochLocked(const Job& job,
                                                        int64_t epoch,
                                                        int32_t rank) const {
  const proto::CoordinatorState::Job& s = job.state;
  if (epoch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout epoch ", epoch,
        " must be positive (read it from the job's status: Refresh)"));
  }
  if (epoch == s.layout_epoch()) return absl::OkStatus();
  if (epoch > s.layout_epoch()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout epoch ", epoch, " of job '", s.job(),
        "' does not exist yet (the job is at ", s.layout_epoch(), ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " works under layout epoch ", epoch, " of job '", s.job(),
      "', but the job is at layout epoch ", s.layout_epoch(), " (", s.config(),
      " since version ", s.committed_version(),
      "): this save is stale; Refresh and load the committed version"));
}

absl::StatusOr<CoordinatorService::Job*> CoordinatorService::SavingJobLocked(
    const std::string& name, int32_t rank, int64_t layout_epoch) {
  Job* found = jobs_.Find(name);
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("job '", name, "' is unknown"));
  Job& job = *found;
  const proto::CoordinatorState::Job& s = job.state;
  if (rank < 0 || rank >= job.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is outside the job's ", job.ranks, " ranks"));
  }
  PTC_RETURN_IF_ERROR(CheckLayoutEpochLocked(job, layout_epoch, rank));
  if (s.target_version() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name, "' is being reconfigured (epoch ", s.target_epoch(),
        ", to ", s.target_config(), "); save again after it ends"));
  }
  return &job;
}

absl::StatusOr<CoordinatorService::Job*> CoordinatorService::HotSavingJobLocked(
    const std::string& name, int32_t rank, int64_t layout_epoch,
    int64_t serial) {
  PTC_ASSIGN_OR_RETURN(Job * known, jobs_.Known(name));
  Job& job = *known;
  const proto::CoordinatorState::Job& s = job.state;
  if (!s.has_pending() || !s.pending().hot() || s.pending_serial() != serial) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the hot switch ", serial, " of job '", name, "' is no longer pending (",
        s.has_pending() ? absl::StrCat("replaced by ", s.pending_serial(), ": ",
                                       s.pending().to())
                        : "ended, or it goes through the store",
        "); follow the job"));
  }
  if (s.target_version() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", name, "' is being reconfigured (epoch ", s.target_epoch(),
        ") from its committed version; follow that change"));
  }
  if (layout_epoch != s.layout_epoch() + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a hot switch saves under layout epoch ", s.layout_epoch() + 1,
        " (the one after the job's), not ", layout_epoch));
  }
  const int ranks = s.pending().placement().rank_hosts_size();
  if (rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is outside the ", ranks, " ranks of ", s.pending().to()));
  }
  return &job;
}

KeptSmallObjects& CoordinatorService::KeptForSaveLocked(Job& job,
                                                        int64_t version,
                                                        bool hot) {
  std::shared_ptr<KeptSmallObjects>& kept = job.kept[version];
  if (kept) return *kept;
  const proto::CoordinatorState::Job& s = job.state;
  std::string config = s.config();
  std::vector<std::string> rank_hosts;
  if (hot) {
    config = s.pending().to();
    rank_hosts.assign(s.pending().placement().rank_hosts().begin(),
                      s.pending().placement().rank_hosts().end());
  } else {
    rank_hosts = RankHostsLocked(job);
  }
  if (!job.keep_plan || !job.keep_plan->For(config, rank_hosts)) {
    absl::StatusOr<KeepPlan> plan = MakeKeepPlan(*job.spec, config, rank_hosts);
    if (!plan.ok()) {
      // A placement that does not place every rank (a host unknown after
      // a restart): nothing is asked for, and the survival line says the
      // small objects are not kept.
      Log("coordinator")
          ->warn("job {}: no small objects are kept for version {}: {}",
                 s.job(), version, plan.status().ToString());
      plan = KeepPlan{config, rank_hosts, {}, 0};
    }
    job.keep_plan = std::make_shared<const KeepPlan>(*std::move(plan));
  }
  kept = std::make_shared<KeptSmallObjects>(job.keep_plan);
  return *kept;
}

grpc::Status CoordinatorService::BeginSave(grpc::ServerContext* ctx,
                                           const proto::BeginSaveRequest* req,
                                           proto::BeginSaveResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "BeginSave", req);
      !denied.ok())
    return denied;
  return ToGrpcStatus(DoBeginSave(*req, resp));
}

absl::Status CoordinatorService::DoBeginSave(const proto::BeginSaveRequest& req,
                                             proto::BeginSaveResponse* resp) {
  if (req.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", req.step(), " is negative"));
  }
  if (req.pending_serial() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pending serial ", req.pending_serial(), " is negative"));
  }
  if (req.change_serial() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("change serial ", req.change_serial(), " is negative"));
  }
  if (req.change_serial() != 0 && req.pending_serial() != 0) {
    return absl::InvalidArgumentError(
        "a save is either a hot switch's (pending serial) or one made for a "
        "pending change in the current layout (change serial), not both");
  }
  absl::MutexLock lock(&mu_);
  if (req.pending_serial() != 0) {
    // A hot switch's save: one version for every target rank.
    PTC_ASSIGN_OR_RETURN(Job * hot,
                         HotSavingJobLocked(req.job(), req.rank(),
                                            req.layout_epoch(), req.pending_serial()));
    bool opened = false;
    const int64_t version = OpenHotSave(
        *hot, req.step(), absl::ToUnixMicros(absl::Now()) / 1e6, &opened);
    if (opened) {
      PTC_RETURN_IF_ERROR(PersistLocked());
      Log("coordinator")
          ->info("job {}: hot switch to {} saves step {} as version {}",
                 req.job(), hot->state.pending().to(), req.step(), version);
    }
    resp->set_version(version);
    AskToKeep(KeptForSaveLocked(*hot, version, /*hot=*/true), req.rank(), resp);
    return absl::OkStatus();
  }
  PTC_ASSIGN_OR_RETURN(
      Job * saving, SavingJobLocked(req.job(), req.rank(), req.layout_epoch()));
  if (req.check_dropped() &&
      saving->state.dropped_save() > req.known_dropped()) {
    return absl::AbortedError(absl::StrCat(
        "version ", saving->state.dropped_save(), " of job '", req.job(),
        "' was deleted before rank ", req.rank(),
        " began its save (it knows of deletions up to version ",
        req.known_dropped(),
        "): the job's processes save again together; follow dropped_save"));
  }
  bool opened = false;
  const int64_t version =
      OpenSave(*saving, req.step(), options_.max_open_saves, &opened);
  const bool for_change =
      SaveIsForChange(*saving, req.change_serial(), version);
  if (for_change) {
    Log("coordinator")
        ->info(
            "job {}: the change to {} goes through the store from version {}",
            req.job(), saving->state.pending().to(), version);
  }
  if (opened || for_change) {
    PTC_RETURN_IF_ERROR(PersistLocked());
    Log("coordinator")
        ->info("job {}: save of step {} is version {} (layout epoch {})",
               req.job(), req.step(), version, saving->state.layout_epoch());
  }
  resp->set_version(version);
  AskToKeep(KeptForSaveLocked(*saving, version, /*hot=*/false), req.rank(),
            resp);
  return absl::OkStatus();
}

grpc::Status CoordinatorService::ReportSaved(
    grpc::ServerContext* ctx, const proto::ReportSavedRequest* req,
    proto::ReportSavedResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "ReportSaved", req);
      !denied.ok())
    return denied;
  return ToGrpcStatus(DoReportSaved(*req, resp));
}

absl::Status CoordinatorService::GiveUpSave(
    const proto::ReportSavedRequest& req) {
  // What a log line keeps of the rank's reason (a request field: any size).
  constexpr size_t kMaxReason = 1024;
  std::vector<std::string> addresses;
  std::vector<int64_t> dropped;
  {
    absl::MutexLock lock(&mu_);
    const Job* known = jobs_.Find(req.job());
    if (known != nullptr && known->state.hot_version() != 0 &&
        req.version() == known->state.hot_version()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "version ", req.version(),
          " is a hot switch's save: a process that cannot take part in the "
          "switch says so before it starts (the change then goes through "
          "the store), it does not give the save up"));
    }
    PTC_ASSIGN_OR_RETURN(Job * saving, SavingJobLocked(req.job(), req.rank(),
                                                       req.layout_epoch()));
    Job& job = *saving;
    const proto::CoordinatorState::Job& s = job.state;
    const bool open = std::any_of(
        s.open_saves().begin(), s.open_saves().end(),
        [&](const auto& o) { return o.version() == req.version(); });
    // Committed, dropped or superseded already: nothing waits for it.
    if (!open) return absl::OkStatus();
    if (job.committing_save) {
      // Every rank reported some version, which is being proven now: the
      // answer to this rank comes after it (it may be this one).
      return absl::UnavailableError(absl::StrCat(
          "job '", req.job(), "' is committing a save; give it up again"));
    }
    dropped = DropSave(job, req.version());
    PTC_RETURN_IF_ERROR(PersistLocked());
    std::set<std::string> hosts(s.hosts().begin(), s.hosts().end());
    for (const std::string& h : RankHostsLocked(job)) hosts.insert(h);
    for (const std::string& h : hosts) {
      if (const auto* host = hosts_.Find(h))
        addresses.push_back(host->status.address());
    }
  }
  Log("coordinator")
      ->warn(
          "job {}: rank {} gave up its save of version {} ({}); the "
          "version is deleted and the job's processes save again",
          req.job(), req.rank(), req.version(),
          req.failed().substr(0, kMaxReason));
  // Best effort: what a host misses here, the heartbeats reclaim (rule 6).
  for (int64_t v : dropped) ReleaseOn(addresses, req.job(), v);
  return absl::OkStatus();
}

absl::Status CoordinatorService::DoReportSaved(
    const proto::ReportSavedRequest& req, proto::ReportSavedResponse* resp) {
  if (!req.failed().empty()) return GiveUpSave(req);
  std::shared_ptr<const ModelSpec> spec;
  std::string config;
  std::vector<std::string> rank_hosts, hosts;
  int64_t previous = 0, step = 0;
  bool hot = false;
  {
    absl::MutexLock lock(&mu_);
    Job* known = jobs_.Find(req.job());
    hot = known != nullptr && known->state.hot_version() != 0 &&
          req.version() == known->state.hot_version();
    PTC_ASSIGN_OR_RETURN(
        Job * saving,
        hot ? HotSavingJobLocked(req.job(), req.rank(), req.layout_epoch(),
                                 known->state.pending_serial())
            : SavingJobLocked(req.job(), req.rank(), req.layout_epoch()));
    Job& job = *saving;
    const proto::CoordinatorState::Job& s = job.state;
    const bool open = std::any_of(
        s.open_saves().begin(), s.open_saves().end(),
        [&](const auto& o) { return o.version() == req.version(); });
    KeptSmallObjects* kept =
        open ? &KeptForSaveLocked(job, req.version(), hot) : nullptr;
    PTC_RETURN_IF_ERROR(CheckKeptObjects(req, kept));
    PTC_ASSIGN_OR_RETURN(const SaveReport report,
                         ReportSave(job, req.version(), req.rank(), hot));
    for (const proto::KeptSmallObject& o : req.kept_small_objects()) {
      if (!kept->Add(o.name(), req.rank(), o.bytes())) {
        Log("coordinator")
            ->warn(
                "job {}: version {} keeps {} bytes of small objects "
                "already; rank {}'s '{}' is not kept",
                req.job(), req.version(), kept->bytes(), req.rank(), o.name());
      }
    }
    if (!report.complete) return absl::OkStatus();
    step = report.step;
    spec = job.spec;
    if (hot) {
      // Proven where the target places its ranks; the old layout's hosts
      // release their versions after the commit.
      config = s.pending().to();
      rank_hosts.assign(s.pending().placement().rank_hosts().begin(),
                        s.pending().placement().rank_hosts().end());
    } else {
      config = s.config();
      rank_hosts = RankHostsLocked(job);
    }
    // The job's hosts, then any other host of a rank. Looked up in a set
    // (of views of the record's and rank_hosts' strings, which stay put
    // while `hosts` grows): a linear look per rank was 16,384 x 2,048
    // name comparisons per save at 2,048 hosts, under the lock.
    hosts.assign(s.hosts().begin(), s.hosts().end());
    std::set<std::string_view> named(s.hosts().begin(), s.hosts().end());
    for (const std::string& h : rank_hosts) {
      if (named.insert(h).second) hosts.push_back(h);
    }
    previous = s.committed_version();
    job.committing_save = true;  // no change starts until this ends
  }
  // Every rank reported: prove the version on every host (rule 4).
  const absl::Status proven =
      CommitSaveOnHosts(req.job(), req.version(), spec, config, rank_hosts);
  std::vector<std::string> addresses;
  std::vector<int64_t> superseded;
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(req.job());
    if (found == nullptr) {
      return absl::AbortedError(
          absl::StrCat("job '", req.job(), "' was forgotten while version ",
                       req.version(), " was being committed"));
    }
    Job& job = *found;
    proto::CoordinatorState::Job& s = job.state;
    job.committing_save = false;
    if (hot && proven.ok() && s.hot_version() != req.version()) {
      // Overtaken (a change from the committed version started meanwhile
      // is refused while committing_save; this is a forgotten pending).
      return absl::AbortedError(absl::StrCat(
          "the hot switch of job '", req.job(), "' ended before version ",
          req.version(), " committed; version ", previous, " stays"));
    }
    if (hot && proven.ok()) {
      if (absl::Status committed = CommitHotSwitchLocked(job, req.version(), step);
          !committed.ok()) {
        return Annotate(committed, absl::StrCat("committing the hot switch of job '",
                                                req.job(), "'"));
      }
      auto_changes_.Wake();
      if (previous > 0) superseded.push_back(previous);
    } else if (!proven.ok()) {
      // The save failed: its version is no longer owned, and goes.
      superseded = DropSave(job, req.version());
    } else {
      superseded = CommitSave(job, req.version(), step);
      // A change that waited for this save starts now.
      if (s.has_pending()) auto_changes_.Wake();
    }
    if (hot && !proven.ok()) s.set_hot_version(0);  // a change follows now
    PTC_RETURN_IF_ERROR(PersistLocked());
    auto a = hosts_.Addresses(hosts);
    if (a.ok()) addresses = *std::move(a);
  }
  // Best effort: what a host misses here, the heartbeats reclaim (rule 6).
  std::set<std::string> unique(addresses.begin(), addresses.end());
  for (int64_t v : superseded)
    ReleaseOn({unique.begin(), unique.end()}, req.job(), v);
  if (!proven.ok()) {
    Log("coordinator")
        ->error("job {}: the save of version {} failed and was deleted: {}",
                req.job(), req.version(), proven.ToString());
    return Annotate(proven,
                    absl::StrCat("version ", req.version(),
                                 " cannot commit and was deleted; version ",
                                 previous, " stays; save again"));
  }
  Log("coordinator")
      ->info("job {} version {} (step {}) committed by all ranks{}", req.job(),
             req.version(), step, hot ? absl::StrCat(": the hot switch to ",
                                                     config, " committed")
                                      : "");
  resp->set_committed(true);
  return absl::OkStatus();
}

absl::Status CoordinatorService::CommitSaveOnHosts(
    const std::string& job, int64_t version,
    const std::shared_ptr<const ModelSpec>& spec, const std::string& config,
    const std::vector<std::string>& rank_hosts) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<const Layout> layout,
                       layouts_.Get(spec, config));
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<const Shares> shares,
                       shares_.Get(job, spec, config, *layout, rank_hosts));
  std::vector<std::string> names, addresses;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, share] : *shares) {
      if (!hosts_.Alive(name)) {
        return absl::FailedPreconditionError(
            absl::StrCat("host ", name, " of the placement is ",
                         hosts_.Find(name) == nullptr ? "unknown" : "dead",
                         ": it cannot prove that it holds its share"));
      }
      names.push_back(name);
      addresses.push_back(hosts_.Find(name)->status.address());
    }
  }
  absl::flat_hash_map<absl::string_view, size_t> index_of;
  for (size_t i = 0; i < addresses.size(); ++i) index_of[addresses[i]] = i;
  std::map<std::string, proto::CommitVersionResponse> answers;
  absl::Mutex mu;
  PTC_RETURN_IF_ERROR(OnEachAddress(addresses, [&](const std::string& a) {
    const size_t i = index_of.at(a);
    const HostShare& share = shares->at(names[i]);
    // By id where the host was sent its expectations under this placement;
    // whole where not, or where it no longer keeps them (it restarted).
    bool whole = !shares_.Sent(job, names[i], share.id);
    auto store = StoreClient::ConnectKept(a);
    auto r = store->CommitChecked(
        ShareRequest(job, version, *spec, *layout, share, whole));
    if (r.ok() && r->expectations_unknown() && !whole) {
      whole = true;
      r = store->CommitChecked(
          ShareRequest(job, version, *spec, *layout, share, whole));
    }
    if (r.ok() && r->expectations_unknown())
      r = absl::InternalError("it does not keep the expectations it was sent");
    if (!r.ok()) {
      return Annotate(r.status(), absl::StrCat("host ", names[i], " (", a,
                                               ") cannot commit it"));
    }
    if (whole) shares_.MarkSent(job, names[i], share.id, true);
    static Counter& sent_whole =
        GetCounter(R"(ptc_save_proof_requests_total{expectations="whole"})");
    static Counter& sent_by_id =
        GetCounter(R"(ptc_save_proof_requests_total{expectations="by_id"})");
    (whole ? sent_whole : sent_by_id).Add();
    absl::MutexLock lock(&mu);
    answers[names[i]] = *std::move(r);
    return absl::OkStatus();
  }));
  // Replicas on different hosts must agree (on one host the client checks).
  return CheckReplicas(*spec, *layout, *shares, answers);
}

void CoordinatorService::VerifyReturnedHosts() {
  struct Proof {
    std::string host, address, job;
    int64_t version;
    std::shared_ptr<const ModelSpec> spec;
    std::string config;
    std::vector<std::string> rank_hosts;
  };
  std::vector<Proof> proofs;
  std::vector<std::string> done;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& host : hosts_.to_prove()) {
      if (!hosts_.Alive(host)) continue;
      bool any = false;
      for (const auto& [name, job] : jobs_) {
        const auto& s = job->state;
        const auto& lost = s.lost_hosts();
        if (s.target_version() != 0 || s.committed_version() <= 0 ||
            std::find(lost.begin(), lost.end(), host) == lost.end())
          continue;
        any = true;
        proofs.push_back({host, hosts_.Find(host)->status.address(), name,
                          s.committed_version(), job->spec, s.config(),
                          RankHostsLocked(*job)});
      }
      if (!any) done.push_back(host);
    }
    for (const std::string& h : done) hosts_.Proven(h);
  }
  for (const Proof& p : proofs) {
    auto layout = layouts_.Get(p.spec, p.config);
    auto shares = layout.ok() ? shares_.Get(p.job, p.spec, p.config, **layout,
                                            p.rank_hosts)
                              : layout.status();
    absl::Status s = shares.status();
    if (s.ok() && (*shares)->count(p.host)) {
      // Sealing is right: the coordinator committed this version. Whole:
      // the host is back, and keeps nothing it was sent before.
      const HostShare& share = (*shares)->at(p.host);
      s = StoreClient::ConnectKept(p.address)
              ->CommitChecked(ShareRequest(p.job, p.version, *p.spec, **layout,
                                           share, /*whole=*/true))
              .status();
      shares_.MarkSent(p.job, p.host, share.id, s.ok());
    }
    absl::MutexLock lock(&mu_);
    Job* j = jobs_.Find(p.job);
    if (j == nullptr || j->state.committed_version() != p.version)
      continue;  // the job moved on meanwhile; tried again next round
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      // Not an answer (a busy machine, a host just back): asked again at
      // the monitor's next round, still to be proven.
      Log("coordinator")
          ->info("job {}: host {} did not answer the proof of its share of "
                 "version {} ({}); asking again",
                 p.job, p.host, p.version, s.ToString());
      continue;
    }
    auto* lost = j->state.mutable_lost_hosts();
    if (s.ok()) {
      lost->erase(std::remove(lost->begin(), lost->end(), p.host), lost->end());
      Log("coordinator")
          ->info(
              "job {}: host {} proved its share of version {}; it is a "
              "source again",
              p.job, p.host, p.version);
    } else {
      Log("coordinator")
          ->warn(
              "job {}: host {} is back but does not hold its share of "
              "version {} ({}); it stays lost",
              p.job, p.host, p.version, s.ToString());
    }
    // Either way this host is settled for this job.
    hosts_.Proven(p.host);
    PersistLocked().IgnoreError();
  }
}

}  // namespace ptc
