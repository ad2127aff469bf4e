// Automatic changes: the advisor's RPC, per-job policies, hosts given to
// and taken from jobs, the auto loop that changes jobs by itself, and the
// rendezvous of a live job's processes.
#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/address.h"
#include "common/authz.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/saves_state.h"
#include "plan/advisor.h"
#include "plan/job_placement.h"
#include "plan/plan_proto.h"

namespace ptc {

namespace {

// Rendezvous calls held at once, at most (16,384 ranks of a job wait at
// once; the bound keeps a flood of calls from growing without limit).
constexpr size_t kMaxHeld = size_t{1} << 17;
// How long a Rendezvous call may be held: what its deadline leaves, less
// room for the answer to travel back (a fifth of it, at least 2 s), within
// kMeetingHoldLeast..kMeetingHoldMost. Its process asks again at once.
absl::Duration HoldFor(const grpc::CallbackServerContext& ctx, absl::Time now) {
  if (ctx.deadline() == std::chrono::system_clock::time_point::max())
    return kMeetingHoldMost;
  const absl::Duration left = absl::FromChrono(ctx.deadline()) - now;
  return std::clamp(left - std::max(absl::Seconds(2), left / 5),
                    kMeetingHoldLeast, kMeetingHoldMost);
}

// Advised configs planned to compare the bytes they move (the fastest
// within the margin); each plan takes a few milliseconds to a second.
constexpr int kMaxPlannedCandidates = 8;
bool Contains(const google::protobuf::RepeatedPtrField<std::string>& list,
              const std::string& x) {
  return std::find(list.begin(), list.end(), x) != list.end();
}

void CandidateToProto(const ConfigCandidate& c,
                      proto::AdviseResponse::Candidate* p) {
  p->set_config(c.config);
  p->set_gpus(c.gpus);
  p->set_state_bytes_per_gpu(c.state_bytes_per_gpu);
  p->set_gpu_bytes_needed(c.gpu_bytes_needed);
  p->set_fits(c.fits);
  p->set_why_not(c.why_not);
  p->set_step_seconds(c.step_seconds);
  p->set_compute_seconds(c.compute_seconds);
  p->set_bubble_seconds(c.bubble_seconds);
  p->set_tp_seconds(c.tp_seconds);
  p->set_dp_seconds(c.dp_seconds);
  p->set_bytes_moved(c.bytes_moved);
  p->set_change_seconds(c.change_seconds);
  p->set_survives_host_loss(c.survives_host_loss);
}

}  // namespace

absl::Status ValidateAutoPolicy(const proto::AutoPolicy& p,
                                const ModelSpec& spec) {
  auto range = [](double v, double lo, double hi, const char* what) {
    if (std::isfinite(v) && v >= lo && v <= hi) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "auto policy: ", what, " ", v, " must be from ", lo, " to ", hi));
  };
  PTC_RETURN_IF_ERROR(range(p.margin(), 0, 10, "margin"));
  PTC_RETURN_IF_ERROR(range(static_cast<double>(p.global_batch()), 0,
                            1e12, "global batch"));
  PTC_RETURN_IF_ERROR(range(p.micro_batches(), 0, 1 << 20, "micro-batches"));
  PTC_RETURN_IF_ERROR(range(static_cast<double>(p.tokens_per_step()), 0,
                            1e15, "tokens per step"));
  PTC_RETURN_IF_ERROR(range(p.max_gpus(), 0, 1 << 20, "max GPUs"));
  PTC_RETURN_IF_ERROR(
      range(p.save_timeout_seconds(), 0, 86400, "save timeout (seconds)"));
  if (!p.pinned_config().empty()) {
    auto c = spec.ParseConfig(p.pinned_config());
    PTC_RETURN_IF_ERROR(Annotate(c.status(), "auto policy: pinned config"));
    PTC_RETURN_IF_ERROR(
        Annotate(CheckConfig(spec, *c), "auto policy: pinned config"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::SetPendingLocked(
    Job& job, const proto::ReconfigureRequest& req, const std::string& reason,
    const std::vector<std::string>& rank_hosts,
    const std::vector<int32_t>& rank_devices) {
  if (job.state.target_version() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.state.job(), "' is already being reconfigured (epoch ",
        job.state.target_epoch(), ")"));
  }
  if (job.state.hot_version() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.state.job(), "' is switching to ", job.state.pending().to(),
        " (hot switch, version ", job.state.hot_version(),
        "); ask again after it ends"));
  }
  proto::ReconfigureRequest pending = req;
  pending.set_after_save(false);
  // As ptc writes configs (what the processes and ptcctl show).
  PTC_ASSIGN_OR_RETURN(const ParallelConfig to, job.spec->ParseConfig(req.to()));
  pending.set_to(to.ToString());
  // A hot switch needs a process on every GPU of the target (processes
  // move the state; nobody starts new ones before the commit), and a
  // committed version to return to if it fails.
  bool hot = req.hot() && job.state.committed_version() > 0 &&
             !rank_hosts.empty() && rank_hosts.size() == rank_devices.size();
  if (hot) {
    const auto [hosts, devices] = RankPlacementLocked(job);
    std::set<std::pair<std::string, int32_t>> running;
    for (size_t r = 0; r < hosts.size() && r < devices.size(); ++r)
      running.insert({hosts[r], devices[r]});
    for (size_t r = 0; r < rank_hosts.size(); ++r)
      hot &= running.count({rank_hosts[r], rank_devices[r]}) > 0;
  }
  pending.set_hot(hot);
  if (hot) {
    // Fixed now: the processes compute their plan from it.
    proto::PlacementOptions* p = pending.mutable_placement();
    p->set_strategy(proto::PLACEMENT_EXPLICIT);
    p->clear_rank_hosts();
    p->clear_rank_devices();
    for (const std::string& h : rank_hosts) p->add_rank_hosts(h);
    for (int32_t d : rank_devices) p->add_rank_devices(d);
  }
  *job.state.mutable_pending() = pending;
  job.state.set_next_serial(job.state.next_serial() + 1);
  job.state.set_pending_serial(job.state.next_serial());
  job.state.set_pending_reason(reason);
  // The save it waits for: a newer one than what is committed; for a hot
  // switch, only the one its processes make for it if they cannot start
  // it (SaveIsForChange). A periodic save, begun before or just after the
  // switch was asked (before the processes heard of it), would otherwise
  // turn the switch into a change through the store as it commits.
  job.state.set_pending_after_version(hot ? kAwaitingOwnSave
                                          : job.state.committed_version());
  job.state.set_pending_unix(absl::ToUnixMicros(absl::Now()) / 1e6);
  Log("coordinator")
      ->info("job {}: change to {} ({}) waits for the processes' next {}",
             job.state.job(), req.to(), reason,
             hot ? "step boundary (hot switch)" : "save");
  auto_changes_.Wake();
  return PersistLocked();
}

grpc::Status CoordinatorService::Advise(grpc::ServerContext* ctx,
                                        const proto::AdviseRequest* req,
                                        proto::AdviseResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Advise", req);
      !denied.ok())
    return denied;
  return ToGrpcStatus(DoAdvise(*req, resp));
}

absl::Status CoordinatorService::DoAdvise(const proto::AdviseRequest& req,
                                          proto::AdviseResponse* resp,
                                          std::shared_ptr<Planned>* single) {
  if (req.gpus() < 0 || req.gpus() > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(req.gpus(), " GPUs: give 1 to 1048576 (0: all free)"));
  }
  if (req.hosts_size() > 100000)
    return absl::InvalidArgumentError("more than 100000 hosts");
  AdvisorInput in;
  proto::AutoPolicy policy;
  std::shared_ptr<const ModelSpec> spec;
  std::vector<std::string> hosts;
  int64_t committed = 0;
  int free = 0;
  {
    absl::MutexLock lock(&mu_);
    PTC_ASSIGN_OR_RETURN(const Job* known, jobs_.Known(req.job()));
    const Job& job = *known;
    spec = job.spec;
    PTC_ASSIGN_OR_RETURN(in.current, spec->ParseConfig(job.state.config()));
    policy = job.state.auto_policy();
    committed = job.state.committed_version();
    const Resources res = ResourcesLocked(req.job());
    std::vector<std::string> asked(req.hosts().begin(), req.hosts().end());
    if (asked.empty()) {
      const absl::Time now = absl::Now();
      for (const std::string& h : job.state.pool()) {
        if (MayPlaceOn(hosts_, job.state, h, now)) asked.push_back(h);
      }
    }
    in.gpus_per_host = 1 << 20;
    in.gpu_memory_bytes = 0;
    in.link_bandwidth = 0;
    // Host ids by name, and the hosts asked so far: a lookup each, not a
    // scan of every host per host (2,048^2 comparisons under the lock).
    absl::flat_hash_map<std::string_view, int> id_of;
    for (size_t i = 0; i < res.names.size(); ++i)
      id_of.emplace(res.names[i], static_cast<int>(i));
    absl::flat_hash_set<std::string_view> seen;
    for (const std::string& h : asked) {
      const HostRegistry::Host* hit = hosts_.Find(h);
      if (hit == nullptr)
        return absl::NotFoundError(absl::StrCat("host '", h, "' is not registered"));
      if (!hit->status.alive())
        return absl::FailedPreconditionError(
            absl::StrCat("host '", h, "' is dead; choose live hosts"));
      if (!seen.insert(h).second)
        return absl::InvalidArgumentError(absl::StrCat("host '", h, "' is named twice"));
      const auto id = id_of.find(h);
      if (id == id_of.end())
        return absl::NotFoundError(absl::StrCat("host '", h, "' is not registered"));
      const int gpus = hit->status.gpus() -
                       static_cast<int>(res.taken[id->second].size());
      if (gpus <= 0) continue;
      hosts.push_back(h);
      free += gpus;
      const proto::HostStatus& s = hit->status;
      in.gpus_per_host = std::min(in.gpus_per_host, s.gpus());
      const int64_t mem =
          s.gpu_memory_bytes() > 0 ? s.gpu_memory_bytes() : kDefaultGpuMemoryBytes;
      in.gpu_memory_bytes =
          in.gpu_memory_bytes == 0 ? mem : std::min(in.gpu_memory_bytes, mem);
      const double bw = s.bandwidth() > 0 ? s.bandwidth() : 25e9;
      in.link_bandwidth =
          in.link_bandwidth == 0 ? bw : std::min(in.link_bandwidth, bw);
    }
  }
  if (hosts.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", req.job(), "' has no live host with a free GPU to run on",
        req.hosts().empty() ? " in its pool (ptcctl hosts add)" : ""));
  }
  if (req.gpus() > free) {
    return absl::FailedPreconditionError(
        absl::StrCat(req.gpus(), " GPUs asked; the hosts ",
                     absl::StrJoin(hosts, ", "), " have ", free, " free"));
  }
  in.spec = spec.get();
  in.gpus = req.gpus() > 0 ? req.gpus() : free;
  if (in.gpu_memory_bytes == 0) in.gpu_memory_bytes = kDefaultGpuMemoryBytes;
  PTC_ASSIGN_OR_RETURN(std::vector<ConfigCandidate> candidates,
                       EnumerateConfigs(in, policy));
  std::vector<int> near = WithinMargin(candidates, policy);
  if (near.size() > kMaxPlannedCandidates) near.resize(kMaxPlannedCandidates);
  for (int i : near) {
    ConfigCandidate& c = candidates[i];
    if (committed == 0) {
      c.bytes_moved = 0;  // nothing saved yet: nothing moves
      continue;
    }
    proto::ReconfigureRequest r;
    r.set_job(req.job());
    r.set_to(c.config);
    for (const std::string& h : hosts) r.add_hosts(h);
    auto planned = OutlineOf(r, near.size() == 1 ? single : nullptr);
    // ABORTED: the job is committing a save (or changed meanwhile); every
    // candidate would fail alike, and the advice is asked again after it.
    if (absl::IsAborted(planned.status())) return planned.status();
    if (!planned.ok()) {
      c.why_not = absl::StrCat("cannot be planned here: ",
                               planned.status().message());
      continue;
    }
    c.bytes_moved = planned->summary.cross_host_bytes;
    c.change_seconds = planned->summary.max_host_send_seconds;
    c.survives_host_loss = planned->survives_host_loss;
  }
  auto choice = ChooseConfig(candidates, policy);
  if (single != nullptr && (!choice.ok() || near.size() != 1 ||
                            choice->index != near.front()))
    single->reset();  // not the plan of the chosen config
  resp->set_chosen(choice.ok() ? choice->index : -1);
  resp->set_explanation(choice.ok() ? choice->explanation
                                    : std::string(choice.status().message()));
  for (const std::string& h : hosts) resp->add_hosts(h);
  resp->set_gpu_memory_bytes(in.gpu_memory_bytes);
  for (const ConfigCandidate& c : candidates)
    CandidateToProto(c, resp->add_candidates());
  return absl::OkStatus();
}

grpc::Status CoordinatorService::SetAutoPolicy(
    grpc::ServerContext* ctx, const proto::SetAutoPolicyRequest* req,
    proto::SetAutoPolicyResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "SetAutoPolicy", req);
      !denied.ok())
    return denied;
  absl::MutexLock lock(&mu_);
  auto known = jobs_.Known(req->job());
  if (!known.ok()) return ToGrpcStatus(known.status());
  Job& job = **known;
  if (absl::Status s = ValidateAutoPolicy(req->policy(), *job.spec); !s.ok())
    return ToGrpcStatus(s);
  // What the auto loop compares the new policy with, when it has not
  // looked at the job since the previous one was set.
  auto_changes_.PolicyChanging(req->job(), job.state.auto_policy());
  *job.state.mutable_auto_policy() = req->policy();
  *resp->mutable_policy() = req->policy();
  Log("coordinator")
      ->info("job {}: automatic changes {}{}", req->job(),
             req->policy().enabled() ? "on" : "off",
             req->policy().pinned_config().empty()
                 ? ""
                 : absl::StrCat(", pinned to ", req->policy().pinned_config()));
  return ToGrpcStatus(PersistLocked());
}

grpc::Status CoordinatorService::ChangeHosts(
    grpc::ServerContext* ctx, const proto::ChangeHostsRequest* req,
    proto::ChangeHostsResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "ChangeHosts", req);
      !denied.ok())
    return denied;
  if (!proto::ChangeHostsRequest::Op_IsValid(req->op())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("op ", req->op(), " is unknown; use add (0) or drain (1)")));
  }
  if (req->hosts().empty() || req->hosts_size() > 100000) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("name 1 to 100000 hosts"));
  }
  const bool drain = req->op() == proto::ChangeHostsRequest::OP_DRAIN;
  absl::MutexLock lock(&mu_);
  for (const std::string& h : req->hosts()) {
    if (hosts_.Find(h) == nullptr) {
      return ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("host '", h, "' is not registered")));
    }
  }
  Job* target = nullptr;
  if (!drain && !req->job().empty()) {
    auto known = jobs_.Known(req->job());
    if (!known.ok()) return ToGrpcStatus(known.status());
    target = *known;
  }
  hosts_.SetDraining({req->hosts().begin(), req->hosts().end()}, drain)
      .IgnoreError();  // every one is registered: checked above
  for (const std::string& h : req->hosts()) {
    if (target == nullptr) continue;
    if (!Contains(target->state.pool(), h)) target->state.add_pool(h);
    auto* left = target->state.mutable_left_pool_dead();
    left->erase(std::remove(left->begin(), left->end(), h), left->end());
  }
  for (const auto& [name, job] : jobs_) {
    bool touched = false;
    for (const std::string& h : req->hosts()) {
      touched |= drain ? Contains(job->state.hosts(), h)
                       : Contains(job->state.pool(), h);
    }
    if (!touched) continue;
    if (job->state.auto_policy().enabled()) {
      resp->add_changing(name);
    } else if (drain) {
      resp->add_manual(name);
    }
  }
  auto_changes_.HostsChanged();
  auto_changes_.Wake();
  Log("coordinator")
      ->info("hosts {} {}{}", absl::StrJoin(req->hosts(), ", "),
             drain ? "drained" : "added",
             target ? absl::StrCat(" to the pool of job ", req->job()) : "");
  return ToGrpcStatus(PersistLocked());
}

absl::StatusOr<proto::RendezvousResponse> CoordinatorService::RendezvousLocked(
    const proto::RendezvousRequest& req) {
  auto known = jobs_.Known(req.job());
  if (!known.ok()) return known.status();
  const Job& job = **known;
  if (req.layout_epoch() != job.state.layout_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layout epoch ", req.layout_epoch(), " is not the job's (",
        job.state.layout_epoch(), "); refresh and meet under it"));
  }
  if (req.rank() < 0 || req.rank() >= job.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", req.rank(), " is outside the job's ", job.ranks, " ranks"));
  }
  std::string offered;
  if (req.rank() == 0) {
    if (req.port() < 1 || req.port() > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("port ", req.port(), " must be 1 to 65535"));
    }
    // The store runs where rank 0 does: at its ptcd's address.
    const auto [rank_hosts, devices] = RankPlacementLocked(job);
    const HostRegistry::Host* host =
        rank_hosts.empty() ? nullptr : hosts_.Find(rank_hosts[0]);
    if (host == nullptr) {
      return absl::FailedPreconditionError(
          "the host of rank 0 is not registered");
    }
    auto addr = ParseHostPort(host->status.address());
    if (!addr.ok()) return addr.status();
    const bool v6 = addr->host.find(':') != std::string::npos;
    offered = absl::StrCat(v6 ? "[" : "", addr->host, v6 ? "]" : "", ":",
                           req.port());
  }
  PTC_ASSIGN_OR_RETURN(
      std::string address,
      meetings_.Arrive(req.job(), req.layout_epoch(), job.ranks, req.rank(),
                       offered, absl::Now()));
  proto::RendezvousResponse met;
  met.set_address(std::move(address));
  // The version to load, unless a save is open: it could commit before the
  // ranks load (they then ask).
  if (job.state.open_saves_size() == 0) {
    met.set_committed_version(job.state.committed_version());
    met.set_committed_step(job.state.committed_step());
  }
  return met;
}

class CoordinatorService::RendezvousReactor : public grpc::ServerUnaryReactor {
 public:
  explicit RendezvousReactor(CoordinatorService* service) : service_(service) {}
  void OnCancel() override { service_->HeldCancelled(this); }
  void OnDone() override { delete this; }

 private:
  CoordinatorService* const service_;
};

grpc::ServerUnaryReactor* CoordinatorService::Rendezvous(
    grpc::CallbackServerContext* ctx, const proto::RendezvousRequest* req,
    proto::RendezvousResponse* resp) {
  // Deletes itself once the call is done.
  grpc::ServerUnaryReactor* reactor = new RendezvousReactor(this);
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Rendezvous", req);
      !denied.ok()) {
    reactor->Finish(denied);
    return reactor;
  }
  std::vector<Held> told;
  absl::StatusOr<proto::RendezvousResponse> answer;
  {
    absl::MutexLock lock(&mu_);
    answer = RendezvousLocked(*req);
    // Not met yet: the answer waits (the rank counts as here meanwhile)
    // until every rank is, or HoldFor passes. Beyond kMaxHeld calls, or
    // kMeetingHeldPerRank of its rank, it comes at once (and the caller
    // asks again a little later).
    if (absl::IsUnavailable(answer.status()) && held_.size() < kMaxHeld &&
        !ctx->IsCancelled() &&
        meetings_.Hold(req->job(), req->layout_epoch(), req->rank())) {
      const absl::Time now = absl::Now();
      held_.emplace(reactor,
                    Held{reactor, *req, resp, now + HoldFor(*ctx, now)});
      return reactor;
    }
    if (answer.ok()) told = TakeHeldLocked(req->job(), req->layout_epoch());
  }
  Tell(told, answer);
  if (answer.ok()) *resp = *answer;
  reactor->Finish(ToGrpcStatus(answer.status()));
  return reactor;
}

std::vector<CoordinatorService::Held> CoordinatorService::TakeHeldLocked(
    const std::string& job, int64_t epoch) {
  std::vector<Held> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.req.job() == job && it->second.req.layout_epoch() == epoch) {
      out.push_back(std::move(it->second));
      held_.erase(it++);
    } else {
      ++it;
    }
  }
  const absl::Time now = absl::Now();
  for (const Held& h : out) {
    meetings_.Release(job, epoch, h.req.rank(), now, /*gone=*/false);
  }
  return out;
}

void CoordinatorService::HeldCancelled(grpc::ServerUnaryReactor* reactor) {
  {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(reactor);
    // Not held: answered already, or never held. (Cancelled just after
    // the handler's IsCancelled, a call is held until HoldFor passes.)
    if (it == held_.end()) return;
    const proto::RendezvousRequest& req = it->second.req;
    meetings_.Release(req.job(), req.layout_epoch(), req.rank(), absl::Now(),
                      /*gone=*/true);
    held_.erase(it);
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                               "the call was cancelled while it waited for "
                               "its job's meeting"));
}

void CoordinatorService::Tell(
    const std::vector<Held>& held,
    const absl::StatusOr<proto::RendezvousResponse>& answer) {
  for (const Held& h : held) {
    if (answer.ok()) *h.resp = *answer;
    h.reactor->Finish(ToGrpcStatus(answer.status()));
  }
}

void CoordinatorService::HoldLoop() {
  while (true) {
    // (held call, its answer now)
    std::vector<std::pair<Held, absl::StatusOr<proto::RendezvousResponse>>>
        answers;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_),
                               absl::Milliseconds(100))) {
        // Stopping: every held call is answered (the server waits for it).
        for (auto& [reactor, h] : held_) {
          answers.push_back({std::move(h), absl::UnavailableError(
                                               "the coordinator is stopping; "
                                               "meet again")});
        }
        held_.clear();
      } else {
        const absl::Time now = absl::Now();
        // A job whose epoch moved on (a change committed, the job was
        // forgotten): its calls held under the old epoch are answered now
        // (refresh and meet under the new one), not when their hold ends.
        // Each job's epoch is looked up once per pass.
        absl::flat_hash_map<std::string, int64_t> epochs;  // -1: job gone
        auto current = [&](const Held& h) {
          auto [e, added] = epochs.try_emplace(h.req.job(), -1);
          if (added) {
            const Job* job = jobs_.Find(h.req.job());
            if (job != nullptr) e->second = job->state.layout_epoch();
          }
          return e->second == h.req.layout_epoch();
        };
        for (auto it = held_.begin(); it != held_.end();) {
          Held& h = it->second;
          if (h.until > now && current(h)) {
            ++it;
            continue;
          }
          // Asked again for it: still here, and the meeting as it is now.
          meetings_.Release(h.req.job(), h.req.layout_epoch(), h.req.rank(),
                            now, /*gone=*/false);
          absl::StatusOr<proto::RendezvousResponse> a = RendezvousLocked(h.req);
          answers.push_back({std::move(h), std::move(a)});
          held_.erase(it++);
        }
      }
      // A held rank whose look met the meeting tells the others.
      const size_t looked = answers.size();
      for (size_t i = 0; i < looked; ++i) {
        if (!answers[i].second.ok()) continue;
        for (Held& h : TakeHeldLocked(answers[i].first.req.job(),
                                      answers[i].first.req.layout_epoch()))
          answers.push_back({std::move(h), answers[i].second});
      }
    }
    for (auto& [held, answer] : answers) Tell({held}, answer);
    {
      absl::MutexLock lock(&mu_);
      if (stop_ && held_.empty()) return;
    }
  }
}

grpc::Status CoordinatorService::ReportProcessExit(
    grpc::ServerContext* ctx, const proto::ReportProcessExitRequest* req,
    proto::ReportProcessExitResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "ReportProcessExit", req);
      !denied.ok())
    return denied;
  absl::MutexLock lock(&mu_);
  auto known = jobs_.Known(req->job());
  if (!known.ok()) return ToGrpcStatus(known.status());
  Job& job = **known;
  if (req->layout_epoch() != job.state.layout_epoch()) {
    // A process of an older layout: the change since has replaced it.
    resp->set_changing(false);
    return grpc::Status::OK;
  }
  // From the job's index of its host's ranks (a host's agent reports each
  // of its processes that exits: when a job crashes, every process of it);
  // a record that does not place every rank is derived and scanned.
  bool placed = false;
  if (const std::vector<int32_t>* mine = job.RanksOn(req->host());
      mine != nullptr) {
    for (int32_t r : *mine) placed |= job.state.rank_devices(r) == req->gpu();
  } else {
    const auto [rank_hosts, devices] = RankPlacementLocked(job);
    for (size_t r = 0; r < rank_hosts.size() && r < devices.size(); ++r)
      placed |= rank_hosts[r] == req->host() && devices[r] == req->gpu();
  }
  if (!placed) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "job '", req->job(), "' runs no rank on GPU ", req->gpu(), " of host '",
        req->host().substr(0, 253), "' under layout epoch ", req->layout_epoch())));
  }
  const std::string why =
      absl::StrCat("its process on GPU ", req->gpu(), " of ", req->host(),
                   req->exit_code() < 0 ? " was killed by signal " : " exited with ",
                   std::abs(req->exit_code()));
  Log("coordinator")->warn("job {}: {}", req->job(), why);
  const bool changing = job.state.auto_policy().enabled();
  if (changing) {
    auto_changes_.ProcessExited(req->job(), req->layout_epoch(), why);
  }
  resp->set_changing(changing);
  return grpc::Status::OK;
}

void CoordinatorService::AutoLoop() {
  while (true) {
    using Action = AutoChanges::Action;
    std::vector<Action> actions;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || auto_changes_.woken();
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
      if (stop_) return;
      auto_changes_.Woke();
      const absl::Time now = absl::Now();
      for (auto& [name, job] : jobs_) {
        if (jobs_.Forgetting(name)) continue;
        if (auto a = auto_changes_.Judge(name, *job, hosts_, now))
          actions.push_back(*std::move(a));
      }
      // A look that acts may have changed the job's record (dead hosts
      // leave its pool); one that dropped a hot switch acts next round.
      if (!actions.empty()) PersistLocked().IgnoreError();
    }
    for (const Action& a : actions) {
      if (a.pending) {
        proto::ReconfigureResponse resp;
        absl::Status s = DoReconfigure(a.request, &resp, a.reason);
        if (absl::IsAborted(s)) {
          // A save began committing after the look: the pending change
          // stays, and starts from that save in a moment.
          absl::MutexLock lock(&mu_);
          auto_changes_.Failed(a.job, absl::Now(), kAutoRetryAborted);
          continue;
        }
        if (!s.ok()) {
          Log("coordinator")
              ->warn("job {}: the pending change to {} ({}) could not start: {}",
                     a.job, a.request.to(), a.reason, s.ToString());
          absl::MutexLock lock(&mu_);
          Job* found = jobs_.Find(a.job);
          if (found != nullptr && found->state.target_version() == 0) {
            Job& job = *found;
            job.ClearPending();
            job.ArchiveEvent();
            job.event.Clear();
            job.event.set_phase(proto::PHASE_ABORTED);
            job.event.set_reason(a.reason);
            job.event.set_error(std::string(s.message()));
            auto_changes_.Failed(a.job, absl::Now());
            PersistLocked().IgnoreError();
          }
        }
        continue;
      }
      RunAutoChange(a.job, a.reason, a.save_first, a.must_change);
    }
  }
}

void CoordinatorService::RunAutoChange(const std::string& name,
                                       const std::string& reason,
                                       bool save_first, bool must_change) {
  proto::AdviseRequest ask;
  ask.set_job(name);
  proto::AdviseResponse advice;
  // After a death (no save first) the change starts from the committed
  // version: the advisor's plan of the chosen config, if it made one
  // alone, is the change's (the request below is the one it planned).
  std::shared_ptr<Planned> planned;
  absl::Status s = DoAdvise(ask, &advice, save_first ? nullptr : &planned);
  std::string current;
  int current_ranks = 0;
  bool pinned = false;
  std::string pinned_config;
  bool must_move = must_change;  // a host is dead or drained, a process died
  bool hot = false;
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(name);
    if (found == nullptr) return;
    // As ptc writes configs, to compare with the advisor's.
    auto parsed = found->spec->ParseConfig(found->state.config());
    current = parsed.ok() ? parsed->ToString() : found->state.config();
    current_ranks = found->ranks;
    hot = found->state.auto_policy().hot();
    const std::string& pin = found->state.auto_policy().pinned_config();
    pinned = !pin.empty();
    if (pinned) {
      auto p = found->spec->ParseConfig(pin);
      pinned_config = p.ok() ? p->ToString() : pin;
    }
    for (const std::string& h : found->state.hosts()) {
      must_move |= !hosts_.Usable(h);
    }
  }
  if (s.ok() && advice.chosen() < 0)
    s = absl::FailedPreconditionError(advice.explanation());
  if (s.ok()) {
    const auto& chosen = advice.candidates(advice.chosen());
    // Advice under a policy that changed meanwhile: the next look redoes it.
    if (pinned != (advice.candidates_size() == 1 &&
                   chosen.config() == pinned_config))
      return;
    // Off a host it must leave, to a pinned config it does not run, or to
    // more or fewer GPUs; otherwise it stays.
    if (!must_move && chosen.config() == current) return;
    if (!must_move && !pinned && chosen.gpus() == current_ranks) return;
    Log("coordinator")
        ->info("job {}: {}; the advisor chooses {}{}", name, reason,
               advice.explanation(),
               planned != nullptr ? " (its plan starts as the advisor made it)"
                                  : "");
    proto::ReconfigureRequest req;
    req.set_job(name);
    req.set_to(chosen.config());
    for (const std::string& h : advice.hosts()) req.add_hosts(h);
    req.set_after_save(save_first);
    req.set_hot(save_first && hot);
    proto::ReconfigureResponse resp;
    s = DoReconfigure(req, &resp, absl::StrCat(reason, " (automatic)"),
                      std::move(planned));
    if (s.ok()) return;
  }
  if (absl::IsAborted(s)) {
    // The job is committing a save (or changed as the change was planned):
    // not a failure, the loop looks again in a moment.
    Log("coordinator")
        ->info("job {}: {}; the automatic change waits a moment: {}", name,
               reason, std::string(s.message()));
    absl::MutexLock lock(&mu_);
    auto_changes_.Failed(name, absl::Now(), kAutoRetryAborted);
    return;
  }
  Log("coordinator")
      ->warn("job {}: {}, but no automatic change could start: {}", name,
             reason, s.ToString());
  absl::MutexLock lock(&mu_);
  Job* found = jobs_.Find(name);
  if (found == nullptr || found->state.target_version() != 0) return;
  found->ArchiveEvent();
  proto::ReconfigureEvent& e = found->event;
  e.Clear();
  e.set_phase(proto::PHASE_ABORTED);
  e.set_reason(absl::StrCat(reason, " (automatic)"));
  e.set_error(std::string(s.message()));
  auto_changes_.Failed(name, absl::Now());
}

}  // namespace ptc
