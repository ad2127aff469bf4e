// Snapshot, Restore and the periodic snapshotter of CoordinatorService.
#include <algorithm>
#include <map>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/snapshot_plan.h"
#include "proto/transformer.grpc.pb.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/region_proto.h"
#include "snapshot/snapshot_dir.h"
#include "tensor_store/store_client.h"

namespace ptc {
namespace {

std::unique_ptr<proto::Transformer::Stub> Stub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxManifestBytes) +
                                (1 << 20));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxManifestBytes) + (1 << 20));
  return proto::Transformer::NewStub(OpenChannel(address, args));
}

// A host's snapshot file name: its name, with characters a file name
// cannot hold replaced.
std::string FileFor(const std::string& host) {
  std::string out;
  for (char c : host)
    out += absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' ? c : '_';
  if (out.empty() || out[0] == '.') out = "h" + out;
  return out.substr(0, 200) + ".safetensors";
}

constexpr int kDefaultKeep = 3;
constexpr int kMaxKeep = 1000;

}  // namespace

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
    last = FromGrpcStatus(Stub(a)->ReadSnapshot(&ctx, req, &resp));
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
  if (req.keep() < 0 || req.keep() > kMaxKeep ||
      req.max_bytes_per_second() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep must be 0 (", kDefaultKeep, ") to ", kMaxKeep,
                     " and the rate not negative"));
  }
  // What to write, under the lock.
  std::shared_ptr<const ModelSpec> spec;
  proto::CoordinatorState::Job state;
  std::pair<std::vector<std::string>, std::vector<int32_t>> ranks;
  Resources res;
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
    s.set_snapshot_keep(req.keep() > 0 ? req.keep() : kDefaultKeep);
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
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    snapshotting_.erase(req.job());
  };
  const absl::Time start = absl::Now();
  const int64_t version = state.committed_version();
  PTC_ASSIGN_OR_RETURN(ParallelConfig config,
                       spec->ParseConfig(state.config()));
  PTC_ASSIGN_OR_RETURN(Layout layout, BuildLayout(*spec, config));
  // The hosts that hold the committed version: live, not lost.
  std::map<std::string, int32_t> id_of;
  for (size_t i = 0; i < res.names.size(); ++i) id_of[res.names[i]] = i;
  std::set<std::string> lost(state.lost_hosts().begin(),
                             state.lost_hosts().end());
  std::vector<bool> holding(res.names.size());
  for (size_t i = 0; i < res.names.size(); ++i) {
    holding[i] = res.alive[i] && !lost.count(res.names[i]) &&
                 res.addresses.count(static_cast<int32_t>(i));
  }
  auto holds = [&](const std::string& host) {
    auto it = id_of.find(host);
    return it != id_of.end() && holding[it->second];
  };
  std::vector<int32_t> rank_host;
  for (const std::string& host : ranks.first) {
    auto it = id_of.find(host);
    rank_host.push_back(it == id_of.end() ? -1 : it->second);
  }
  PTC_ASSIGN_OR_RETURN(
      const SnapshotWriters writers,
      AssignSnapshotWriters(*spec, layout, rank_host, holding, version));
  std::map<std::string, std::vector<std::pair<int32_t, Region>>> work;
  for (const auto& [h, regions] : writers.regions)
    work[res.names[h]] = regions;
  // The small objects of every rank, from the host that saved them.
  proto::SnapshotManifest manifest;
  {
    absl::Mutex mu;
    std::map<std::string, std::vector<int32_t>> ranks_on;
    for (int32_t r = 0; r < layout.world_size(); ++r)
      ranks_on[ranks.first[r]].push_back(r);
    std::vector<std::string> addresses;
    std::map<std::string, std::string> host_at;
    for (const auto& [host, rs] : ranks_on) {
      if (spec->small_objects.empty()) break;
      if (!holds(host)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "host ", host,
            ", which holds the small objects (RNG states, "
            "step counters) of ranks ",
            rs.front(), "..", rs.back(),
            ", is dead or lost them; bring it back or snapshot after the "
            "next save"));
      }
      addresses.push_back(res.addresses.at(id_of[host]));
      host_at[addresses.back()] = host;
    }
    PTC_RETURN_IF_ERROR(OnEachAddress(addresses, [&](const std::string& a) {
      auto client = StoreClient::Connect(a);
      for (int32_t r : ranks_on[host_at[a]]) {
        for (const SmallObjectSpec& o : spec->small_objects) {
          auto bytes = client->GetSmallObject(req.job(), version, o.name, r);
          if (absl::IsNotFound(bytes.status())) continue;  // never saved
          if (!bytes.ok()) {
            return Annotate(bytes.status(),
                            absl::StrCat("small object '", o.name, "' of rank ",
                                         r, " on ", host_at[a]));
          }
          absl::MutexLock lock(&mu);
          proto::SnapshotSmallObject* so = manifest.add_small_objects();
          so->set_name(o.name);
          so->set_rank(r);
          so->set_checksum(Checksum(bytes->data(), bytes->size()));
          so->set_data(*std::move(bytes));
        }
      }
      return absl::OkStatus();
    }));
  }
  // Every host writes its file, in parallel. A writer that fails (its
  // ptcd died, its disk) is replaced: what it was to write is written by
  // other live holders into files of their own, up to kWriteRounds rounds.
  constexpr int kWriteRounds = 3;
  struct Written {
    std::string host;
    proto::SnapshotProgress result;
    std::vector<std::pair<int32_t, Region>> regions;
  };
  absl::Mutex mu;
  std::map<std::string, std::pair<int64_t, int64_t>> file_progress;
  std::map<std::string, Written> results;  // by file name
  std::vector<std::string> wrote_at;       // addresses of those that wrote
  proto::SnapshotEvent event;
  event.set_version(version);
  event.set_step(state.committed_step());
  event.set_hosts(static_cast<int32_t>(work.size()));
  for (int round = 0; !work.empty(); ++round) {
    std::vector<std::string> addresses;
    std::map<std::string, std::string> host_at;
    for (const auto& [host, regions] : work) {
      addresses.push_back(res.addresses.at(id_of[host]));
      host_at[addresses.back()] = host;
    }
    std::map<std::string, absl::Status> failed;  // host -> why
    OnEachAddress(addresses, [&](const std::string& a) {
      const std::string& host = host_at.at(a);
      const std::string file =
          round == 0 ? FileFor(host)
                     : absl::StrCat(absl::StripSuffix(FileFor(host),
                                                      ".safetensors"),
                                    ".r", round, ".safetensors");
      proto::WriteSnapshotRequest w;
      w.set_job(req.job());
      w.set_version(version);
      w.set_root(req.root());
      w.set_file(file);
      w.set_max_bytes_per_second(state.snapshot_max_bytes_per_second());
      for (const auto& [tensor, region] : work.at(host)) {
        proto::PieceRef* p = w.add_regions();
        p->set_tensor(spec->tensors[tensor].key);
        RegionToProto(region, p->mutable_region());
      }
      grpc::ClientContext ctx;
      auto reader = Stub(a)->WriteSnapshot(&ctx, w);
      proto::SnapshotProgress p;
      proto::SnapshotProgress last;
      while (reader->Read(&p)) {
        absl::MutexLock lock(&mu);
        file_progress[file] = {p.bytes_done(), p.bytes_total()};
        if (p.done()) last = p;
        if (progress) {
          proto::SnapshotEvent e = event;
          for (const auto& [f, d] : file_progress) {
            e.set_bytes_done(e.bytes_done() + d.first);
            e.set_bytes_total(e.bytes_total() + d.second);
          }
          progress(e);
        }
      }
      absl::Status s = Annotate(
          FromGrpcStatus(reader->Finish()),
          absl::StrCat("writing the snapshot on ", host, " (", a, ")"));
      if (s.ok() && (!last.done() || last.regions_size() != w.regions_size())) {
        s = absl::DataLossError(absl::StrCat(
            host, " ended its snapshot write without listing every region"));
      }
      absl::MutexLock lock(&mu);
      if (!s.ok()) {
        failed[host] = s;
        file_progress.erase(file);
        return s;
      }
      results[file] = {host, std::move(last), work.at(host)};
      wrote_at.push_back(a);
      return absl::OkStatus();
    }).IgnoreError();
    if (failed.empty()) break;
    // What the failed writers were to write, from the other holders.
    std::vector<std::pair<int32_t, Region>> orphans;
    for (const auto& [host, why] : failed) {
      Log("coordinator")
          ->warn("job {}: snapshot of version {}: {}; its regions go to "
                 "other holders",
                 req.job(), version, why.ToString());
      holding[id_of[host]] = false;
      for (const auto& part : work[host]) orphans.push_back(part);
    }
    const absl::Status& first = failed.begin()->second;
    if (round + 1 == kWriteRounds) {
      return Annotate(first, absl::StrCat("after ", kWriteRounds,
                                          " rounds of writers failing"));
    }
    auto again = ReassignSnapshotParts(*spec, layout, rank_host, holding,
                                       orphans, version);
    if (!again.ok()) {
      return absl::Status(first.code(),
                          absl::StrCat(first.message(), "; ",
                                       again.status().message()));
    }
    work.clear();
    for (const auto& [h, regions] : again->regions)
      work[res.names[h]] = regions;
  }
  // The manifest: the contract every later reader holds to.
  manifest.set_format(kSnapshotFormat);
  manifest.set_job(req.job());
  manifest.set_version(version);
  manifest.set_step(state.committed_step());
  manifest.set_created_unix(absl::ToUnixSeconds(absl::Now()));
  if (state.has_layout()) {
    *manifest.mutable_layout() = state.layout();
  } else {
    manifest.set_model(state.model());
  }
  manifest.set_config(state.config());
  for (const TensorSpec& t : spec->tensors) {
    proto::TensorDecl* d = manifest.add_tensors();
    d->set_key(t.key);
    d->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t e : t.shape) d->add_shape(e);
  }
  int64_t total = 0;
  for (auto& [file, written] : results) {
    const proto::SnapshotProgress& r = written.result;
    proto::SnapshotFile* f = manifest.add_files();
    *f = r.file();
    f->set_host(written.host);
    total += f->bytes();
    for (int i = 0; i < r.regions_size(); ++i) {
      proto::SnapshotRegion* e = manifest.add_regions();
      *e = r.regions(i);
      e->set_tensor(written.regions[i].first);
    }
  }
  manifest.set_total_bytes(total);
  proto::FinishSnapshotRequest finish;
  finish.set_root(req.root());
  *finish.mutable_manifest() = manifest;
  finish.set_keep(state.snapshot_keep() > 0 ? state.snapshot_keep()
                                            : kDefaultKeep);
  proto::FinishSnapshotResponse finished;
  if (wrote_at.empty()) {
    return absl::FailedPreconditionError("the job has no tensors to snapshot");
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
    const std::string& a = wrote_at.front();
    PTC_RETURN_IF_ERROR(Annotate(
        FromGrpcStatus(Stub(a)->FinishSnapshot(&ctx, finish, &finished)),
        "writing the snapshot's manifest"));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  {
    absl::MutexLock lock(&mu_);
    Job* found = jobs_.Find(req.job());
    if (found != nullptr) {
      found->state.set_snapshot_version(version);
      found->state.set_snapshot_unix(manifest.created_unix());
      PersistLocked().IgnoreError();
    }
  }
  Log("coordinator")
      ->info(
          "job {}: snapshot of version {} (step {}) in {}: {} bytes from "
          "{} hosts in {:.2f} s",
          req.job(), version, state.committed_step(), finished.dir(), total,
          results.size(), seconds);
  event.set_done(true);
  event.set_dir(finished.dir());
  event.set_files(manifest.files_size());
  event.set_seconds(seconds);
  event.set_bytes_done(total);
  event.set_bytes_total(total);
  for (const std::string& r : finished.removed()) event.add_removed(r);
  return event;
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
