#include "ptc/layout.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

Layout::Layout(int world_size, std::vector<std::vector<Shard>> shards,
               std::optional<ParallelConfig> config)
    : world_size_(world_size),
      shards_(std::move(shards)),
      regions_(shards_.size()),
      region_ids_(shards_.size()),
      config_(std::move(config)) {
  RegionIds ids;
  for (size_t t = 0; t < shards_.size(); ++t) {
    region_ids_[t].reserve(shards_[t].size());
    for (const Shard& s : shards_[t]) region_ids_[t].push_back(ids.Id(s.region));
    regions_[t] = ids.Release();
  }
}

namespace {

int64_t RoundUp(int64_t n, int64_t m) { return m <= 1 ? n : (n + m - 1) / m * m; }

int64_t Lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// One instance of a flat buffer: where each entry starts, its local
// regions, and the buckets.
struct BufferInstance {
  std::vector<int64_t> offset;                  // by entry; -1: not held
  std::vector<int64_t> room;                    // by entry: elements taken
  std::vector<std::vector<Region>> regions;     // by entry
  // by entry, by region: where the region starts, from the entry's offset
  std::vector<std::vector<int64_t>> starts;
  std::vector<std::pair<int64_t, int64_t>> buckets;
};

bool HeldByTwoStages(const StageRule& stage, const ParallelConfig& config,
                     int num_layers) {
  int held = 0;
  for (int s = 0; s < config.pp() && held < 2; ++s) {
    held += stage.HeldBy(s, config, num_layers);
  }
  return held > 1;
}

// The pipeline stage of the ranks at `coord` (0 without a pipeline axis).
int StageOf(const ParallelConfig& config, const MeshCoord& coord) {
  const int pp = config.AxisIndex(kPipelineAxis);
  return pp < 0 ? 0 : coord.index[pp];
}

// Whether buffer `buf` joins another under `config`.
bool Joined(const FlatBuffer& buf, const ParallelConfig& config) {
  if (buf.join < 0) return false;
  for (const std::string& a : buf.join_when_size_one) {
    if (config.size(a) != 1) return false;
  }
  return true;
}

// The entries buffer `b` lays out under `config`: its own with those of
// the buffers joining it inserted; none when it joins another.
std::vector<FlatBuffer::Entry> EntriesUnder(const ModelSpec& spec, int b,
                                            const ParallelConfig& config) {
  const FlatBuffer& buf = spec.buffers[b];
  if (Joined(buf, config)) return {};
  std::map<int, std::vector<FlatBuffer::Entry>> before;  // by join_before
  for (const FlatBuffer& o : spec.buffers) {
    if (o.join != b || !Joined(o, config)) continue;
    for (const FlatBuffer::Entry& e : o.entries) before[e.join_before].push_back(e);
  }
  if (before.empty()) return buf.entries;
  std::vector<FlatBuffer::Entry> out;
  for (const FlatBuffer::Entry& e : buf.entries) {
    auto it = before.find(e.tensor);
    if (it != before.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    out.push_back(e);
  }
  auto last = before.find(-1);
  if (last != before.end()) out.insert(out.end(), last->second.begin(), last->second.end());
  return out;
}

// Lays out buffer `buf`, with `entries` (EntriesUnder), as the ranks at
// `rep` (any coordinate of the group) see it.
BufferInstance LayOutBuffer(const ModelSpec& spec, const FlatBuffer& buf,
                            const std::vector<FlatBuffer::Entry>& entries,
                            const ParallelConfig& config, int64_t shards,
                            const MeshCoord& rep) {
  BufferInstance in;
  const int64_t pad = buf.bucket_pad > 0 ? Lcm(shards, buf.bucket_pad) : 1;
  const int stage = StageOf(config, rep);
  const int64_t bucket_size =
      buf.bucket_first_stage_only && stage > 0 ? 0 : buf.bucket_size;
  // The order entries take on this stage: on stages after the first,
  // first_on_later_stages entries lead.
  std::vector<size_t> order;
  order.reserve(entries.size());
  if (stage > 0) {
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].first_on_later_stages) order.push_back(i);
  }
  for (size_t i = 0; i < entries.size(); ++i)
    if (stage == 0 || !entries[i].first_on_later_stages) order.push_back(i);
  in.offset.assign(entries.size(), -1);
  in.room.assign(entries.size(), 0);
  in.regions.resize(entries.size());
  in.starts.resize(entries.size());
  int64_t pos = 0, bucket_start = 0;
  auto close_bucket = [&] {
    const int64_t end = RoundUp(pos, pad);
    in.buckets.push_back({bucket_start, end});
    pos = bucket_start = end;
  };
  for (size_t i : order) {
    const FlatBuffer::Entry& e = entries[i];
    const TensorSpec& t = spec.tensors[e.tensor];
    std::vector<Region> regions = RegionsOf(t.placements, t.stage, t.shape,
                                            config, spec.num_layers, rep);
    std::vector<int64_t> starts;
    int64_t size = 0;
    if (e.with_padding) {
      // The padded shard's regions (Validate: one padded shard on dim 0,
      // nothing else cutting dim 0); each real region is the start of the
      // padded one that contains it.
      std::vector<AxisPlacement> unpadded = t.placements;
      Shape padded_shape = t.shape;
      for (AxisPlacement& p : unpadded) {
        if (p.kind != AxisPlacement::Kind::kShard || p.pad_multiple <= 0) continue;
        padded_shape[p.dim] = RoundUp(
            padded_shape[p.dim], p.pad_multiple * AxisPlacementParts(p, config));
        p.pad_multiple = 0;
      }
      const std::vector<Region> padded =
          RegionsOf(unpadded, t.stage, padded_shape, config, spec.num_layers, rep);
      for (const Region& r : regions) {
        int64_t at = 0;
        for (const Region& p : padded) {
          if (p.Contains(r)) break;
          at += p.volume();
        }
        starts.push_back(at);
      }
      for (const Region& p : padded) size += p.volume();
    } else {
      for (const Region& r : regions) {
        starts.push_back(size);
        size += r.volume();
      }
    }
    if (size == 0) continue;
    const bool own =
        e.own_bucket == FlatBuffer::OwnBucket::kAlways ||
        (e.own_bucket == FlatBuffer::OwnBucket::kWhenShared &&
         HeldByTwoStages(t.stage, config, spec.num_layers));
    if (own && pos > bucket_start) close_bucket();
    pos = RoundUp(pos, buf.align);
    in.offset[i] = pos;
    in.room[i] = size;
    in.regions[i] = std::move(regions);
    in.starts[i] = std::move(starts);
    pos += size;
    if (own || (bucket_size > 0 && pos - bucket_start >= bucket_size)) {
      close_bucket();
    }
  }
  if (pos > bucket_start) close_bucket();
  return in;
}

// Chunk `i` of `n` of every bucket of `in`, in buffer coordinates.
std::vector<std::pair<int64_t, int64_t>> ChunksOf(const BufferInstance& in,
                                                  int64_t n, int64_t i) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& [bs, be] : in.buckets) {
    auto [lo, hi] = ChunkOf(be - bs, n, i);
    out.push_back({bs + lo, bs + hi});
  }
  return out;
}

// The coordinate that stands for the group of `coord` in buffer `buf`:
// index 0 on the buffer's axes.
MeshCoord GroupRepresentative(const FlatBuffer& buf,
                              const ParallelConfig& config, MeshCoord coord) {
  for (const std::string& a : buf.axes) coord.index[config.AxisIndex(a)] = 0;
  return coord;
}

// The tensors laid out in buffer `b` under `config`: its members and
// those of the buffers that join it.
std::vector<int> BufferMembers(const ModelSpec& spec, int b,
                               const ParallelConfig& config) {
  std::vector<int> members;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const int mb = spec.tensors[t].buffer;
    if (mb == b || (mb >= 0 && spec.buffers[mb].join == b &&
                    Joined(spec.buffers[mb], config))) {
      members.push_back(static_cast<int>(t));
    }
  }
  return members;
}

// One rank's part of a buffer instance `in` (its chunk `i` of `n` of every
// bucket): emit(member, region) for each piece of a member's region in it,
// in buffer order. `entry_index` maps a tensor to its entry in `in`.
template <typename Emit>
void RankPieces(const ModelSpec& spec, const BufferInstance& in, int64_t n,
                int64_t i, const std::vector<int>& entry_index,
                const std::vector<int>& members, Emit emit) {
  std::vector<std::pair<int64_t, int64_t>> mine;
  for (const auto& c : ChunksOf(in, n, i)) {
    if (c.first < c.second) mine.push_back(c);
  }
  for (int m : members) {
    const int e = entry_index[spec.tensors[m].slot];
    if (in.offset[e] < 0) continue;
    for (size_t k = 0; k < in.regions[e].size(); ++k) {
      const Region& r = in.regions[e][k];
      const int64_t at = in.offset[e] + in.starts[e][k];
      const int64_t end = at + r.volume();
      auto first = std::lower_bound(
          mine.begin(), mine.end(), at,
          [](const std::pair<int64_t, int64_t>& c, int64_t v) {
            return c.second <= v;
          });
      for (auto c = first; c != mine.end() && c->first < end; ++c) {
        const int64_t lo = std::max(at, c->first), hi = std::min(end, c->second);
        if (lo >= hi) continue;
        for (Region& piece : FlatRangeOfRegion(r, lo - at, hi - at))
          emit(m, std::move(piece));
      }
    }
  }
}

// Assigns the members of buffer `b` their flat ranges on `ranks`,
// appended to (*shards)[member].
void ResolveBuffer(const ModelSpec& spec, int b, const ParallelConfig& config,
                   const std::vector<int>& ranks,
                   std::vector<std::vector<Shard>>* shards) {
  const FlatBuffer& buf = spec.buffers[b];
  if (Joined(buf, config)) return;  // its members are the joined buffer's
  const std::vector<FlatBuffer::Entry> entries = EntriesUnder(spec, b, config);
  AxisPlacement over = AxisPlacement::Replicate(buf.axes);
  const int64_t n = AxisPlacementParts(over, config);
  std::vector<int> entry_index(spec.tensors.size(), -1);
  for (size_t i = 0; i < entries.size(); ++i)
    entry_index[entries[i].tensor] = static_cast<int>(i);
  const std::vector<int> members = BufferMembers(spec, b, config);
  // One instance per group: ranks equal on every axis but the buffer's.
  std::map<std::vector<int>, BufferInstance> instances;
  for (int rank : ranks) {
    const MeshCoord coord = config.CoordOf(rank);
    const MeshCoord rep = GroupRepresentative(buf, config, coord);
    auto it = instances.find(rep.index);
    if (it == instances.end()) {
      it = instances
               .emplace(rep.index,
                        LayOutBuffer(spec, buf, entries, config, n, rep))
               .first;
    }
    RankPieces(spec, it->second, n, AxisPlacementIndex(over, config, coord),
               entry_index, members, [&](int m, Region piece) {
                 (*shards)[m].push_back({rank, std::move(piece)});
               });
  }
}

// Every rank's index on every axis, and the ranks of each pipeline stage,
// computed once per layout instead of once per (tensor, rank).
struct RankIndex {
  explicit RankIndex(const ParallelConfig& config)
      : on(config.axes.size()), pp_axis(config.AxisIndex(kPipelineAxis)) {
    const int world = config.world_size();
    for (auto& v : on) v.resize(world);
    stage_ranks.resize(config.pp());
    for (int rank = 0; rank < world; ++rank) {
      const MeshCoord c = config.CoordOf(rank);
      for (size_t a = 0; a < on.size(); ++a) on[a][rank] = c.index[a];
      stage_ranks[pp_axis < 0 ? 0 : c.index[pp_axis]].push_back(rank);
    }
  }
  std::vector<std::vector<int>> on;           // [axis][rank]
  int pp_axis;                                // -1: no pipeline axis
  std::vector<std::vector<int>> stage_ranks;  // [stage] ranks, ascending
};

// The shards of non-buffer tensor `t` on every rank. A tensor's regions on
// a rank depend only on the rank's indices on the axes its placements
// cut, so they are computed once per distinct combination of those
// indices (e.g. tp x pp of them, not one per rank), and only the ranks of
// the stages holding the tensor are visited.
void LayOutTensor(const ModelSpec& spec, int t, const ParallelConfig& config,
                  const RankIndex& index, std::vector<Shard>* out) {
  const TensorSpec& ts = spec.tensors[t];
  const TensorSpec& rules = ts.slot >= 0 ? spec.tensors[ts.slot] : ts;
  if (NumElements(ts.shape) == 0) return;
  std::vector<int> axes;  // indices into config.axes, no repeats
  for (const AxisPlacement& p : rules.placements) {
    for (const std::string& a : p.axes) {
      const int i = config.AxisIndex(a);
      if (i >= 0 && std::find(axes.begin(), axes.end(), i) == axes.end())
        axes.push_back(i);
    }
  }
  int64_t combos = 1;
  for (int a : axes) combos *= config.sizes[a];
  // combos <= world size, which the config bounds.
  std::vector<std::optional<std::vector<Region>>> memo(combos);
  MeshCoord rep;
  rep.index.assign(config.axes.size(), 0);
  for (int stage = 0; stage < static_cast<int>(index.stage_ranks.size());
       ++stage) {
    if (!rules.stage.HeldBy(stage, config, spec.num_layers)) continue;
    if (index.pp_axis >= 0) rep.index[index.pp_axis] = stage;
    for (int rank : index.stage_ranks[stage]) {
      int64_t id = 0;
      for (int a : axes) id = id * config.sizes[a] + index.on[a][rank];
      std::optional<std::vector<Region>>& regions = memo[id];
      if (!regions) {
        for (int a : axes) rep.index[a] = index.on[a][rank];
        regions = RegionsOf(rules.placements, StageRule::All(), ts.shape,
                            config, spec.num_layers, rep);
      }
      for (const Region& r : *regions) out->push_back({rank, r});
    }
  }
}

bool BufferInUse(const FlatBuffer& buf, const ParallelConfig& config) {
  return !buf.optional || config.zero1;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<Region>>> BuildRankRegions(
    const ModelSpec& spec, const ParallelConfig& config, int rank) {
  PTC_RETURN_IF_ERROR(spec.Validate());
  PTC_RETURN_IF_ERROR(CheckConfig(spec, config));
  if (rank < 0 || rank >= config.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is outside the ", config.world_size(), " ranks of ",
        config.ToString()));
  }
  const int n = static_cast<int>(spec.tensors.size());
  std::vector<std::vector<Region>> out(n);
  const MeshCoord coord = config.CoordOf(rank);
  const int pp_axis = config.AxisIndex(kPipelineAxis);
  const int stage = pp_axis < 0 ? 0 : coord.index[pp_axis];
  for (int t = 0; t < n; ++t) {
    const TensorSpec& ts = spec.tensors[t];
    if (ts.buffer >= 0 && BufferInUse(spec.buffers[ts.buffer], config))
      continue;  // laid out in its buffer below
    // As LayOutTensor: the regions of the rank's indices on the axes the
    // placements cut, on a stage that holds the tensor.
    const TensorSpec& rules = ts.slot >= 0 ? spec.tensors[ts.slot] : ts;
    if (NumElements(ts.shape) == 0) continue;
    if (!rules.stage.HeldBy(stage, config, spec.num_layers)) continue;
    MeshCoord rep;
    rep.index.assign(config.axes.size(), 0);
    if (pp_axis >= 0) rep.index[pp_axis] = stage;
    for (const AxisPlacement& p : rules.placements) {
      for (const std::string& a : p.axes) {
        const int i = config.AxisIndex(a);
        if (i >= 0) rep.index[i] = coord.index[i];
      }
    }
    out[t] = RegionsOf(rules.placements, StageRule::All(), ts.shape, config,
                       spec.num_layers, rep);
  }
  std::vector<std::vector<Shard>> pieces(n);
  for (int b = 0; b < static_cast<int>(spec.buffers.size()); ++b) {
    if (BufferInUse(spec.buffers[b], config))
      ResolveBuffer(spec, b, config, {rank}, &pieces);
  }
  for (int t = 0; t < n; ++t) {
    for (Shard& p : pieces[t]) out[t].push_back(std::move(p.region));
  }
  return out;
}

absl::StatusOr<Layout> BuildLayout(const ModelSpec& spec,
                                   const ParallelConfig& config) {
  PTC_RETURN_IF_ERROR(spec.Validate());
  PTC_RETURN_IF_ERROR(CheckConfig(spec, config));
  const int world_size = config.world_size();
  const int n = static_cast<int>(spec.tensors.size());
  std::vector<std::vector<Shard>> shards(n);
  const RankIndex index(config);
  for (int t = 0; t < n; ++t) {
    const TensorSpec& ts = spec.tensors[t];
    if (ts.buffer >= 0 && BufferInUse(spec.buffers[ts.buffer], config)) {
      continue;  // ResolveBuffer
    }
    LayOutTensor(spec, t, config, index, &shards[t]);
  }
  std::vector<int> ranks(world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  for (int b = 0; b < static_cast<int>(spec.buffers.size()); ++b) {
    if (BufferInUse(spec.buffers[b], config))
      ResolveBuffer(spec, b, config, ranks, &shards);
  }
  for (auto& s : shards) {
    auto by_rank = [](const Shard& a, const Shard& b) { return a.rank < b.rank; };
    if (!std::is_sorted(s.begin(), s.end(), by_rank)) {
      std::stable_sort(s.begin(), s.end(), by_rank);
    }
  }
  return Layout(world_size, std::move(shards), config);
}

absl::StatusOr<BufferView> ViewBuffer(const ModelSpec& spec,
                                      const ParallelConfig& config,
                                      absl::string_view buffer, int rank) {
  PTC_RETURN_IF_ERROR(spec.Validate());
  PTC_RETURN_IF_ERROR(CheckConfig(spec, config));
  int b = 0;
  while (b < static_cast<int>(spec.buffers.size()) &&
         spec.buffers[b].name != buffer) {
    ++b;
  }
  if (b == static_cast<int>(spec.buffers.size())) {
    std::vector<std::string> names;
    for (const FlatBuffer& f : spec.buffers) names.push_back(f.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "the layout has no flat buffer '", buffer, "' (it has: ",
        names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  if (rank < 0 || rank >= config.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is outside the ", config.world_size(), " ranks of ",
        config.ToString()));
  }
  const FlatBuffer& buf = spec.buffers[b];
  const AxisPlacement over = AxisPlacement::Replicate(buf.axes);
  const MeshCoord coord = config.CoordOf(rank);
  BufferView view;
  view.in_use = BufferInUse(buf, config);
  view.shards = AxisPlacementParts(over, config);
  view.index = AxisPlacementIndex(over, config, coord);
  if (Joined(buf, config)) {
    // Laid out in the buffer it joins: no entry placed here.
    for (const FlatBuffer::Entry& e : buf.entries)
      view.entries.push_back({e.tensor, -1, 0});
    return view;
  }
  const std::vector<FlatBuffer::Entry> entries = EntriesUnder(spec, b, config);
  const BufferInstance in =
      LayOutBuffer(spec, buf, entries, config, view.shards,
                   GroupRepresentative(buf, config, coord));
  for (size_t e = 0; e < entries.size(); ++e) {
    int64_t real = 0;
    for (const Region& r : in.regions[e]) real += r.volume();
    view.entries.push_back({entries[e].tensor, in.offset[e], in.room[e], real});
  }
  view.buckets = in.buckets;
  view.chunks = ChunksOf(in, view.shards, view.index);
  return view;
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
