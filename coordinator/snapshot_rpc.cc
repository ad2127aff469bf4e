// Snapshot, Restore and the periodic snapshotter of CoordinatorService.
#include <algorithm>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/reconfigure_driver.h"
#include "coordinator/snapshot_writer.h"
#include "plan/snapshot_plan.h"
#include "proto/transformer.grpc.pb.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "snapshot/snapshot_dir.h"

namespace ptc {

absl::StatusOr<CoordinatorService::SnapshotUse>
CoordinatorService::ReadSnapshotVia(const std::string& job,
                                    const std::string& root,
                                    const std::vector<std::string>& hosts) {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    auto add = [&](const std::string& h) {
      if (!hosts_.Alive(h)) return;
      const std::string& address = hosts_.Find(h)->status.address();
      if (std::find(addresses.begin(), addresses.end(), address) ==
          addresses.end())
        addresses.push_back(address);
    };
    for (const std::string& h : hosts) add(h);
    for (const auto& [name, h] : hosts_.hosts()) add(name);
  }
  if (addresses.empty()) {
    return absl::UnavailableError("no live host to read the snapshot with");
  }
  absl::Status last;
  for (const std::string& a : addresses) {
    proto::ReadSnapshotRequest req;
    req.set_root(root);
    req.set_job(job);
    proto::ReadSnapshotResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    last = FromGrpcStatus(SnapshotStub(a)->ReadSnapshot(&ctx, req, &resp));
    if (last.ok()) return SnapshotUse{resp.dir(), resp.manifest(), false};
    if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last))
      return last;  // the same everywhere: missing, damaged, another job's
  }
  return last;
}

grpc::Status CoordinatorService::Snapshot(
    grpc::ServerContext* ctx, const proto::SnapshotRequest* req,
    grpc::ServerWriter<proto::SnapshotEvent>* writer) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Snapshot", req);
      !denied.ok())
    return denied;
  auto done = DoSnapshot(*req, [&](const proto::SnapshotEvent& e) {
    if (!ctx->IsCancelled()) writer->Write(e);
  });
  if (!done.ok()) {
    Log("coordinator")
        ->warn("snapshot of job {}: {}", req->job(), done.status().ToString());
    return ToGrpcStatus(done.status());
  }
  writer->Write(*done);
  return grpc::Status::OK;
}

absl::StatusOr<proto::SnapshotEvent> CoordinatorService::DoSnapshot(
    const proto::SnapshotRequest& req,
    const std::function<void(const proto::SnapshotEvent&)>& progress) {
  PTC_RETURN_IF_ERROR(CheckSnapshotRoot(req.root(), ""));
  if (req.keep() < 0 || req.keep() > kMaxSnapshotKeep ||
      req.max_bytes_per_second() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep must be 0 (", kDefaultSnapshotKeep, ") to ", kMaxSnapshotKeep,
                     " and the rate not negative"));
  }
  // What to write, under the lock.
  std::shared_ptr<const ModelSpec> spec;
  proto::CoordinatorState::Job state;
  std::pair<std::vector<std::string>, std::vector<int32_t>> ranks;
  Resources res;
  std::shared_ptr<const KeptSmallObjects> kept;
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(req.job());
    if (found == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("job '", req.job(), "' is unknown"));
    }
    Job& job = *found;
    auto& s = job.state;
    s.set_snapshot_root(req.root());
    s.set_snapshot_keep(req.keep() > 0 ? req.keep() : kDefaultSnapshotKeep);
    s.set_snapshot_max_bytes_per_second(req.max_bytes_per_second());
    if (req.every_versions() != 0)
      s.set_snapshot_every_versions(std::max<int64_t>(0, req.every_versions()));
    if (req.every_seconds() != 0)
      s.set_snapshot_every_seconds(std::max<int64_t>(0, req.every_seconds()));
    PTC_RETURN_IF_ERROR(PersistLocked());
    if (req.policy_only()) {
      proto::SnapshotEvent e;
      e.set_done(true);
      return e;
    }
    if (s.committed_version() <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", req.job(), "' has no committed state to snapshot yet"));
    }
    if (snapshotting_.count(req.job())) {
      return absl::UnavailableError(absl::StrCat(
          "a snapshot of job '", req.job(), "' is being written; try later"));
    }
    snapshotting_.insert(req.job());
    spec = job.spec;
    state = s;
    ranks = RankPlacementLocked(job);
    res = ResourcesLocked(req.job());
    if (auto it = job.kept.find(s.committed_version()); it != job.kept.end())
      kept = it->second;
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    snapshotting_.erase(req.job());
  };
  SnapshotJob in;
  in.job = req.job();
  in.root = req.root();
  in.spec = std::move(spec);
  in.state = std::move(state);
  in.rank_hosts = std::move(ranks.first);
  in.names = std::move(res.names);
  in.alive = std::move(res.alive);
  in.addresses = std::move(res.addresses);
  in.kept = std::move(kept);
  PTC_ASSIGN_OR_RETURN(SnapshotWritten written, WriteSnapshot(in, progress));
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(req.job());
    if (found != nullptr) {
      found->state.set_snapshot_version(written.event.version());
      found->state.set_snapshot_unix(written.created_unix);
      PersistLocked().IgnoreError();
    }
  }
  return std::move(written.event);
}

grpc::Status CoordinatorService::Restore(grpc::ServerContext* ctx,
                                         const proto::RestoreRequest* req,
                                         proto::ReconfigureResponse* resp) {
  if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Restore", req);
      !denied.ok())
    return denied;
  const absl::Status s = DoRestore(*req, resp);
  if (!s.ok())
    Log("coordinator")->warn("restore {}: {}", req->job(), s.ToString());
  return ToGrpcStatus(s);
}

absl::Status CoordinatorService::DoRestore(const proto::RestoreRequest& req,
                                           proto::ReconfigureResponse* resp) {
  PTC_RETURN_IF_ERROR(CheckJobName(req.job()));
  PTC_RETURN_IF_ERROR(CheckSnapshotRoot(req.root(), ""));
  if (req.config().empty() || req.hosts().empty()) {
    return absl::InvalidArgumentError(
        "a restore needs the config and the hosts to load the job onto");
  }
  PTC_ASSIGN_OR_RETURN(SnapshotUse use, ReadSnapshotVia(req.job(), req.root(),
                                                        {req.hosts().begin(),
                                                         req.hosts().end()}));
  use.restore = true;
  bool known;
  {
    absl::MutexLock lock(&mu_);
    known = jobs_.Find(req.job()) != nullptr;
  }
  if (!known) {
    // Registered from the manifest, under the new config.
    PTC_ASSIGN_OR_RETURN(
        std::shared_ptr<const ModelSpec> spec,
        JobSpec(use.manifest.has_layout() ? "" : use.manifest.model(),
                use.manifest.has_layout() ? &use.manifest.layout() : nullptr));
    proto::RegisterJobRequest reg;
    reg.set_job(req.job());
    reg.set_model(use.manifest.model());
    if (use.manifest.has_layout())
      *reg.mutable_layout() = use.manifest.layout();
    reg.set_config(req.config());
    *reg.mutable_hosts() = req.hosts();
    *reg.mutable_placement() = req.placement();
    proto::RegisterJobResponse registered;
    PTC_RETURN_IF_ERROR(Annotate(AddJob(reg, std::move(spec), &registered),
                                 "registering the job from its snapshot"));
  }
  proto::ReconfigureRequest change;
  change.set_job(req.job());
  change.set_to(req.config());
  *change.mutable_hosts() = req.hosts();
  *change.mutable_placement() = req.placement();
  change.set_parallel_pulls(req.parallel_pulls());
  if (req.parallel_pulls() < 0 || req.parallel_pulls() > kMaxParallelPulls) {
    return absl::InvalidArgumentError("parallel pulls out of range");
  }
  Log("coordinator")
      ->info("job {}: restoring version {} (step {}) from {} as {}", req.job(),
             use.manifest.version(), use.manifest.step(), use.dir,
             req.config());
  return PlanAndStart(change, false, &use, resp);
}

void CoordinatorService::SnapshotLoop() {
  while (true) {
    std::vector<proto::SnapshotRequest> due;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(1)))
        return;
      const absl::Time now = absl::Now();
      for (const auto& [name, job] : jobs_) {
        const auto& s = job->state;
        if (s.snapshot_root().empty() || s.committed_version() <= 0 ||
            s.committed_version() == s.snapshot_version() ||
            s.target_version() != 0 || snapshotting_.count(name))
          continue;
        if (auto r = snapshot_retry_.find(name);
            r != snapshot_retry_.end() && now < r->second)
          continue;
        const bool by_versions = s.snapshot_every_versions() > 0 &&
                                 s.committed_version() - s.snapshot_version() >=
                                     s.snapshot_every_versions();
        const bool by_time = s.snapshot_every_seconds() > 0 &&
                             now - absl::FromUnixSeconds(s.snapshot_unix()) >=
                                 absl::Seconds(s.snapshot_every_seconds());
        if (!by_versions && !by_time) continue;
        proto::SnapshotRequest r;
        r.set_job(name);
        r.set_root(s.snapshot_root());
        r.set_keep(s.snapshot_keep());
        r.set_max_bytes_per_second(s.snapshot_max_bytes_per_second());
        due.push_back(std::move(r));
      }
    }
    for (const proto::SnapshotRequest& r : due) {
      auto e = DoSnapshot(r, nullptr);
      absl::MutexLock lock(&mu_);
      if (e.ok()) {
        snapshot_retry_.erase(r.job());
      } else {
        Log("coordinator")
            ->warn("job {}: periodic snapshot failed (retried in 30 s): {}",
                   r.job(), e.status().ToString());
        snapshot_retry_[r.job()] = absl::Now() + absl::Seconds(30);
      }
      if (stop_) return;
    }
  }
}

}  // namespace ptc
