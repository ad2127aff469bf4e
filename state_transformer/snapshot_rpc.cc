// The snapshot RPCs of TransformerService: a host writes its share of a
// snapshot, completes one, or reads the newest manifest of a root.
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "snapshot/snapshot_dir.h"
#include "snapshot/snapshot_writer.h"
#include "state_transformer/transformer_service.h"

namespace ptc {

grpc::Status TransformerService::WriteSnapshot(
    grpc::ServerContext* ctx, const proto::WriteSnapshotRequest* req,
    grpc::ServerWriter<proto::SnapshotProgress>* writer) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "WriteSnapshot", req);
      !denied.ok())
    return denied;
  auto run = [&]() -> absl::Status {
    if (store_->hollow()) {
      return absl::FailedPreconditionError(
          "this ptcd is hollow (a scale test's: it keeps no bytes) and "
          "cannot write a snapshot");
    }
    PTC_RETURN_IF_ERROR(CheckSnapshotRoot(req->root(), options_.snapshot_root));
    if (req->version() <= 0 || req->max_bytes_per_second() < 0) {
      return absl::InvalidArgumentError(
          "a snapshot needs a positive version and a non-negative rate");
    }
    if (req->regions_size() > kMaxSnapshotRegions) {
      return absl::InvalidArgumentError(absl::StrCat(
          req->regions_size(), " regions; at most ", kMaxSnapshotRegions));
    }
    SnapshotFileRequest r;
    r.job = req->job();
    r.version = req->version();
    r.dir = absl::StrCat(req->root(), "/", SnapshotDirName(req->version()));
    r.file = req->file();
    r.regions.reserve(req->regions_size());
    for (const proto::PieceRef& p : req->regions()) {
      PTC_ASSIGN_OR_RETURN(Region region, RegionFromProto(p.region()));
      r.regions.push_back({p.tensor(), std::move(region)});
    }
    r.max_bytes_per_second = req->max_bytes_per_second();
    r.paused = [this] { return fragments_running_.load() > 0; };
    std::atomic<bool> cancel{false};
    r.cancel = &cancel;
    absl::Time last = absl::InfinitePast();
    r.progress = [&](int64_t done, int64_t total) {
      if (ctx->IsCancelled()) cancel = true;
      if (absl::Now() - last < absl::Milliseconds(200)) return;
      last = absl::Now();
      proto::SnapshotProgress p;
      p.set_bytes_done(done);
      p.set_bytes_total(total);
      if (!writer->Write(p)) cancel = true;
    };
    const absl::Time start = absl::Now();
    PTC_ASSIGN_OR_RETURN(proto::SnapshotProgress done,
                         WriteSnapshotFile(store_, r));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    Log("transformer")
        ->info(
            "job {}: snapshot of version {}: wrote {} ({} bytes, {} "
            "regions) in {:.2f} s ({:.0f} MB/s)",
            req->job(), req->version(), r.dir + "/" + r.file, done.bytes_done(),
            done.regions_size(), seconds,
            seconds > 0 ? done.bytes_done() / seconds / 1e6 : 0.0);
    writer->Write(done);
    return absl::OkStatus();
  };
  const absl::Status s = run();
  if (!s.ok()) {
    Log("transformer")
        ->warn("job {}: snapshot of version {} failed: {}", req->job(),
               req->version(), s.ToString());
  }
  return ToGrpcStatus(s);
}

grpc::Status TransformerService::FinishSnapshot(
    grpc::ServerContext* ctx, const proto::FinishSnapshotRequest* req,
    proto::FinishSnapshotResponse* resp) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "FinishSnapshot", req);
      !denied.ok())
    return denied;
  auto run = [&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(CheckSnapshotRoot(req->root(), options_.snapshot_root));
    if (req->keep() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("keep ", req->keep(), " must be at least 1"));
    }
    const std::string dir = absl::StrCat(
        req->root(), "/", SnapshotDirName(req->manifest().version()));
    // The manifest must describe what is there: checked as a reader will.
    PTC_RETURN_IF_ERROR(
        ManifestFromJson(ManifestToJson(req->manifest()), "the manifest")
            .status());
    for (const proto::SnapshotFile& f : req->manifest().files()) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(dir + "/" + f.name(), ec);
      if (ec || static_cast<int64_t>(size) != f.bytes()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "snapshot file ", dir, "/", f.name(), " is not there with ",
            f.bytes(), " bytes; the snapshot is not complete"));
      }
    }
    // A writer that died (or was replaced) left its temporary file: the
    // complete snapshot holds only what its manifest lists.
    std::set<std::string> listed;
    for (const proto::SnapshotFile& f : req->manifest().files())
      listed.insert(f.name());
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (absl::StartsWith(name, ".") && absl::EndsWith(name, ".tmp") &&
          !listed.count(name)) {
        std::filesystem::remove(entry.path(), ec);
      }
    }
    PTC_RETURN_IF_ERROR(WriteManifest(dir, req->manifest()));
    resp->set_dir(dir);
    PTC_ASSIGN_OR_RETURN(
        std::vector<std::string> removed,
        RetainSnapshots(req->root(), req->manifest().job(), req->keep(), dir));
    for (const std::string& r : removed) resp->add_removed(r);
    Log("transformer")
        ->info(
            "job {}: snapshot of version {} complete in {} ({} older "
            "removed)",
            req->manifest().job(), req->manifest().version(), dir,
            removed.size());
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

grpc::Status TransformerService::ReadSnapshot(
    grpc::ServerContext* ctx, const proto::ReadSnapshotRequest* req,
    proto::ReadSnapshotResponse* resp) {
  if (grpc::Status denied = Admit<proto::Transformer>(*ctx, "ReadSnapshot", req);
      !denied.ok())
    return denied;
  auto run = [&]() -> absl::Status {
    PTC_RETURN_IF_ERROR(CheckSnapshotRoot(req->root(), options_.snapshot_root));
    PTC_ASSIGN_OR_RETURN(LatestSnapshotResult latest,
                         LatestSnapshot(req->root(), req->job()));
    resp->set_dir(latest.dir);
    *resp->mutable_manifest() = std::move(latest.manifest);
    return absl::OkStatus();
  };
  return ToGrpcStatus(run());
}

}  // namespace ptc
