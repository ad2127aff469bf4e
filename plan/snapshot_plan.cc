#include "plan/snapshot_plan.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "plan/internal/cover.h"
#include "ptc/region_proto.h"

namespace ptc {

absl::StatusOr<SnapshotWriters> AssignSnapshotWriters(
    const ModelSpec& spec, const Layout& layout,
    const std::vector<int32_t>& rank_host, const std::vector<bool>& holds,
    int64_t version) {
  if (static_cast<int>(rank_host.size()) != layout.world_size()) {
    return absl::InternalError("the job's placement does not fit its config");
  }
  auto holder = [&](int32_t h) {
    return h >= 0 && h < static_cast<int32_t>(holds.size()) && holds[h];
  };
  SnapshotWriters out;
  for (int t = 0; t < layout.num_tensors(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    const int64_t elem = ElementSize(ts.dtype);
    // Each distinct region and its holders, in rank order.
    std::map<Region, std::vector<int32_t>> groups;
    for (const Shard& sh : layout.shards(t)) {
      const int32_t host = rank_host[sh.rank];
      std::vector<int32_t>& g = groups[sh.region];
      if (holder(host) && std::find(g.begin(), g.end(), host) == g.end())
        g.push_back(host);
    }
    int64_t volume = 0;
    for (const auto& [region, hosts] : groups) {
      if (hosts.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "region ", region.ToString(), " of tensor '", ts.key,
            "' has no live holder of version ", version,
            "; bring its host back (or snapshot after the next save)"));
      }
      volume += region.volume();
    }
    if (volume == NumElements(ts.shape)) {
      std::vector<std::pair<Region, const std::vector<int32_t>*>> order;
      for (const auto& [region, hosts] : groups)
        order.push_back({region, &hosts});
      std::stable_sort(order.begin(), order.end(),
                       [](const auto& a, const auto& b) {
                         return a.first.volume() > b.first.volume();
                       });
      for (const auto& [region, hosts] : order) {
        int32_t best = hosts->front();
        for (int32_t h : *hosts)
          if (out.bytes[h] < out.bytes[best]) best = h;
        out.bytes[best] += region.volume() * elem;
        out.regions[best].push_back({t, region});
      }
      continue;
    }
    std::vector<std::pair<int32_t, Region>> held;
    std::map<int32_t, std::vector<Region>> stored;
    for (const auto& [region, hosts] : groups) {
      for (int32_t h : hosts) {
        held.push_back({h, region});
        stored[h].push_back(region);
      }
    }
    for (const auto& [h, cover] : plan_internal::DisjointCover(
             static_cast<int>(ts.shape.size()), held)) {
      // Each part inside one region the host stores.
      std::vector<Region> rest = cover;
      for (const Region& s : stored[h]) {
        std::vector<Region> next;
        for (const Region& r : rest) {
          const Region part = r.Intersect(s);
          if (!part.empty()) {
            out.regions[h].push_back({t, part});
            out.bytes[h] += part.volume() * elem;
          }
          for (Region& d : r.Difference(s)) next.push_back(std::move(d));
        }
        rest = std::move(next);
      }
    }
  }
  return out;
}

absl::StatusOr<SnapshotWriters> ReassignSnapshotParts(
    const ModelSpec& spec, const Layout& layout,
    const std::vector<int32_t>& rank_host, const std::vector<bool>& holds,
    const std::vector<std::pair<int32_t, Region>>& parts, int64_t version) {
  if (static_cast<int>(rank_host.size()) != layout.world_size()) {
    return absl::InternalError("the job's placement does not fit its config");
  }
  SnapshotWriters out;
  for (const auto& [t, part] : parts) {
    if (t < 0 || t >= layout.num_tensors()) {
      return absl::InternalError(absl::StrCat("tensor ", t, " is not the job's"));
    }
    int32_t best = -1;
    for (const Shard& sh : layout.shards(t)) {
      const int32_t h = rank_host[sh.rank];
      if (h < 0 || h >= static_cast<int32_t>(holds.size()) || !holds[h] ||
          sh.region.Intersect(part) != part)
        continue;
      if (best < 0 || out.bytes[h] < out.bytes[best]) best = h;
    }
    if (best < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", part.ToString(), " of tensor '", spec.tensors[t].key,
          "' has no other live holder of version ", version));
    }
    out.bytes[best] += part.volume() * ElementSize(spec.tensors[t].dtype);
    out.regions[best].push_back({t, part});
  }
  return out;
}

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
