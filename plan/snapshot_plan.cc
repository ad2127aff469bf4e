#include "plan/snapshot_plan.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "ptc/region_proto.h"

namespace ptc {

absl::Status CheckSnapshotFitsSpec(const proto::SnapshotManifest& manifest,
                                   const ModelSpec& spec) {
  auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the snapshot of job '", manifest.job(), "' (version ",
        manifest.version(), ") does not fit this job's model: ", why));
  };
  if (manifest.tensors_size() != static_cast<int>(spec.tensors.size())) {
    return refuse(absl::StrCat(manifest.tensors_size(), " tensors, not ",
                               spec.tensors.size()));
  }
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    const proto::TensorDecl& d = manifest.tensors(t);
    const TensorSpec& s = spec.tensors[t];
    const Shape shape(d.shape().begin(), d.shape().end());
    if (d.key() != s.key || d.dtype() != DTypeName(s.dtype) ||
        shape != s.shape) {
      return refuse(absl::StrCat("tensor ", t, " is '", d.key(), "' ",
                                 d.dtype(), ", not '", s.key, "' ",
                                 DTypeName(s.dtype), " of that shape"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Tensor -> the manifest's regions of it (index into manifest.regions).
std::vector<std::vector<std::pair<Region, int>>> RegionsByTensor(
    const proto::SnapshotManifest& manifest) {
  std::vector<std::vector<std::pair<Region, int>>> out(manifest.tensors_size());
  for (int i = 0; i < manifest.regions_size(); ++i) {
    const proto::SnapshotRegion& r = manifest.regions(i);
    auto region = RegionFromProto(r.region());
    if (!region.ok() || r.tensor() < 0 || r.tensor() >= manifest.tensors_size())
      continue;
    out[r.tensor()].push_back({*std::move(region), i});
  }
  return out;
}

}  // namespace

absl::Status SplitSnapshotPieces(const proto::SnapshotManifest& manifest,
                                 Plan* plan) {
  const auto regions = RegionsByTensor(manifest);
  for (HostFragment& f : plan->fragments) {
    std::vector<Transfer> out;
    out.reserve(f.transfers.size());
    for (const Transfer& x : f.transfers) {
      if (x.source_host != kFromSnapshot) {
        out.push_back(x);
        continue;
      }
      int64_t covered = 0;
      for (const auto& [region, index] : regions[x.tensor]) {
        const Region part = region.Intersect(x.region);
        if (part.empty()) continue;
        Transfer y = x;
        y.region = part;
        covered += part.volume();
        out.push_back(std::move(y));
      }
      if (covered != x.region.volume()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the snapshot's regions of tensor ", x.tensor,
                         " do not cover ", x.region.ToString()));
      }
    }
    f.transfers = std::move(out);
  }
  return absl::OkStatus();
}

proto::SnapshotSource SnapshotSourceFor(const proto::SnapshotManifest& manifest,
                                        const std::string& dir,
                                        const Plan& plan,
                                        const HostFragment& f) {
  proto::SnapshotSource out;
  out.set_dir(dir);
  const auto regions = RegionsByTensor(manifest);
  std::set<int> used;
  for (const Transfer& x : f.transfers) {
    if (x.source_host != kFromSnapshot) continue;
    for (const auto& [region, index] : regions[x.tensor]) {
      if (region.Contains(x.region)) {
        used.insert(index);
        break;
      }
    }
  }
  for (int i : used) *out.add_regions() = manifest.regions(i);
  std::set<std::pair<std::string, int32_t>> objects;
  for (const SmallObjectMove& m : plan.small_objects) {
    if (m.target_host == f.host && m.source_host == kFromSnapshot &&
        m.derive_from.empty())
      objects.insert({m.name, m.source_rank});
  }
  for (const proto::SnapshotSmallObject& o : manifest.small_objects()) {
    if (objects.count({o.name(), o.rank()})) *out.add_small_objects() = o;
  }
  return out;
}

std::vector<std::pair<uint64_t, int64_t>> SnapshotFingerprints(
    const proto::SnapshotManifest& manifest) {
  std::vector<std::pair<uint64_t, int64_t>> out(manifest.tensors_size());
  for (const proto::SnapshotRegion& r : manifest.regions()) {
    if (r.tensor() < 0 || r.tensor() >= manifest.tensors_size()) continue;
    auto region = RegionFromProto(r.region());
    if (!region.ok()) continue;
    out[r.tensor()].first += r.fingerprint();
    out[r.tensor()].second += region->volume();
  }
  return out;
}

}  // namespace ptc
