#include "ptc/layout.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ptc {

int64_t Layout::RankBytes(const ModelSpec& spec, int rank) const {
  int64_t bytes = 0;
  for (int t = 0; t < num_tensors(); ++t) {
    for (const Shard& s : shards_[t]) {
      if (s.rank == rank) {
        bytes += s.region.volume() * ElementSize(spec.tensors[t].dtype);
      }
    }
  }
  return bytes;
}

namespace {

// ZeRO-1: assigns the optimizer tensors' regions from the flat buffer of
// every (stage, tp rank). `shards` already holds the parameters' shards.
void ResolveZero(const ModelSpec& spec, const ParallelConfig& config,
                 std::vector<std::vector<Shard>>* shards) {
  const int n = static_cast<int>(spec.tensors.size());
  for (int stage = 0; stage < config.pp; ++stage) {
    for (int tp = 0; tp < config.tp; ++tp) {
      MeshCoord first;
      first.index = {stage, 0, tp};
      // Flat offset of each parameter's local shard in the buffer.
      std::vector<int64_t> offset(n, -1);
      int64_t size = 0;
      for (int p = 0; p < n; ++p) {
        const TensorSpec& t = spec.tensors[p];
        if (t.role != Role::kParameter) continue;
        offset[p] = size;
        for (const Region& r :
             RegionsOf(t.rule, t.shape, config, spec.num_layers, first)) {
          size += r.volume();
        }
      }
      for (int dp = 0; dp < config.dp; ++dp) {
        first.index = {stage, dp, tp};
        const int rank = config.RankOf(first);
        auto [lo, hi] = ChunkOf(size, config.dp, dp);
        for (int o = 0; o < n; ++o) {
          const TensorSpec& t = spec.tensors[o];
          if (t.zero_param < 0 || offset[t.zero_param] < 0) continue;
          int64_t at = offset[t.zero_param];
          for (const Region& r :
               RegionsOf(t.rule, t.shape, config, spec.num_layers, first)) {
            const int64_t b = std::max(lo, at),
                          e = std::min(hi, at + r.volume());
            if (b < e) {
              for (const Region& piece : FlatRangeOfRegion(r, b - at, e - at))
                (*shards)[o].push_back({rank, piece});
            }
            at += r.volume();
          }
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<Layout> BuildLayout(const ModelSpec& spec,
                                   const ParallelConfig& config) {
  PTC_RETURN_IF_ERROR(config.Validate(spec.num_layers));
  PTC_RETURN_IF_ERROR(spec.Validate());
  const int n = static_cast<int>(spec.tensors.size());
  std::vector<std::vector<Shard>> shards(n);
  for (int t = 0; t < n; ++t) {
    const TensorSpec& ts = spec.tensors[t];
    if (config.zero1 && ts.zero_param >= 0) continue;  // ResolveZero
    for (int rank = 0; rank < config.world_size(); ++rank) {
      for (Region& r : RegionsOf(ts.rule, ts.shape, config, spec.num_layers,
                                 config.CoordOf(rank))) {
        shards[t].push_back({rank, std::move(r)});
      }
    }
  }
  if (config.zero1) ResolveZero(spec, config, &shards);
  for (auto& s : shards) {
    std::stable_sort(s.begin(), s.end(), [](const Shard& a, const Shard& b) {
      return a.rank < b.rank;
    });
  }
  return Layout(config.world_size(), std::move(shards), config);
}

absl::StatusOr<Layout> ExplicitLayout(const ModelSpec& spec, int world_size,
                                      std::vector<std::vector<Shard>> shards) {
  if (shards.size() != spec.tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "explicit layout lists ", shards.size(), " tensors but model '",
        spec.name, "' has ", spec.tensors.size()));
  }
  for (size_t t = 0; t < shards.size(); ++t) {
    for (const Shard& s : shards[t]) {
      if (s.rank < 0 || s.rank >= world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("explicit layout: tensor '", spec.tensors[t].key,
                         "' is assigned to rank ", s.rank, " but the job has ",
                         world_size, " ranks"));
      }
      PTC_RETURN_IF_ERROR(
          Annotate(ValidateRegion(s.region, spec.tensors[t].shape),
                   absl::StrCat("explicit layout: tensor '",
                                spec.tensors[t].key, "' on rank ", s.rank)));
    }
    std::stable_sort(
        shards[t].begin(), shards[t].end(),
        [](const Shard& a, const Shard& b) { return a.rank < b.rank; });
  }
  return Layout(world_size, std::move(shards), std::nullopt);
}

Cluster Cluster::Uniform(int n, int gpus, double bandwidth) {
  Cluster c;
  for (int i = 0; i < n; ++i) {
    c.hosts.push_back({absl::StrCat("host", i), gpus, bandwidth});
  }
  return c;
}

int Cluster::FindHost(absl::string_view name) const {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<Placement> ContiguousPlacement(const Cluster& cluster,
                                              const std::vector<int>& hosts,
                                              int world_size) {
  Placement p;
  int64_t gpus = 0;
  for (int h : hosts) {
    if (h < 0 || h >= static_cast<int>(cluster.hosts.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement names host id ", h, " but the cluster has ",
                       cluster.hosts.size(), " hosts"));
    }
    gpus += cluster.hosts[h].gpus;
  }
  if (world_size > gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job needs ", world_size, " GPUs (one per rank) but the ",
        hosts.size(), " hosts given have ", gpus,
        "; add hosts or choose a smaller tp*pp*dp"));
  }
  for (int h : hosts) {
    for (int g = 0; g < cluster.hosts[h].gpus && p.world_size() < world_size;
         ++g) {
      p.host.push_back(h);
      p.device.push_back(g);
    }
  }
  return p;
}

absl::Status ValidatePlacement(const Cluster& cluster,
                               const Placement& placement) {
  if (placement.host.size() != placement.device.size()) {
    return absl::InvalidArgumentError(
        "placement: host and device lists differ in length");
  }
  std::set<std::pair<int, int>> used;
  for (int r = 0; r < placement.world_size(); ++r) {
    const int h = placement.host[r], g = placement.device[r];
    if (h < 0 || h >= static_cast<int>(cluster.hosts.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: rank ", r, " is on unknown host id ", h));
    }
    if (g < 0 || g >= cluster.hosts[h].gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: rank ", r, " is on GPU ", g, " of ",
                       cluster.hosts[h].name, " which has ",
                       cluster.hosts[h].gpus, " GPUs"));
    }
    if (!used.insert({h, g}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: rank ", r, " shares GPU ", g, " of ",
                       cluster.hosts[h].name, " with another rank"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ptc
