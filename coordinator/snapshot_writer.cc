#include "coordinator/snapshot_writer.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/reconfigure_driver.h"
#include "plan/snapshot_plan.h"
#include "ptc/layout.h"
#include "ptc/region_proto.h"
#include "ptc/small_object.h"
#include "snapshot/snapshot_dir.h"
#include "tensor_store/store_client.h"

namespace ptc {
std::unique_ptr<proto::Transformer::Stub> SnapshotStub(
    const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxManifestBytes) +
                                (1 << 20));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxManifestBytes) + (1 << 20));
  return proto::Transformer::NewStub(OpenChannel(address, args));
}

std::string SnapshotFileFor(const std::string& host) {
  std::string out;
  for (char c : host)
    out += absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' ? c : '_';
  if (out.empty() || out[0] == '.') out = "h" + out;
  return out.substr(0, 200) + ".safetensors";
}

namespace {

// One snapshot being written: what WriteSnapshot's steps share.
struct SnapshotRun {
  explicit SnapshotRun(const SnapshotJob& job)
      : in(job),
        spec(job.spec),
        state(job.state),
        version(job.state.committed_version()) {}

  // Which live holder (live, not lost) writes which regions.
  absl::Status Assign() {
    PTC_ASSIGN_OR_RETURN(ParallelConfig config,
                         spec->ParseConfig(state.config()));
    PTC_ASSIGN_OR_RETURN(layout, BuildLayout(*spec, config));
    for (size_t i = 0; i < in.names.size(); ++i) id_of[in.names[i]] = i;
    std::set<std::string> lost(state.lost_hosts().begin(),
                               state.lost_hosts().end());
    holding.resize(in.names.size());
    for (size_t i = 0; i < in.names.size(); ++i) {
      holding[i] = in.alive[i] && !lost.count(in.names[i]) &&
                   in.addresses.count(static_cast<int32_t>(i));
    }
    for (const std::string& host : in.rank_hosts) {
      auto it = id_of.find(host);
      rank_host.push_back(it == id_of.end() ? -1 : it->second);
    }
    PTC_ASSIGN_OR_RETURN(
        const SnapshotWriters writers,
        AssignSnapshotWriters(*spec, layout, rank_host, holding, version));
    for (const auto& [h, regions] : writers.regions)
      work[in.names[h]] = regions;
    return absl::OkStatus();
  }

  bool Holds(const std::string& host) const {
    auto it = id_of.find(host);
    return it != id_of.end() && holding[it->second];
  }

  // The small objects of every rank, from the host that saved them, into
  // the manifest. A rank whose host is dead or lost them takes each from
  // another rank of its class (the same coordinates on the object's scope:
  // the same copy) on a live host, else the copy the coordinator keeps,
  // else, for an object a new rank derives (an RNG state), a fresh value,
  // as a change would give it.
  absl::Status GatherSmallObjects() {
    if (spec->small_objects.empty()) return absl::OkStatus();
    absl::Mutex mu;
    std::map<std::string, std::vector<int32_t>> ranks_on;
    std::vector<int32_t> orphans;  // ranks on hosts that do not hold them
    for (int32_t r = 0; r < layout.world_size(); ++r) {
      if (Holds(in.rank_hosts[r])) {
        ranks_on[in.rank_hosts[r]].push_back(r);
      } else {
        orphans.push_back(r);
      }
    }
    std::vector<std::string> addresses;
    std::map<std::string, std::string> host_at;
    for (const auto& [host, rs] : ranks_on) {
      addresses.push_back(in.addresses.at(id_of.at(host)));
      host_at[addresses.back()] = host;
    }
    // (object, rank) -> its bytes, from the live hosts.
    std::map<std::pair<int, int32_t>, std::string> got;
    PTC_RETURN_IF_ERROR(OnEachAddress(addresses, [&](const std::string& a) {
      auto client = StoreClient::ConnectKept(a);
      for (int32_t r : ranks_on[host_at[a]]) {
        for (size_t o = 0; o < spec->small_objects.size(); ++o) {
          const std::string& name = spec->small_objects[o].name;
          auto bytes = client->GetSmallObject(in.job, version, name, r);
          if (absl::IsNotFound(bytes.status())) continue;  // never saved
          if (!bytes.ok()) {
            return Annotate(bytes.status(),
                            absl::StrCat("small object '", name, "' of rank ",
                                         r, " on ", host_at[a]));
          }
          absl::MutexLock lock(&mu);
          got[{static_cast<int>(o), r}] = *std::move(bytes);
        }
      }
      return absl::OkStatus();
    }));
    if (!orphans.empty()) PTC_RETURN_IF_ERROR(FillOrphans(orphans, &got));
    for (auto& [key, bytes] : got) {
      proto::SnapshotSmallObject* so = manifest.add_small_objects();
      so->set_name(spec->small_objects[key.first].name);
      so->set_rank(key.second);
      so->set_checksum(Checksum(bytes.data(), bytes.size()));
      so->set_data(std::move(bytes));
    }
    return absl::OkStatus();
  }

  // GatherSmallObjects' ranks on hosts that do not hold them.
  absl::Status FillOrphans(
      const std::vector<int32_t>& orphans,
      std::map<std::pair<int, int32_t>, std::string>* got) {
    const ParallelConfig& config = *layout.config();
    int from_peers = 0, from_coordinator = 0, fresh = 0;
    // Copies from the live hosts only (not those filled in here).
    std::map<std::pair<int, int32_t>, std::string> filled;
    for (size_t o = 0; o < spec->small_objects.size(); ++o) {
      const SmallObjectSpec& object = spec->small_objects[o];
      // Each class's ranks.
      std::map<std::string, std::vector<int32_t>> classes;
      for (int32_t r = 0; r < layout.world_size(); ++r) {
        classes[ScopeCoordinates(object, config, config.CoordOf(r))].push_back(
            r);
      }
      for (int32_t r : orphans) {
        const std::string scope =
            ScopeCoordinates(object, config, config.CoordOf(r));
        const std::string* copy = nullptr;
        for (int32_t c : classes[scope]) {
          auto it = got->find({static_cast<int>(o), c});
          if (it != got->end()) {
            copy = &it->second;
            break;
          }
        }
        std::string bytes;
        if (copy != nullptr) {
          bytes = *copy;
          ++from_peers;
        } else if (const std::string* kept = KeptCopy(object, classes[scope]);
                   kept != nullptr) {
          bytes = *kept;
          ++from_coordinator;
        } else if (object.new_ranks == NewRankRule::kDerive) {
          bytes = DerivedSmallObject(in.job, object.name, scope, version);
          ++fresh;
        } else {
          return absl::FailedPreconditionError(absl::StrCat(
              "host ", in.rank_hosts[r], ", which holds small object '",
              object.name, "' of rank ", r,
              ", is dead or lost it, and no live host or the coordinator "
              "holds another copy; bring it back or snapshot after the "
              "next save"));
        }
        filled[{static_cast<int>(o), r}] = std::move(bytes);
      }
    }
    got->merge(filled);
    Log("coordinator")
        ->warn(
            "snapshot of job {}: the small objects of {} ranks whose host "
            "is dead or lost them: {} from other ranks' copies, {} from "
            "the copies the coordinator keeps, {} fresh values",
            in.job, orphans.size(), from_peers, from_coordinator, fresh);
    return absl::OkStatus();
  }

  // The coordinator's copy of `object` kept for one of `ranks`, or null.
  const std::string* KeptCopy(const SmallObjectSpec& object,
                              const std::vector<int32_t>& ranks) const {
    if (in.kept == nullptr) return nullptr;
    for (int32_t c : ranks) {
      if (const std::string* k = in.kept->Find(object.name, c)) return k;
    }
    return nullptr;
  }

  // Every writer's file.
  absl::Status WriteFiles(
      const std::function<void(const proto::SnapshotEvent&)>& progress) {
    // Every host writes its file, in parallel. A writer that fails (its
    // ptcd died, its disk) is replaced: what it was to write is written by
    // other live holders into files of their own, up to kWriteRounds rounds.
    constexpr int kWriteRounds = 3;
    absl::Mutex mu;
    std::map<std::string, std::pair<int64_t, int64_t>> file_progress;
    event.set_version(version);
    event.set_step(state.committed_step());
    event.set_hosts(static_cast<int32_t>(work.size()));
    for (int round = 0; !work.empty(); ++round) {
      std::vector<std::string> addresses;
      std::map<std::string, std::string> host_at;
      for (const auto& [host, regions] : work) {
        addresses.push_back(in.addresses.at(id_of.at(host)));
        host_at[addresses.back()] = host;
      }
      std::map<std::string, absl::Status> failed;  // host -> why
      OnEachAddress(addresses, [&](const std::string& a) {
        const std::string& host = host_at.at(a);
        const std::string file =
            round == 0 ? SnapshotFileFor(host)
                       : absl::StrCat(absl::StripSuffix(SnapshotFileFor(host),
                                                        ".safetensors"),
                                      ".r", round, ".safetensors");
        proto::WriteSnapshotRequest w;
        w.set_job(in.job);
        w.set_version(version);
        w.set_root(in.root);
        w.set_file(file);
        w.set_max_bytes_per_second(state.snapshot_max_bytes_per_second());
        for (const auto& [tensor, region] : work.at(host)) {
          proto::PieceRef* p = w.add_regions();
          p->set_tensor(spec->tensors[tensor].key);
          RegionToProto(region, p->mutable_region());
        }
        grpc::ClientContext ctx;
        auto reader = SnapshotStub(a)->WriteSnapshot(&ctx, w);
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
        if (s.ok() &&
            (!last.done() || last.regions_size() != w.regions_size())) {
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
            ->warn(
                "job {}: snapshot of version {}: {}; its regions go to "
                "other holders",
                in.job, version, why.ToString());
        holding[id_of.at(host)] = false;
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
        return absl::Status(
            first.code(),
            absl::StrCat(first.message(), "; ", again.status().message()));
      }
      work.clear();
      for (const auto& [h, regions] : again->regions)
        work[in.names[h]] = regions;
    }
    return absl::OkStatus();
  }

  // The manifest, written last by a host that wrote a file: it makes the
  // snapshot complete.
  absl::StatusOr<SnapshotWritten> Finish() {
    // The manifest: the contract every later reader holds to.
    manifest.set_format(kSnapshotFormat);
    manifest.set_job(in.job);
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
    finish.set_root(in.root);
    *finish.mutable_manifest() = manifest;
    finish.set_keep(state.snapshot_keep() > 0 ? state.snapshot_keep()
                                              : kDefaultSnapshotKeep);
    proto::FinishSnapshotResponse finished;
    if (wrote_at.empty()) {
      return absl::FailedPreconditionError(
          "the job has no tensors to snapshot");
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
      const std::string& a = wrote_at.front();
      PTC_RETURN_IF_ERROR(
          Annotate(FromGrpcStatus(SnapshotStub(a)->FinishSnapshot(&ctx, finish,
                                                                  &finished)),
                   "writing the snapshot's manifest"));
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    Log("coordinator")
        ->info(
            "job {}: snapshot of version {} (step {}) in {}: {} bytes from "
            "{} hosts in {:.2f} s",
            in.job, version, state.committed_step(), finished.dir(), total,
            results.size(), seconds);
    event.set_done(true);
    event.set_dir(finished.dir());
    event.set_files(manifest.files_size());
    event.set_seconds(seconds);
    event.set_bytes_done(total);
    event.set_bytes_total(total);
    for (const std::string& r : finished.removed()) event.add_removed(r);
    return SnapshotWritten{std::move(event), manifest.created_unix()};
  }

  const SnapshotJob& in;
  const std::shared_ptr<const ModelSpec>& spec;
  const proto::CoordinatorState::Job& state;
  const int64_t version;
  const absl::Time start = absl::Now();
  Layout layout;
  std::map<std::string, int32_t> id_of;
  std::vector<bool> holding;       // by host id: holds the version
  std::vector<int32_t> rank_host;  // by rank: its host's id (-1: unknown)
  // Host -> the regions it writes in the current round.
  std::map<std::string, std::vector<std::pair<int32_t, Region>>> work;
  proto::SnapshotManifest manifest;
  struct Written {
    std::string host;
    proto::SnapshotProgress result;
    std::vector<std::pair<int32_t, Region>> regions;
  };
  std::map<std::string, Written> results;  // by file name
  std::vector<std::string> wrote_at;       // addresses of those that wrote
  proto::SnapshotEvent event;
  int64_t total = 0;
};

}  // namespace

absl::StatusOr<SnapshotWritten> WriteSnapshot(
    const SnapshotJob& in,
    const std::function<void(const proto::SnapshotEvent&)>& progress) {
  SnapshotRun run(in);
  PTC_RETURN_IF_ERROR(run.Assign());
  PTC_RETURN_IF_ERROR(run.GatherSmallObjects());
  PTC_RETURN_IF_ERROR(run.WriteFiles(progress));
  return run.Finish();
}

}  // namespace ptc
