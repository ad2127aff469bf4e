// Reconfigure, Watch, Abort and restart recovery of CoordinatorService.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/authz.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/job_placement.h"
#include "plan/plan_flows.h"
#include "plan/plan_proto.h"
#include "plan/plan_scenario.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "plan/snapshot_plan.h"
#include "proto/enum_names.h"
#include "ptc/packs.h"
#include "tensor_store/store_client.h"

namespace ptc {
namespace {

Counter& reconfigurations_committed = GetCounter(
    R"(ptc_coordinator_reconfigurations_total{outcome="committed"})");
Counter& reconfigurations_aborted =
    GetCounter(R"(ptc_coordinator_reconfigurations_total{outcome="aborted"})");
Counter& bytes_from_peers_total =
    GetCounter("ptc_coordinator_bytes_from_peers_total");
// Time in each phase of committed changes, summed (divide by the committed
// count for the mean).
Counter& phase_millis_staging =
    GetCounter(R"(ptc_coordinator_phase_milliseconds_total{phase="staging"})");
Counter& phase_millis_verifying = GetCounter(
    R"(ptc_coordinator_phase_milliseconds_total{phase="verifying"})");
Counter& phase_millis_total =
    GetCounter(R"(ptc_coordinator_phase_milliseconds_total{phase="all"})");

}  // namespace

// One reconfiguration in flight; owns what the driver's request points to.
struct CoordinatorService::Flight {
  std::string job;
  PlanScenario scenario;
  PlanInput input;
  Plan plan;
  ReconfigureRequest request;
  // The snapshot the change reads from, if any.
  std::shared_ptr<const SnapshotUse> snapshot;
  // The copies the coordinator keeps of the source version's small
  // objects (the plan's kept_rank), or null.
  std::shared_ptr<const KeptSmallObjects> kept;
  // The target's version and what its ranks keep at the coordinator (null:
  // nothing), and those of its objects to keep that the plan copies from
  // a live source rank, read from there during the change (RunFlight).
  int64_t source_version = 0, target_version = 0;
  std::shared_ptr<const KeepPlan> keep;
  std::vector<ToKeep> to_read;
};

namespace {

bool Final(const proto::ReconfigureEvent& e) {
  return PhaseEnded(e.phase());
}

// A change's validated plan for `input` by `strategy`, its snapshot pieces
// split along the snapshot's regions when it reads one.
absl::StatusOr<Plan> PlanFor(const PlanInput& input,
                             proto::PlanStrategy strategy,
                             const proto::SnapshotManifest* snapshot) {
  Plan plan;
  switch (strategy) {
    case proto::PLAN_STRATEGY_TENPLEX: {
      PTC_ASSIGN_OR_RETURN(plan, PlanTenplexBaseline(input));
      break;
    }
    case proto::PLAN_STRATEGY_PTC: {
      PTC_ASSIGN_OR_RETURN(plan, PlanReconfiguration(input));
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy ", strategy, " is unknown; use ptc (0) or tenplex (1)"));
  }
  if (snapshot != nullptr)
    PTC_RETURN_IF_ERROR(SplitSnapshotPieces(*snapshot, &plan));
  PTC_RETURN_IF_ERROR(
      Annotate(ValidatePlan(input, plan), "internal planner error"));
  return plan;
}

}  // namespace

grpc::Status CoordinatorService::Reconfigure(
    grpc::ServerContext* ctx, const proto::ReconfigureRequest* req,
    proto::ReconfigureResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Reconfigure", req);
      !denied.ok())
    return denied;
  const absl::Status s = DoReconfigure(*req, resp);
  if (!s.ok())
    Log("coordinator")->warn("reconfigure {}: {}", req->job(), s.ToString());
  return ToGrpcStatus(s);
}

// A change planned for a job, not started.
struct CoordinatorService::Planned {
  std::shared_ptr<Flight> flight;
  std::string from;
  std::vector<std::string> names;  // host id -> name
  std::vector<std::string> to_hosts;
  std::vector<int> from_ids;
  std::vector<bool> alive;
  std::map<int32_t, std::string> addresses;  // host id -> ptcd address
  int64_t committed = 0, epoch = 0;
  // Where the target ranks run.
  PlacementResult placement;
  std::string placement_strategy;
};

absl::Status CoordinatorService::GatherChangeLocked(
    const proto::ReconfigureRequest& req, bool need_committed,
    const SnapshotUse* snapshot, Planned& out, ChangeInputs& in) {
  const bool restore = snapshot != nullptr && snapshot->restore;
  std::shared_ptr<const ModelSpec>& spec = in.spec;
  std::string& from = out.from;
  std::vector<std::string>& names = out.names;
  std::vector<std::string>& from_hosts = in.from_hosts;
  std::vector<std::string>& to_hosts = out.to_hosts;
  Resources& res = in.res;
  auto& source_ranks = in.source_ranks;
  std::vector<bool>& alive = out.alive;
  std::vector<std::string>& lost = in.lost;
  std::map<int32_t, std::string>& addresses = out.addresses;
  int64_t& committed = out.committed;
  int64_t& epoch = out.epoch;
  Job* found = jobs_.Find(req.job());
  if (found == nullptr)
    return absl::NotFoundError(
        absl::StrCat("job '", req.job(), "' is unknown"));
  Job& job = *found;
  if (job.state.target_version() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", req.job(), "' is already being reconfigured (epoch ",
        job.state.target_epoch(), "); watch it or abort it first"));
  }
  if (job.committing_save) {
    // ABORTED, as when the job changes while the change is planned: the
    // caller asks again (ptcctl does, for a while).
    return absl::AbortedError(absl::StrCat(
        "job '", req.job(),
        "' is committing a save that every rank reported; try again in a "
        "moment (the change then starts from it)"));
  }
  if (need_committed && job.state.committed_version() <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", req.job(),
                     "' has no committed state yet: every rank must save and "
                     "report first (a live job: ask for the change after "
                     "its processes' next save, ptcctl reconfigure "
                     "--after-save)"));
  }
  if (job.worker.joinable())
    in.finished = std::move(job.worker);  // ended: PlanChange joins it
  spec = job.spec;
  from = job.state.config();
  from_hosts.assign(job.state.hosts().begin(), job.state.hosts().end());
  source_ranks = RankPlacementLocked(job);
  res = ResourcesLocked(req.job());
  if (restore) {
    // The source is the snapshot's layout on a host of its own that
    // holds nothing live: every piece comes from disk.
    from = snapshot->manifest.config();
    from_hosts = {std::string(kSnapshotHostName)};
    source_ranks = {};
    res.names.push_back(kSnapshotHostName);
    res.cluster.hosts.push_back({kSnapshotHostName, 1 << 20, 25e9});
    res.alive.push_back(false);
    res.late.push_back(false);
    res.taken.emplace_back();
    res.memory.push_back(0);
  }
  names = res.names;
  alive = res.alive;
  addresses = res.addresses;
  lost.assign(job.state.lost_hosts().begin(), job.state.lost_hosts().end());
  if (req.hosts().empty()) {
    for (const std::string& h : from_hosts) {
      if (hosts_.Alive(h))
        to_hosts.push_back(h);
    }
  } else {
    to_hosts.assign(req.hosts().begin(), req.hosts().end());
  }
  committed = job.state.committed_version();
  if (auto it = job.kept.find(committed); it != job.kept.end())
    in.kept = it->second;
  epoch = job.state.last_epoch() + 1;
  return absl::OkStatus();
}

absl::StatusOr<CoordinatorService::Planned> CoordinatorService::PlanChange(
    const proto::ReconfigureRequest& req, bool need_committed,
    const SnapshotUse* snapshot) {
  // Gather what planning needs, then plan without holding the lock.
  Planned out;
  ChangeInputs in;
  absl::Status gathered;
  {
    absl::MutexLock lock(&mu_);
    gathered = GatherChangeLocked(req, need_committed, snapshot, out, in);
  }
  if (in.finished.joinable()) in.finished.join();
  PTC_RETURN_IF_ERROR(gathered);
  const std::shared_ptr<const ModelSpec>& spec = in.spec;
  const std::vector<std::string>& names = out.names;
  const std::vector<std::string>& from_hosts = in.from_hosts;
  std::vector<std::string>& to_hosts = out.to_hosts;
  const Resources& res = in.res;
  const auto& source_ranks = in.source_ranks;
  const std::vector<bool>& alive = out.alive;
  const std::vector<std::string>& lost = in.lost;
  const int64_t committed = out.committed;
  // Host ids by name: one lookup per rank of a 16,384-rank source, not a
  // scan over every host.
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < names.size(); ++i)
    index.emplace(names[i], static_cast<int>(i));
  auto id_of = [&](const std::vector<std::string>& list)
      -> absl::StatusOr<std::vector<int>> {
    std::vector<int> ids;
    ids.reserve(list.size());
    for (const std::string& n : list) {
      auto it = index.find(n);
      if (it == index.end())
        return absl::NotFoundError(
            absl::StrCat("host '", n, "' is not registered"));
      ids.push_back(it->second);
    }
    return ids;
  };
  PTC_ASSIGN_OR_RETURN(out.from_ids, id_of(from_hosts));
  const std::vector<int>& from_ids = out.from_ids;
  PTC_ASSIGN_OR_RETURN(std::vector<int> to_ids, id_of(to_hosts));
  for (int id : to_ids) {
    if (!alive[id]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target host '", names[id], "' is dead; choose live hosts"));
    }
  }
  auto flight = std::make_shared<Flight>();
  flight->job = req.job();
  PTC_ASSIGN_OR_RETURN(flight->scenario,
                       MakePlanScenario(spec, &layouts_, out.from, from_ids,
                                        req.to(), to_ids, res.cluster, alive));
  PlanScenario& scenario = flight->scenario;
  // The committed ranks run where the job's placement put them.
  if (static_cast<int>(source_ranks.first.size()) ==
      scenario.source().world_size()) {
    Placement p;
    PTC_ASSIGN_OR_RETURN(const std::vector<int> ids, id_of(source_ranks.first));
    p.host = ids;
    p.device = source_ranks.second;
    scenario.source_placement = std::move(p);
  }
  // Hosts that restarted (or came back unverified) hold nothing of the
  // committed version: the planner takes nothing from them, and names
  // them if a region has no other copy.
  std::vector<int> lost_ids;
  for (const std::string& h : lost) {
    if (auto it = index.find(h); it != index.end())
      lost_ids.push_back(it->second);
  }
  // Where the target ranks run: the candidates are to_ids.
  PlacementRequest where;
  where.spec = &scenario.spec;
  where.cluster = &scenario.cluster;
  where.target = &scenario.target();
  where.hosts = to_ids;
  if (committed > 0) {
    where.source = &scenario.source();
    where.source_placement = &scenario.source_placement;
  }
  where.alive = alive;
  where.source_lost = lost_ids;
  where.taken = res.taken;
  where.memory = res.memory;
  // Each save keeps what a host alone holds of the small objects.
  where.small_objects_kept = true;
  PTC_ASSIGN_OR_RETURN(out.placement, PlaceJob(req.placement(), where, names));
  out.placement_strategy = PlacementStrategy(req.placement());
  scenario.target_placement = out.placement.placement;
  to_hosts = UsedHosts(out.placement, to_ids, names);
  flight->input = scenario.input();
  flight->input.source_lost = lost_ids;
  if (in.kept != nullptr && in.kept->size() > 0) {
    flight->input.kept = [kept = in.kept](const std::string& name,
                                          int32_t rank) {
      return kept->Find(name, rank) != nullptr;
    };
  }
  flight->kept = in.kept;
  flight->input.late = res.late;
  for (size_t h = 0; h < res.late.size(); ++h) {
    if (res.late[h]) {
      Log("coordinator")
          ->warn("job {}: host {}'s heartbeats are late; it sends only what "
                 "no other live host holds",
                 req.job(), names[h]);
    }
  }
  if (snapshot != nullptr) {
    PTC_RETURN_IF_ERROR(CheckSnapshotFitsSpec(snapshot->manifest, *spec));
    flight->input.snapshot_source = true;
    flight->snapshot = std::make_shared<const SnapshotUse>(*snapshot);
  }
  PTC_ASSIGN_OR_RETURN(
      flight->plan,
      PlanFor(flight->input, req.strategy(),
              snapshot != nullptr ? &snapshot->manifest : nullptr));
  out.flight = std::move(flight);
  return out;
}

absl::Status CoordinatorService::DoReconfigure(
    const proto::ReconfigureRequest& req, proto::ReconfigureResponse* resp,
    const std::string& reason, std::shared_ptr<Planned> advised) {
  if (req.parallel_pulls() < 0 || req.parallel_pulls() > kMaxParallelPulls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel pulls ", req.parallel_pulls(), " is out of range; use 1 to ",
        kMaxParallelPulls, " (0: the default, 4)"));
  }
  if (!proto::Transport_IsValid(req.transport())) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport ", req.transport(),
                     " is unknown; use auto (0), ucx (1) or grpc (2)"));
  }
  // A change after the processes' save may be asked before any save.
  // The advisor's plan of this request is started as it is: what it read
  // of the job is checked again as the change starts (StartChange: the
  // committed version, no change or save's commit under way; StartFlight:
  // its plan epoch still unused), as for a plan made here.
  absl::StatusOr<Planned> planned =
      advised != nullptr && !req.after_save()
          ? absl::StatusOr<Planned>(std::move(*advised))
          : PlanChange(req, !req.after_save());
  if (!planned.ok() &&
      HasPlanFailure(planned.status(), PlanFailure::kNoSurvivingCopy)) {
    // Some region lives on no host: from the job's snapshot, if it has one
    // of the committed version.
    std::string root;
    int64_t committed = 0;
    std::vector<std::string> readers(req.hosts().begin(), req.hosts().end());
    {
      absl::MutexLock lock(&mu_);
      Job* found = jobs_.Find(req.job());
      if (found != nullptr) {
        root = found->state.snapshot_root();
        committed = found->state.committed_version();
        readers.insert(readers.end(), found->state.hosts().begin(),
                       found->state.hosts().end());
      }
    }
    if (!root.empty()) {
      auto use = ReadSnapshotVia(req.job(), root, readers);
      if (!use.ok()) {
        planned = Annotate(planned.status(),
                           absl::StrCat("", use.status().message(), "; and"));
      } else if (use->manifest.version() != committed) {
        planned = absl::FailedPreconditionError(absl::StrCat(
            planned.status().message(), ". The newest snapshot (", use->dir,
            ") holds version ", use->manifest.version(), " (step ",
            use->manifest.step(), "), not the committed version ", committed,
            ": `ptcctl restore --job ", req.job(), " --from ", root,
            " --config ... --hosts ...` rolls the job back to it"));
      } else {
        Log("coordinator")
            ->info("job {}: regions no live host holds come from snapshot {}",
                   req.job(), use->dir);
        planned = PlanChange(req, true, &*use);
      }
    }
  }
  PTC_RETURN_IF_ERROR(planned.status());
  if (req.after_save()) {
    // Planned to prove it can run; it starts from the processes' save.
    bool hot = false;
    {
      absl::MutexLock lock(&mu_);
      PTC_ASSIGN_OR_RETURN(Job * job, jobs_.Known(req.job()));
      std::vector<std::string> rank_hosts;
      std::vector<int32_t> rank_devices;
      for (size_t r = 0; r < planned->placement.placement.host.size(); ++r) {
        rank_hosts.push_back(
            planned->names[planned->placement.placement.host[r]]);
        rank_devices.push_back(planned->placement.placement.device[r]);
      }
      PTC_RETURN_IF_ERROR(
          SetPendingLocked(*job, req, reason, rank_hosts, rank_devices));
      hot = job->state.pending().hot();
      resp->set_source_version(job->state.committed_version());
      *resp->mutable_plan() = SummaryToProto(planned->flight->plan.summary);
      SetPlacementSummary(planned->placement, planned->placement_strategy,
                          planned->names, resp->mutable_plan());
    }
    // Until that save, the target hosts get the memory the change will
    // write ready (what their stores will stage; for a hot switch, the
    // new layout's whole first save), so that the pause after the save
    // does not fault in fresh pages; best effort, within their spare pools,
    // and briefly (a host that does not answer at once is left out).
    proto::PrepareResponse prepared;
    if (absl::Status s = PrepareTargets(req, *planned, hot,
                                        absl::Seconds(2), &prepared);
        !s.ok()) {
      Log("coordinator")
          ->warn("job {}: preparing memory for the pending change: {}",
                 req.job(), s.ToString());
    }
    return absl::OkStatus();
  }
  return StartChange(req, *std::move(planned), resp, reason);
}

absl::StatusOr<CoordinatorService::Outline> CoordinatorService::OutlineOf(
    const proto::ReconfigureRequest& req, std::shared_ptr<Planned>* keep) {
  PTC_ASSIGN_OR_RETURN(Planned planned, PlanChange(req, false));
  Outline outline{planned.flight->plan.summary,
                  planned.placement.survival.SurvivesAnyHost()};
  if (keep != nullptr) *keep = std::make_shared<Planned>(std::move(planned));
  return outline;
}

absl::Status CoordinatorService::PlanAndStart(
    const proto::ReconfigureRequest& req, bool need_committed,
    const SnapshotUse* snapshot, proto::ReconfigureResponse* resp) {
  PTC_ASSIGN_OR_RETURN(Planned planned,
                       PlanChange(req, need_committed, snapshot));
  return StartChange(req, std::move(planned), resp);
}

void CoordinatorService::ConnectDriver(const proto::ReconfigureRequest& req,
                                       const Planned& planned) {
  Flight* flight = planned.flight.get();
  const bool restore = flight->snapshot && flight->snapshot->restore;
  const std::vector<std::string>& names = planned.names;
  ReconfigureRequest& r = flight->request;
  r.input = &flight->input;
  r.plan = &flight->plan;
  r.job = req.job();
  r.source_version = planned.committed;
  r.plan_epoch = planned.epoch;
  r.is_alive = [this, names](int32_t host) {
    absl::MutexLock lock(&mu_);
    return hosts_.Alive(names[host]);
  };
  r.addresses = planned.addresses;
  r.parallel_pulls = req.parallel_pulls() > 0 ? req.parallel_pulls() : 4;
  r.transport = req.transport();
  // A source silent past its own timeout is dead to the coordinator;
  // its targets wait a little longer (its death cancels the change or
  // moves them to other holders), up to an hour. Each source keeps the
  // interval it was last told until its next heartbeat: right after a
  // cluster shrinks that is longer than today's, so the sources' own
  // timeouts bound the wait, not the registry's current one.
  std::vector<std::string> sources;
  for (int id : planned.from_ids) sources.push_back(names[id]);
  absl::Duration host_timeout;
  {
    absl::MutexLock lock(&mu_);
    host_timeout = hosts_.LongestTimeoutOf(sources);
  }
  r.peer_timeout = std::min(std::max(2 * host_timeout, absl::Seconds(1)),
                            absl::Hours(1));
  if (req.strategy() == proto::PLAN_STRATEGY_PTC) {
    // A source found unreachable at the start is planned around (the
    // driver marks it late; the Tenplex-style baseline ignores that); the
    // job's event shows the plan that runs.
    r.replan = [this, name = req.job(), snapshot = flight->snapshot,
                placement = planned.placement,
                strategy = planned.placement_strategy,
                names](const PlanInput& input) -> absl::StatusOr<Plan> {
      PTC_ASSIGN_OR_RETURN(
          Plan plan,
          PlanFor(input, proto::PLAN_STRATEGY_PTC,
                  snapshot != nullptr ? &snapshot->manifest : nullptr));
      proto::PlanSummary summary = SummaryToProto(plan.summary);
      SetPlacementSummary(placement, strategy, names, &summary);
      absl::MutexLock lock(&mu_);
      Job* found = jobs_.Find(name);
      if (found != nullptr) {
        *found->event.mutable_plan() = summary;
        found->event.set_replanned(true);
      }
      return plan;
    };
  }
  r.heard_lately = [this, names](int32_t host) {
    absl::MutexLock lock(&mu_);
    const HostRegistry::Host* h = hosts_.Find(names[host]);
    return h != nullptr &&
           absl::Now() - h->last_heartbeat <= hosts_.IntervalOf(*h) * 3 / 2;
  };
  if (flight->kept) {
    r.kept_copy = [kept = flight->kept](const std::string& name, int32_t rank) {
      return kept->Find(name, rank);
    };
  }
  if (flight->snapshot) {
    r.snapshot = &flight->snapshot->manifest;
    r.snapshot_dir = flight->snapshot->dir;
    // Nothing of a restore's source lives on a host to release.
    r.keep_source = restore;
  }
}

FlightTarget CoordinatorService::TargetOf(const Planned& planned,
                                          const Job& job,
                                          const std::string& reason) {
  const Flight& flight = *planned.flight;
  const bool restore = flight.snapshot && flight.snapshot->restore;
  const std::vector<std::string>& names = planned.names;
  FlightTarget target;
  target.config = flight.scenario.target().config()->ToString();
  const Placement& placed = planned.placement.placement;
  for (int rank = 0; rank < placed.world_size(); ++rank) {
    target.rank_hosts.push_back(names[placed.host[rank]]);
    target.rank_devices.push_back(placed.device[rank]);
  }
  target.hosts = planned.to_hosts;
  target.epoch = planned.epoch;
  target.step = restore ? flight.snapshot->manifest.step()
                        : job.state.committed_step();
  target.restore_dir = restore ? flight.snapshot->dir : "";
  for (int id : planned.from_ids) {
    if (planned.alive[id]) target.release_hosts.push_back(names[id]);
  }
  target.reason = reason;
  return target;
}

absl::Status CoordinatorService::DecideChange(const std::string& name) {
  PauseAtFailpoint("before_decision");
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(name);
    if (found == nullptr || found->cancel) {
      return absl::CancelledError(
          "the reconfiguration was aborted before its decision");
    }
    Job& j = *found;
    const proto::CoordinatorState::Job before = j.state;
    PTC_RETURN_IF_ERROR(DecideFlight(j.state, j.event));
    if (absl::Status persisted = PersistLocked(); !persisted.ok()) {
      // Undecided: the driver aborts the staged version.
      j.state = before;
      return persisted;
    }
  }
  PauseAtFailpoint("after_decision");
  return absl::OkStatus();
}

absl::Status CoordinatorService::StartChange(
    const proto::ReconfigureRequest& req, Planned planned,
    proto::ReconfigureResponse* resp, const std::string& reason) {
  std::shared_ptr<Flight> flight = planned.flight;
  const std::vector<std::string>& names = planned.names;
  const std::vector<std::string>& to_hosts = planned.to_hosts;
  const int64_t committed = planned.committed, epoch = planned.epoch;
  ReconfigureRequest& r = flight->request;
  ConnectDriver(req, planned);
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(req.job());
    if (found == nullptr) {
      return absl::AbortedError(absl::StrCat(
          "job '", req.job(), "' was forgotten while the change was planned"));
    }
    Job& job = *found;
    if (job.state.target_version() != 0 || job.committing_save ||
        job.state.committed_version() != committed) {
      return absl::AbortedError("the job changed while planning; try again");
    }
    // Rule 1: the change's version is a new number, never a save's.
    FlightTarget target = TargetOf(planned, job, reason);
    target.version = job.NewVersion();
    r.target_version = target.version;
    const proto::CoordinatorState::Job before = job.state;
    job.ArchiveEvent();
    if (absl::Status started = StartFlight(target, job.state, job.event);
        !started.ok()) {
      job.state = before;
      return started;
    }
    if (absl::Status persisted = PersistLocked(); !persisted.ok()) {
      // Not started: nothing may act on a change the store does not hold.
      job.state = before;
      job.event.set_phase(proto::PHASE_ABORTED);
      job.event.set_error(std::string(persisted.message()));
      return persisted;
    }
    job.target_host_bytes.clear();
    for (size_t h = 0; h < planned.placement.host_bytes.size(); ++h) {
      if (planned.placement.host_bytes[h] > 0)
        job.target_host_bytes[names[h]] = planned.placement.host_bytes[h];
    }
    job.cancel = false;
    job.cancel_reason.clear();
    job.ClearPending();
    if (flight->snapshot) job.event.set_snapshot_dir(flight->snapshot->dir);
    job.event.set_hosts_total(
        static_cast<int32_t>(flight->plan.fragments.size()));
    *job.event.mutable_plan() = SummaryToProto(flight->plan.summary);
    SetPlacementSummary(planned.placement, planned.placement_strategy, names,
                        job.event.mutable_plan());
    // For pictures of the change: the bytes between hosts, and each target
    // host's progress against its share.
    const PlanInput& input = *r.input;
    auto name_of = [&](int32_t h) -> std::string {
      if (h == kFromSnapshot) return "snapshot";
      return h >= 0 && h < static_cast<int>(names.size()) ? names[h] : "?";
    };
    for (const HostFlow& f : HostFlows(input, flight->plan)) {
      proto::PlanSummary::HostFlow* p = job.event.mutable_plan()->add_flows();
      p->set_from(name_of(f.from));
      p->set_to(name_of(f.to));
      p->set_bytes(f.bytes);
    }
    const std::vector<int64_t> shares = FragmentBytes(input, flight->plan);
    for (size_t i = 0; i < flight->plan.fragments.size(); ++i) {
      proto::ReconfigureEvent::HostProgress* p = job.event.add_host_progress();
      p->set_host(name_of(flight->plan.fragments[i].host));
      p->set_bytes_total(shares[i]);
    }
    // The objects the target keeps (every copy on one host) that the plan
    // copies from a live source rank: read from there during the change.
    flight->source_version = committed;
    flight->target_version = target.version;
    if (absl::StatusOr<KeepPlan> keep =
            MakeKeepPlan(*job.spec, target.config, target.rank_hosts);
        keep.ok() && keep->objects > 0) {
      flight->keep = std::make_shared<const KeepPlan>(*keep);
      for (const SmallObjectMove& m : flight->plan.small_objects) {
        const auto address = r.addresses.find(m.source_host);
        if (m.source_host < 0 || address == r.addresses.end() ||
            m.target_rank < 0 ||
            m.target_rank >= static_cast<int32_t>(keep->names.size()))
          continue;
        const std::vector<std::string>& names = keep->names[m.target_rank];
        if (std::find(names.begin(), names.end(), m.name) != names.end()) {
          flight->to_read.push_back(
              {m.target_rank, m.name, address->second, m.source_rank});
        }
      }
    }
    r.cancel = &job.cancel;
    r.before_commit = [this, name = req.job()] { return DecideChange(name); };
    job.running = true;
    job.worker = std::thread([this, flight] { RunFlight(flight); });
  }
  resp->set_plan_epoch(epoch);
  resp->set_source_version(committed);
  resp->set_target_version(r.target_version);
  *resp->mutable_plan() = SummaryToProto(flight->plan.summary);
  SetPlacementSummary(planned.placement, planned.placement_strategy, names,
                      resp->mutable_plan());
  Log("coordinator")
      ->info("job {} epoch {}: {} -> {} on {} hosts ({} bytes across hosts)",
             req.job(), epoch, planned.from, req.to(), to_hosts.size(),
             flight->plan.summary.cross_host_bytes);
  return absl::OkStatus();
}

grpc::Status CoordinatorService::Prepare(grpc::ServerContext* ctx,
                                         const proto::ReconfigureRequest* req,
                                         proto::PrepareResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Prepare", req);
      !denied.ok())
    return denied;
  const absl::Status s = DoPrepare(*req, resp);
  if (!s.ok())
    Log("coordinator")->warn("prepare {}: {}", req->job(), s.ToString());
  return ToGrpcStatus(s);
}

absl::Status CoordinatorService::DoPrepare(const proto::ReconfigureRequest& req,
                                           proto::PrepareResponse* resp) {
  // A job's first save may still be coming: the change is planned from
  // its registered layout all the same.
  PTC_ASSIGN_OR_RETURN(Planned planned, PlanChange(req, false));
  return PrepareTargets(req, planned, /*all=*/false, absl::Seconds(30), resp);
}

absl::Status CoordinatorService::PrepareTargets(
    const proto::ReconfigureRequest& req, const Planned& planned, bool all,
    absl::Duration timeout, proto::PrepareResponse* resp) {
  const Plan& plan = planned.flight->plan;
  const ModelSpec& spec = *planned.flight->input.spec;
  // What each target host will stage: its held regions, except those it
  // already stores as they are (linked into the new version, not copied).
  // Before the job's first save, or with `all` (a hot switch), the
  // processes save the new layout whole instead: every rank puts each of
  // its shards, so a region that several ranks on a host share (a
  // tp-replicated norm, a data-parallel replica) is put once by each of
  // them (the store keeps one) and needs that many buffers.
  const bool stored = planned.committed > 0 && !all;
  const PlanInput& input = planned.flight->input;
  // Per target host, the bytes of every buffer its ranks' saves ask for
  // (a host's held regions are the union of its ranks' shards): each
  // rank's regions in the order its client has them (by tensor, then as
  // the layout lists them), its small ones packed as the client packs
  // them (ptc/packs.h).
  std::map<int32_t, std::vector<int64_t>> puts;
  if (!stored) {
    std::map<int32_t, std::vector<PackCandidate>> of_rank;
    for (int t = 0; t < input.target->num_tensors(); ++t) {
      const TensorSpec& ts = spec.tensors[t];
      const int64_t element = ElementSize(ts.dtype);
      for (const Shard& s : input.target->shards(t)) {
        if (s.region.empty()) continue;
        of_rank[s.rank].push_back({s.region.volume() * element,
                                   PackRequestBytes(ts.key, s.region.rank())});
      }
    }
    for (const auto& [rank, regions] : of_rank) {
      std::vector<int64_t>& host = puts[input.target_placement->host[rank]];
      for (int64_t bytes : SaveBufferSizes(regions)) host.push_back(bytes);
    }
  }
  // (host, tensor, region) of every region a host stores now.
  std::set<std::tuple<int32_t, int32_t, Region>> kept;
  if (stored) {
    for (int t = 0; t < input.source->num_tensors(); ++t) {
      for (const Shard& s : input.source->shards(t)) {
        kept.insert({input.source_placement->host[s.rank], t, s.region});
      }
    }
  }
  std::vector<std::string> addresses;
  std::vector<std::vector<int64_t>> sizes;
  for (const HostFragment& f : plan.fragments) {
    proto::PrepareResponse::Host* h = resp->add_hosts();
    h->set_name(planned.names[f.host]);
    std::vector<int64_t>& s = sizes.emplace_back();
    if (!stored) {
      s = std::move(puts[f.host]);
    } else {
      for (const HeldRegion& held : f.holds) {
        if (kept.count({f.host, held.tensor, held.region})) continue;
        s.push_back(held.region.volume() *
                    ElementSize(spec.tensors[held.tensor].dtype));
      }
    }
    for (int64_t bytes : s) h->set_bytes_needed(h->bytes_needed() + bytes);
    addresses.push_back(planned.addresses.at(f.host));
  }
  absl::flat_hash_map<std::string, size_t> index;  // a target's place
  for (size_t i = 0; i < addresses.size(); ++i) index.emplace(addresses[i], i);
  absl::Mutex mu;
  PTC_RETURN_IF_ERROR(OnEachAddress(addresses, [&](const std::string& a) {
    const size_t i = index.at(a);
    auto r = StoreClient::ConnectKept(a)->PrepareMemory(
        req.job(), planned.committed, sizes[i], timeout);
    if (!r.ok()) {
      return Annotate(r.status(),
                      absl::StrCat("preparing memory on ",
                                   resp->hosts(i).name(), " (", a, ")"));
    }
    absl::MutexLock lock(&mu);
    resp->mutable_hosts(i)->set_bytes_prepared(r->covered_bytes());
    resp->mutable_hosts(i)->set_capacity_bytes(r->capacity_bytes());
    return absl::OkStatus();
  }));
  *resp->mutable_plan() = SummaryToProto(plan.summary);
  SetPlacementSummary(planned.placement, planned.placement_strategy,
                      planned.names, resp->mutable_plan());
  Log("coordinator")
      ->info("job {}: prepared memory for {} -> {} on {} hosts", req.job(),
             planned.from, req.to(), addresses.size());
  return absl::OkStatus();
}

std::vector<CoordinatorService::ToKeep> CoordinatorService::CarryKeptLocked(
    Job& job, const Flight& flight, const ReadCopies& read) {
  // The new version's objects are the source's, moved by the plan: a copy
  // kept of the source is the copy of each target rank that takes it.
  if (flight.keep == nullptr) return {};
  // The plan of the job's next saves too (KeptForSaveLocked checks it is
  // for the layout they save).
  job.keep_plan = flight.keep;
  std::shared_ptr<KeptSmallObjects>& slot = job.kept[flight.target_version];
  if (!slot) slot = std::make_shared<KeptSmallObjects>(flight.keep);
  KeptSmallObjects& kept = *slot;
  const KeepPlan& plan = *flight.keep;
  auto asked = [&](const std::string& name, int32_t rank) {
    if (rank < 0 || rank >= static_cast<int32_t>(plan.names.size()))
      return false;
    const std::vector<std::string>& names = plan.names[rank];
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const SmallObjectMove& m : flight.plan.small_objects) {
    if (m.kept_rank < 0 || flight.kept == nullptr ||
        !asked(m.name, m.target_rank))
      continue;
    if (const std::string* copy = flight.kept->Find(m.name, m.kept_rank))
      kept.Add(m.name, m.target_rank, *copy);
  }
  for (const auto& [object, bytes] : read) {
    if (asked(object.first, object.second) &&
        kept.Find(object.first, object.second) == nullptr)
      kept.Add(object.first, object.second, bytes);
  }
  std::vector<ToKeep> missing;
  for (size_t r = 0; r < plan.names.size(); ++r) {
    for (const std::string& name : plan.names[r]) {
      const int32_t rank = static_cast<int32_t>(r);
      if (kept.Find(name, rank) != nullptr) continue;
      const HostRegistry::Host* h = hosts_.Find(plan.rank_hosts[r]);
      if (h != nullptr)
        missing.push_back({rank, name, h->status.address(), rank});
    }
  }
  return missing;
}

CoordinatorService::ReadCopies CoordinatorService::ReadSmallObjects(
    const std::string& job, int64_t version, const std::vector<ToKeep>& objects,
    std::vector<std::string>* not_read, const std::atomic<bool>* stop) {
  constexpr size_t kMostRead = 256;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  std::set<std::string> failed;
  ReadCopies out;
  size_t read = 0;
  for (; read < objects.size() && read < kMostRead && absl::Now() < until &&
         (stop == nullptr || !*stop);
       ++read) {
    const ToKeep& o = objects[read];
    if (failed.count(o.address)) {
      not_read->push_back(absl::StrCat("'", o.name, "' of rank ", o.rank,
                                       ": its host failed before"));
      continue;
    }
    absl::StatusOr<std::string> bytes =
        StoreClient::ConnectKept(o.address)->GetSmallObject(
            job, version, o.name, o.read_rank, absl::Seconds(2));
    if (!bytes.ok()) {
      failed.insert(o.address);
      not_read->push_back(absl::StrCat("'", o.name, "' of rank ", o.rank, ": ",
                                       bytes.status().ToString()));
    } else if (static_cast<int64_t>(bytes->size()) <=
               kMaxKeptSmallObjectBytes) {
      out[{o.name, o.rank}] = *std::move(bytes);
    }  // else too large to keep: the survival line says so
  }
  if (read < objects.size()) {
    not_read->push_back(absl::StrCat(objects.size() - read,
                                     " more: past the bound of the reads"));
  }
  return out;
}

void CoordinatorService::KeepFromHosts(const std::string& job, int64_t version,
                                       const std::vector<ToKeep>& objects) {
  std::vector<std::string> not_read;
  const ReadCopies read = ReadSmallObjects(job, version, objects, &not_read);
  for (const std::string& line : not_read) {
    Log("coordinator")
        ->warn(
            "job {}: small object {} could not be read from its host to "
            "keep; it is kept from the next save",
            job, line);
  }
  absl::MutexLock lock(&mu_);
  Job* found = jobs_.Find(job);
  if (found == nullptr || found->state.committed_version() != version) return;
  auto kept = found->kept.find(version);
  if (kept == found->kept.end()) return;
  for (const auto& [object, bytes] : read)
    kept->second->Add(object.first, object.second, bytes);
  // Into the records as well (those of the version's copies that changed).
  if (absl::Status s = PersistLocked(); !s.ok()) {
    Log("coordinator")
        ->warn("job {}: writing the small objects kept of version {}: {}", job,
               version, s.ToString());
  }
}

void CoordinatorService::RunFlight(std::shared_ptr<Flight> flight) {
  const std::string& name = flight->job;
  // The small objects the new version needs kept, read from their sources
  // while the change stages, so that the version has its copies when it
  // commits (a host lost right after the commit loses none).
  ReadCopies read;
  std::atomic<bool> stop_reading{false};
  struct Joined {
    std::thread thread;
    ~Joined() {
      if (thread.joinable()) thread.join();
    }
  } reading;
  if (!flight->to_read.empty()) {
    reading.thread = std::thread([&] {
      std::vector<std::string> not_read;
      read = ReadSmallObjects(name, flight->source_version, flight->to_read,
                              &not_read, &stop_reading);
      for (const std::string& line : not_read) {
        Log("coordinator")
            ->info(
                "job {}: small object {} was not read from its source to "
                "keep; it is read from its new host after the commit",
                name, line);
      }
    });
  }
  auto report =
      RunReconfiguration(flight->request, [&](const ReconfigureProgress& p) {
        absl::MutexLock lock(&mu_);
        proto::ReconfigureEvent& e = jobs_.Find(name)->event;
        e.set_bytes_done(p.bytes_done);
        e.set_bytes_total(p.bytes_total);
        e.set_hosts_done(p.hosts_done);
        e.set_hosts_total(p.hosts_total);
        if (p.fragment >= 0 && p.fragment < e.host_progress_size()) {
          proto::ReconfigureEvent::HostProgress* h =
              e.mutable_host_progress(p.fragment);
          h->set_bytes_done(p.fragment_bytes_done);
          h->set_done(h->done() || p.fragment_done);
        }
        if (p.hosts_done == p.hosts_total && e.phase() == proto::PHASE_STAGING)
          e.set_phase(proto::PHASE_VERIFYING);
      });
  {
    // A change that ended undecided needs no copies: the reads stop.
    absl::MutexLock lock(&mu_);
    const Job* job = jobs_.Find(name);
    if (job == nullptr || !job->state.commit_decided()) stop_reading = true;
  }
  if (reading.thread.joinable()) reading.thread.join();
  std::vector<ToKeep> to_keep;
  int64_t committed = 0;
  absl::ReleasableMutexLock lock(&mu_);
  Job& job = *jobs_.Find(name);
  job.running = false;
  proto::ReconfigureEvent& e = job.event;
  // A decided change's version keeps its copies from now on, whether it
  // commits here or the monitor finishes its commit.
  if (job.state.commit_decided()) to_keep = CarryKeptLocked(job, *flight, read);
  if (report.ok()) {
    if (absl::StatusOr<std::vector<std::string>> lost = CommitFlightLocked(job);
        !lost.ok()) {
      // The driver commits only what before_commit decided.
      Log("coordinator")
          ->critical("job {} epoch {}: {}", name, e.plan_epoch(),
                     lost.status().ToString());
      to_keep.clear();
    } else {
      committed = job.state.committed_version();
    }
    e.set_path("store");
    reconfigurations_committed.Add();
    bytes_from_peers_total.Add(report->bytes_from_peers);
    phase_millis_staging.Add(
        static_cast<int64_t>(report->staging_seconds * 1000));
    phase_millis_verifying.Add(
        static_cast<int64_t>(report->verifying_seconds * 1000));
    phase_millis_total.Add(static_cast<int64_t>(report->seconds * 1000));
    e.set_seconds(report->seconds);
    e.set_staging_seconds(report->staging_seconds);
    e.set_verifying_seconds(report->verifying_seconds);
    e.set_bytes_from_peers(report->bytes_from_peers);
    e.set_tensors_verified(report->tensors_verified);
    e.set_snapshot_bytes_read(report->snapshot_bytes_read);
  } else if (job.state.commit_decided()) {
    // Decided but not acknowledged everywhere: the monitor retries.
    e.set_error(std::string(report.status().message()));
    PersistLocked().IgnoreError();
    return;
  } else {
    reconfigurations_aborted.Add();
    AbortFlight(job.cancel_reason.empty()
                    ? std::string(report.status().message())
                    : job.cancel_reason,
                job.state, e)
        .IgnoreError();  // staging: an undecided change ends here
  }
  if (absl::Status s = PersistLocked(); !s.ok()) {
    Log("coordinator")
        ->error("persisting the end of epoch {} of job {}: {}", e.plan_epoch(),
                name, s.ToString());
  }
  lock.Release();
  // Best effort, after the change ended: what no kept copy covered.
  if (!to_keep.empty()) KeepFromHosts(name, committed, to_keep);
}

bool CoordinatorService::FinishDecidedCommit(const std::string& name) {
  // Rule 5: the live targets that have not acknowledged are asked again;
  // dead ones are not waited for (they become lost hosts of the version).
  std::vector<std::string> ask, release;
  std::map<std::string, std::string> name_of;  // address -> host
  int64_t version, epoch, old_version;
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(name);
    if (found == nullptr) return true;
    Job& job = *found;
    const auto& s = job.state;
    if (!s.commit_decided()) return true;
    for (const std::string& h : s.target_hosts()) {
      if (std::find(s.acked_hosts().begin(), s.acked_hosts().end(), h) !=
          s.acked_hosts().end())
        continue;
      if (!hosts_.Alive(h)) continue;
      ask.push_back(hosts_.Find(h)->status.address());
      name_of[ask.back()] = h;
    }
    auto r =
        hosts_.Addresses({s.release_hosts().begin(), s.release_hosts().end()});
    if (r.ok()) release = *r;
    version = s.target_version();
    epoch = s.target_epoch();
    old_version = s.committed_version();
  }
  std::vector<std::string> acked;
  const absl::Status committed =
      CommitStagedOn(ask, name, version, epoch, 1, absl::Seconds(2), &acked);
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(name);
    if (found == nullptr) return true;
    Job& job = *found;
    std::vector<std::string> hosts;
    for (const std::string& a : acked) hosts.push_back(name_of[a]);
    if (absl::Status s = AcknowledgeFlight(hosts, job.state); !s.ok()) {
      Log("coordinator")->error("job {}: {}", name, s.ToString());
      return true;  // no decided change of this job any more
    }
    if (!committed.ok()) {
      PersistLocked().IgnoreError();
      return false;  // the monitor asks again
    }
    // Every live target holds the version committed: it is the job's now
    // (targets that died after the decision become lost hosts).
    if (absl::Status s = CommitFlightLocked(job).status(); !s.ok()) {
      Log("coordinator")->error("job {}: {}", name, s.ToString());
      return true;
    }
    job.running = false;
    PersistLocked().IgnoreError();
  }
  ReleaseOn(release, name, old_version);
  Log("coordinator")
      ->info("job {}: finished the decided commit of epoch {} (version {})",
             name, epoch, version);
  return true;
}

void CoordinatorService::Recover() {
  std::vector<std::string> in_flight;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, j] : jobs_) {
      if (j->state.target_version() != 0) in_flight.push_back(name);
    }
  }
  for (const std::string& name : in_flight) {
    bool decided;
    int64_t epoch, version, fence;
    std::vector<std::string> targets;
    {
      absl::MutexLock lock(&mu_);
      Job& job = *jobs_.Find(name);
      decided = job.state.commit_decided();
      epoch = job.state.target_epoch();
      version = job.state.target_version();
      // Aborting under a new epoch fences the old plan: a coordinator that
      // was only frozen can never commit it afterwards.
      fence = std::max(job.state.last_epoch(), epoch) + 1;
      if (!decided) {
        job.state.set_last_epoch(fence);
        PersistLocked().IgnoreError();
      }
      auto t = hosts_.Addresses(
          {job.state.target_hosts().begin(), job.state.target_hosts().end()});
      if (t.ok()) targets = *t;
    }
    std::string line;
    if (decided) {
      const bool done = FinishDecidedCommit(name);
      line = absl::StrCat(
          "job ", name, ": resumed the decided commit of epoch ", epoch,
          done ? " (version " : " (still retrying version ", version, ")");
    } else {
      AbortStagedOn(targets, name, version, fence);
      absl::MutexLock lock(&mu_);
      Job& job = *jobs_.Find(name);
      AbortFlight("the coordinator restarted before the commit was decided",
                  job.state, job.event)
          .IgnoreError();  // undecided: staging
      PersistLocked().IgnoreError();
      line = absl::StrCat("job ", name, ": aborted epoch ", epoch, " (version ",
                          version, " was staged, not decided); version ",
                          job.state.committed_version(), " stays");
    }
    Log("coordinator")->warn("recovery: {}", line);
    absl::MutexLock lock(&mu_);
    recovery_log_.push_back(line);
  }
}

Watchers::Events CoordinatorService::EventsLocked(const Job& job,
                                                  bool change) const {
  Watchers::Events out;
  // Copied (under the coordinator's lock) only for a watcher that is told
  // all of it: at 512 hosts its plan's matrix and hosts' progress made
  // every follower's Watch call, thousands in a change, copy and
  // serialize them.
  if (change) out.change = job.event;
  // A follower (a process of the job) is told what it acts on: the
  // change's phase and outcome, not its plan or its progress, which
  // change many times a second during a change and would be written to
  // each of thousands of processes (ptcctl watch streams those).
  const proto::ReconfigureEvent& e = job.event;
  proto::ReconfigureEvent& f = out.follow;
  f.set_plan_epoch(e.plan_epoch());
  f.set_phase(e.phase());
  f.set_seconds(e.seconds());
  f.set_error(e.error());
  f.set_reason(e.reason());
  f.set_path(e.path());
  f.set_replanned(e.replanned());
  f.set_from_config(e.from_config());
  f.set_to_config(e.to_config());
  f.set_layout_epoch(job.state.layout_epoch());
  f.set_committed_version(job.state.committed_version());
  f.set_pending_config(job.state.pending().to());
  f.set_pending_hot(job.state.pending().hot());
  f.set_pending_serial(job.state.pending_serial());
  f.set_dropped_save(job.state.dropped_save());
  return out;
}

grpc::ServerWriteReactor<proto::ReconfigureEvent>* CoordinatorService::Watch(
    grpc::CallbackServerContext* ctx, const proto::WatchRequest* req) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Watch", req);
      !denied.ok())
    return Watchers::Refuse(denied);
  Watchers::Events now;
  {
    absl::MutexLock lock(&mu_);
    const Job* job = jobs_.Find(req->job());
    if (job == nullptr) {
      return Watchers::Refuse(ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("job '", req->job(), "' is unknown"))));
    }
    if (!req->follow() && job->event.phase() == proto::PHASE_NONE) {
      return Watchers::Refuse(ToGrpcStatus(absl::NotFoundError(absl::StrCat(
          "job '", req->job(), "' has not been reconfigured yet"))));
    }
    now = EventsLocked(*job, /*change=*/!req->follow());
  }
  return watchers_->Watch(*req, now);
}

grpc::Status CoordinatorService::Abort(grpc::ServerContext* ctx,
                                       const proto::AbortRequest* req,
                                       proto::AbortResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Abort", req);
      !denied.ok())
    return denied;
  absl::MutexLock lock(&mu_);
  Job* found = jobs_.Find(req->job());
  if (found == nullptr) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("job '", req->job(), "' is unknown")));
  }
  Job& job = *found;
  if (job.state.target_version() == 0) {
    resp->set_aborting(false);
    return grpc::Status::OK;
  }
  if (job.state.commit_decided()) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("epoch ", job.state.target_epoch(),
                     " is already decided to commit; it will complete")));
  }
  job.cancel = true;
  resp->set_aborting(true);
  return grpc::Status::OK;
}

}  // namespace ptc
