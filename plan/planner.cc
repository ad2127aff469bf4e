#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "plan/internal/grid.h"
#include "plan/internal/max_flow.h"

namespace ptc {
namespace {

using plan_internal::CoalesceBoxes;
using plan_internal::Grid;
using plan_internal::MaxFlow;

// Refuse tensors whose regions would refine into more cells than this
// (about 1 GiB of planner memory); real layouts stay far below.
constexpr int64_t kMaxCellsPerTensor = int64_t{1} << 25;

// A (host, region id) pair packed so that sorting orders by host first.
using HostRegion = uint64_t;
inline HostRegion Pack(int32_t host, int32_t id) {
  return (static_cast<uint64_t>(host) << 32) | static_cast<uint32_t>(id);
}
inline int32_t HostOf(HostRegion x) { return static_cast<int32_t>(x >> 32); }
inline int32_t IdOf(HostRegion x) { return static_cast<int32_t>(x & 0xffffffffu); }

// The distinct (host, region) pairs of tensor `t` in `layout`, optionally
// only those on hosts that hold the source, sorted by host; region ids are
// `ids`' (the layout's own distinct regions are looked up once each).
void HostRegions(const PlanInput& in, const Layout& layout,
                 const Placement& placement, int t, bool alive_only,
                 RegionIds* ids, std::vector<int32_t>* map,
                 std::vector<HostRegion>* out) {
  out->clear();
  map->clear();
  for (const Region& r : layout.regions(t)) map->push_back(ids->Id(r));
  const std::vector<Shard>& shards = layout.shards(t);
  const std::vector<int32_t>& region_id = layout.region_ids(t);
  for (size_t i = 0; i < shards.size(); ++i) {
    const int h = placement.host[shards[i].rank];
    if (alive_only && !in.HoldsSource(h)) continue;
    out->push_back(Pack(h, (*map)[region_id[i]]));
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

// A cell of tensor `tensor` that `target_host` needs and does not hold.
struct Demand {
  int32_t tensor;
  int32_t target_host;
  int32_t klass;  // index into Analysis::classes
  Region region;
};

// What the target hosts need, before choosing senders.
struct Analysis {
  std::vector<HostFragment> fragments;  // indexed by host id
  std::vector<Demand> demands;
  // Distinct sets of live hosts that can send a demand, and their bytes.
  std::vector<std::vector<int32_t>> classes;
  std::vector<int64_t> class_bytes;
  int64_t target_bytes = 0;
  int64_t rank_target_bytes = 0;
  int64_t kept_in_place_bytes = 0;
  int64_t copied_within_host_bytes = 0;
  int64_t cross_host_lower_bound = 0;
};

std::string HostNames(const Cluster& cluster, absl::Span<const int32_t> hosts) {
  return absl::StrJoin(hosts, ", ", [&](std::string* out, int32_t h) {
    absl::StrAppend(out, cluster.hosts[h].name);
  });
}

absl::Status NoSurvivingCopy(const PlanInput& in, int t, const Region& cell,
                             int target_host) {
  // Hosts whose copy is gone: dead (silent), or alive but without the
  // source version (a ptcd that restarted, or one not verified since).
  std::vector<int32_t> dead, lost;
  for (const Shard& s : in.source->shards(t)) {
    const int h = in.source_placement->host[s.rank];
    if (!s.region.Intersects(cell) || in.HoldsSource(h)) continue;
    (in.IsAlive(h) ? lost : dead).push_back(h);
  }
  for (auto* v : {&dead, &lost}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const std::string& key = in.spec->tensors[t].key;
  const std::string& host = in.cluster->hosts[target_host].name;
  if (dead.empty() && lost.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region ", cell.ToString(), " of tensor '", key, "' (needed on ", host,
        ") is held by no rank of the source layout; the source state does "
        "not cover the target"));
  }
  std::vector<std::string> why;
  if (!dead.empty()) {
    why.push_back(absl::StrCat("dead host(s) ", HostNames(*in.cluster, dead)));
  }
  if (!lost.empty()) {
    why.push_back(absl::StrCat("host(s) ", HostNames(*in.cluster, lost),
                               ", which lost the source version (restarted, "
                               "or not verified since they came back)"));
  }
  return WithPlanFailure(
      absl::FailedPreconditionError(absl::StrCat(
          "region ", cell.ToString(), " of tensor '", key, "' (needed on ",
          host, ") has no surviving copy: it was held only by ",
          absl::StrJoin(why, " and "),
          "; restore it from a snapshot or bring a holder back")),
      PlanFailure::kNoSurvivingCopy);
}

// Per-tensor scratch, reused so that planning does not allocate per cell.
struct Scratch {
  Grid grid;
  RegionIds ids;
  std::vector<HostRegion> src, dst;
  std::vector<int32_t> id_map;
  std::vector<std::vector<int64_t>> cells_of;  // per region id
  std::vector<absl::InlinedVector<int32_t, 4>> holders, needers, in_place;
  std::vector<std::vector<Region>> local;  // per target host
  std::vector<std::vector<Region>> disk;   // per target host: from snapshot
  // Per host: the stamp of the last cell it holds / keeps in place.
  std::vector<int64_t> holds_cell, keeps_cell;
  int64_t stamp = 0;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> class_of;
};

absl::Status AnalyzeTensor(const PlanInput& in, int t, Scratch* s,
                           Analysis* a) {
  const TensorSpec& ts = in.spec->tensors[t];
  const int64_t elem = ElementSize(ts.dtype);
  RegionIds& ids = s->ids;
  ids.Clear();
  std::vector<HostRegion>& src = s->src;
  std::vector<HostRegion>& dst = s->dst;
  HostRegions(in, *in.source, *in.source_placement, t, true, &ids, &s->id_map,
              &src);
  HostRegions(in, *in.target, *in.target_placement, t, false, &ids,
              &s->id_map, &dst);
  if (dst.empty()) return absl::OkStatus();
  for (const Shard& sh : in.target->shards(t)) {
    a->rank_target_bytes += sh.region.volume() * elem;
  }

  Grid& grid = s->grid;
  grid.Reset(static_cast<int>(ts.shape.size()));
  for (int32_t id = 0; id < ids.size(); ++id) grid.AddCuts(ids[id]);
  grid.Finalize();
  const int64_t cells = grid.num_cells();
  if (cells > kMaxCellsPerTensor) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tensor '", ts.key, "': the source and target regions refine into ",
        cells, " cells, more than the planner's limit of ",
        kMaxCellsPerTensor));
  }
  if (static_cast<int64_t>(s->holders.size()) < cells) {
    s->holders.resize(cells);
    s->needers.resize(cells);
    s->in_place.resize(cells);
  }
  for (int64_t c = 0; c < cells; ++c) {
    s->holders[c].clear();
    s->needers[c].clear();
    s->in_place[c].clear();
  }
  if (static_cast<int32_t>(s->cells_of.size()) < ids.size())
    s->cells_of.resize(ids.size());
  for (int32_t id = 0; id < ids.size(); ++id) {
    s->cells_of[id].clear();
    grid.ForEachCell(ids[id], [&](int64_t c) { s->cells_of[id].push_back(c); });
  }
  // Pairs come sorted by host, so every cell's lists are sorted too and
  // hold a host at most once after dropping adjacent repeats.
  auto add = [](absl::InlinedVector<int32_t, 4>& v, int32_t h) {
    if (v.empty() || v.back() != h) v.push_back(h);
  };
  for (HostRegion r : src) {
    for (int64_t c : s->cells_of[IdOf(r)]) add(s->holders[c], HostOf(r));
  }
  for (HostRegion r : dst) {
    const int32_t h = HostOf(r);
    const Region& region = ids[IdOf(r)];
    HostFragment& f = a->fragments[h];
    // The host may store exactly this region already: it stays as it is.
    const bool kept = std::binary_search(src.begin(), src.end(), r);
    f.holds.push_back({t, region, kept});
    if (kept) {
      for (int64_t c : s->cells_of[IdOf(r)]) add(s->in_place[c], h);
    }
    for (int64_t c : s->cells_of[IdOf(r)]) add(s->needers[c], h);
  }

  std::vector<int32_t> local_hosts, disk_hosts;
  for (int64_t c = 0; c < cells; ++c) {
    const auto& need = s->needers[c];
    if (need.empty()) continue;
    const auto& hold = s->holders[c];
    const int64_t stamp = ++s->stamp;
    for (int32_t h : hold) s->holds_cell[h] = stamp;
    for (int32_t h : s->in_place[c]) s->keeps_cell[h] = stamp;
    const Region cell = grid.CellRegion(c);
    const int64_t bytes = cell.volume() * elem;
    int32_t klass = -1;
    for (int32_t h : need) {
      // Bytes count once per host and element: distinct regions of one host
      // may overlap (ZeRO-1 state of tp-replicated parameters).
      a->target_bytes += bytes;
      if (s->keeps_cell[h] == stamp) {
        a->kept_in_place_bytes += bytes;
        continue;
      }
      if (s->holds_cell[h] == stamp) {
        if (s->local[h].empty()) local_hosts.push_back(h);
        s->local[h].push_back(cell);
        a->copied_within_host_bytes += bytes;
        continue;
      }
      if (hold.empty()) {
        if (!in.snapshot_source) return NoSurvivingCopy(in, t, cell, h);
        if (s->disk[h].empty()) disk_hosts.push_back(h);
        s->disk[h].push_back(cell);
        continue;
      }
      if (klass < 0) {
        // The senders: the holders, less late ones where another remains.
        std::vector<int32_t> key;
        for (int32_t holder : hold) {
          if (!in.IsLate(holder)) key.push_back(holder);
        }
        if (key.empty()) key.assign(hold.begin(), hold.end());
        auto [it, inserted] = s->class_of.emplace(
            std::move(key), static_cast<int32_t>(a->classes.size()));
        if (inserted) {
          a->classes.push_back(it->first);
          a->class_bytes.push_back(0);
        }
        klass = it->second;
      }
      a->class_bytes[klass] += bytes;
      a->demands.push_back({t, h, klass, cell});
      a->cross_host_lower_bound += bytes;
    }
  }
  for (int32_t h : local_hosts) {
    CoalesceBoxes(&s->local[h]);
    for (const Region& r : s->local[h]) {
      a->fragments[h].transfers.push_back({t, r, h, h, -1});
    }
    s->local[h].clear();
  }
  for (int32_t h : disk_hosts) {
    CoalesceBoxes(&s->disk[h]);
    for (const Region& r : s->disk[h]) {
      a->fragments[h].transfers.push_back({t, r, kFromSnapshot, h, -1});
    }
    s->disk[h].clear();
  }
  return absl::OkStatus();
}

// Analyzes tensors [begin, end) into `a`, whose fragments are sized for
// `shards_on` (per host, the target shards the fragment will take).
absl::Status AnalyzeRange(const PlanInput& in, int begin, int end,
                          const std::vector<int64_t>& shards_on, Scratch* scratch,
                          Analysis* a) {
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  a->fragments.resize(num_hosts);
  for (int h = 0; h < num_hosts; ++h) {
    a->fragments[h].host = h;
    a->fragments[h].holds.reserve(shards_on[h]);
  }
  scratch->local.resize(num_hosts);
  scratch->disk.resize(num_hosts);
  scratch->holds_cell.assign(num_hosts, 0);
  scratch->keeps_cell.assign(num_hosts, 0);
  for (int t = begin; t < end; ++t) {
    PTC_RETURN_IF_ERROR(AnalyzeTensor(in, t, scratch, a));
  }
  return absl::OkStatus();
}

// Appends `b` (later tensors) to `a`, renumbering b's sender classes.
void Merge(Analysis&& b, Scratch* a_scratch, Analysis* a) {
  std::vector<int32_t> renumber(b.classes.size());
  for (size_t c = 0; c < b.classes.size(); ++c) {
    auto [it, inserted] = a_scratch->class_of.emplace(
        b.classes[c], static_cast<int32_t>(a->classes.size()));
    if (inserted) {
      a->classes.push_back(b.classes[c]);
      a->class_bytes.push_back(0);
    }
    renumber[c] = it->second;
    a->class_bytes[it->second] += b.class_bytes[c];
  }
  a->demands.reserve(a->demands.size() + b.demands.size());
  for (Demand& d : b.demands) {
    d.klass = renumber[d.klass];
    a->demands.push_back(std::move(d));
  }
  for (size_t h = 0; h < a->fragments.size(); ++h) {
    HostFragment& to = a->fragments[h];
    HostFragment& from = b.fragments[h];
    to.holds.insert(to.holds.end(), std::make_move_iterator(from.holds.begin()),
                    std::make_move_iterator(from.holds.end()));
    to.transfers.insert(to.transfers.end(),
                        std::make_move_iterator(from.transfers.begin()),
                        std::make_move_iterator(from.transfers.end()));
  }
  a->target_bytes += b.target_bytes;
  a->rank_target_bytes += b.rank_target_bytes;
  a->kept_in_place_bytes += b.kept_in_place_bytes;
  a->copied_within_host_bytes += b.copied_within_host_bytes;
  a->cross_host_lower_bound += b.cross_host_lower_bound;
}

absl::StatusOr<Analysis> Analyze(const PlanInput& in) {
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  const int num_tensors = static_cast<int>(in.spec->tensors.size());
  // Shards per tensor (both sides) and per host (target): the work to
  // split in two, and every host's lists sized up front (growing ~2,000
  // lists of ~2,000 entries by doubling costs more than the planning).
  std::vector<int64_t> work(num_tensors + 1, 0);
  std::vector<int64_t> first_half(num_hosts, 0), all(num_hosts, 0);
  for (int t = 0; t < num_tensors; ++t) {
    work[t + 1] = work[t] + static_cast<int64_t>(in.source->shards(t).size() +
                                                 in.target->shards(t).size());
  }
  int mid = num_tensors;
  // Two threads (tensors are independent) once there is enough to share.
  constexpr int64_t kParallelShards = 1 << 18;
  if (work[num_tensors] >= kParallelShards) {
    mid = static_cast<int>(
        std::lower_bound(work.begin(), work.end(), work[num_tensors] / 2) -
        work.begin());
    mid = std::clamp(mid, 1, num_tensors);
  }
  for (int t = 0; t < num_tensors; ++t) {
    for (const Shard& s : in.target->shards(t)) {
      const int h = in.target_placement->host[s.rank];
      ++all[h];
      if (t < mid) ++first_half[h];
    }
  }
  std::vector<int64_t> second_half(num_hosts);
  for (int h = 0; h < num_hosts; ++h) second_half[h] = all[h] - first_half[h];

  Analysis a, b;
  Scratch scratch_a, scratch_b;
  absl::Status status_b;
  std::thread second;
  if (mid < num_tensors) {
    second = std::thread([&] {
      status_b = AnalyzeRange(in, mid, num_tensors, second_half, &scratch_b, &b);
    });
  }
  const absl::Status status_a = AnalyzeRange(in, 0, mid, all, &scratch_a, &a);
  if (second.joinable()) second.join();
  // The first failing tensor's error, as a sequential pass would report.
  PTC_RETURN_IF_ERROR(status_a);
  PTC_RETURN_IF_ERROR(status_b);
  if (mid < num_tensors) Merge(std::move(b), &scratch_a, &a);
  return a;
}

// The senders' quotas per class, from a max-flow at the smallest feasible
// makespan.
struct Balance {
  std::vector<std::vector<int64_t>> quota;  // [class][i] for classes[class][i]
  int64_t budget = 0;                       // bytes the fastest host may send
};

// Finds the smallest budget B such that every class's bytes can be sent
// with host h sending at most floor(B * weight[h]) bytes.
Balance Solve(const Analysis& a, const std::vector<double>& weight,
              bool want_quotas) {
  Balance out;
  const int k = static_cast<int>(a.classes.size());
  int64_t total = 0;
  for (int64_t b : a.class_bytes) total += b;
  if (total == 0) {
    out.quota.resize(k);
    return out;
  }
  const int num_hosts = static_cast<int>(weight.size());
  const int source = 0, sink = 1 + k + num_hosts;
  MaxFlow flow(sink + 1);
  std::vector<std::vector<int>> class_edges(k);
  for (int c = 0; c < k; ++c) {
    flow.AddEdge(source, 1 + c, a.class_bytes[c]);
    for (int32_t h : a.classes[c]) {
      class_edges[c].push_back(flow.AddEdge(1 + c, 1 + k + h, total));
    }
  }
  std::vector<int> host_edge(num_hosts);
  double min_weight = 1;
  for (int h = 0; h < num_hosts; ++h) {
    host_edge[h] = flow.AddEdge(1 + k + h, sink, 0);
    if (weight[h] > 0) min_weight = std::min(min_weight, weight[h]);
  }
  auto feasible = [&](int64_t budget) {
    flow.Reset();
    for (int h = 0; h < num_hosts; ++h) {
      flow.SetCapacity(host_edge[h],
                       static_cast<int64_t>(std::floor(budget * weight[h])));
    }
    return flow.Solve(source, sink) == total;
  };
  int64_t lo = 0;
  int64_t hi = static_cast<int64_t>(std::ceil(total / min_weight)) + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (feasible(mid) ? hi : lo) = mid;
  }
  out.budget = hi;
  if (want_quotas) {
    feasible(hi);
    out.quota.resize(k);
    for (int c = 0; c < k; ++c) {
      for (int e : class_edges[c]) out.quota[c].push_back(flow.Flow(e));
    }
  }
  return out;
}

// Splits every demand among its class's senders according to the quotas,
// striping a demand over several senders where a quota runs out. Appends
// the transfers, coalesced per (tensor, sender), to the target fragments.
void Assign(const PlanInput& in, Analysis* a, Balance* b) {
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  std::vector<size_t> cursor(a->classes.size(), 0);
  std::vector<std::vector<Transfer>> remote(num_hosts);
  for (const Demand& d : a->demands) {
    const int64_t elem = ElementSize(in.spec->tensors[d.tensor].dtype);
    const std::vector<int32_t>& senders = a->classes[d.klass];
    std::vector<int64_t>& quota = b->quota[d.klass];
    size_t& i = cursor[d.klass];
    const Shape shape = d.region.shape();
    int64_t done = 0, n = d.region.volume();
    while (done < n) {
      while (i < senders.size() && quota[i] < elem) ++i;
      int64_t take;
      size_t who;
      if (i < senders.size()) {
        who = i;
        take = std::min(n - done, quota[i] / elem);
      } else {
        // Rounding left less than an element on each sender: the one with
        // the most left takes the rest.
        who = std::max_element(quota.begin(), quota.end()) - quota.begin();
        take = n - done;
      }
      quota[who] -= take * elem;
      for (Region piece : FlatRangeToRegions(shape, done, done + take)) {
        for (int k = 0; k < piece.rank(); ++k) {
          piece.mutable_dim(k).begin += d.region.dim(k).begin;
          piece.mutable_dim(k).end += d.region.dim(k).begin;
        }
        remote[d.target_host].push_back(
            {d.tensor, piece, senders[who], d.target_host, -1});
      }
      done += take;
    }
  }
  for (int h = 0; h < num_hosts; ++h) {
    std::vector<Transfer>& list = remote[h];
    std::stable_sort(
        list.begin(), list.end(), [](const Transfer& x, const Transfer& y) {
          return x.tensor != y.tensor ? x.tensor < y.tensor
                                      : x.source_host < y.source_host;
        });
    for (size_t begin = 0; begin < list.size();) {
      size_t end = begin;
      std::vector<Region> boxes;
      while (end < list.size() && list[end].tensor == list[begin].tensor &&
             list[end].source_host == list[begin].source_host) {
        boxes.push_back(list[end++].region);
      }
      CoalesceBoxes(&boxes);
      for (const Region& r : boxes) {
        a->fragments[h].transfers.push_back(
            {list[begin].tensor, r, list[begin].source_host, h, -1});
      }
      begin = end;
    }
  }
}

std::vector<double> Weights(const PlanInput& in, bool uniform) {
  double fastest = 0;
  for (const Host& h : in.cluster->hosts)
    fastest = std::max(fastest, h.bandwidth);
  std::vector<double> w;
  for (const Host& h : in.cluster->hosts) {
    w.push_back(uniform || fastest <= 0 ? 1.0 : h.bandwidth / fastest);
  }
  return w;
}

bool UniformBandwidth(const Cluster& cluster) {
  for (const Host& h : cluster.hosts) {
    if (h.bandwidth != cluster.hosts.front().bandwidth) return false;
  }
  return true;
}

// Fills the byte and time totals that follow from the transfers.
void Summarize(const PlanInput& in, Plan* plan) {
  PlanSummary& s = plan->summary;
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  s.host_send_bytes.assign(num_hosts, 0);
  s.host_receive_bytes.assign(num_hosts, 0);
  s.cross_host_bytes = 0;
  s.transfers = 0;
  for (const HostFragment& f : plan->fragments) {
    for (const HeldRegion& h : f.holds) s.transfers += h.kept_in_place;
    for (const Transfer& x : f.transfers) {
      ++s.transfers;
      if (x.source_host == x.target_host) continue;
      const int64_t bytes =
          x.region.volume() * ElementSize(in.spec->tensors[x.tensor].dtype);
      if (x.source_host == kFromSnapshot) {
        s.snapshot_bytes += bytes;
        continue;
      }
      s.cross_host_bytes += bytes;
      s.host_send_bytes[x.source_host] += bytes;
      s.host_receive_bytes[x.target_host] += bytes;
    }
  }
  s.max_host_send_bytes = 0;
  s.max_host_send_seconds = 0;
  for (int h = 0; h < num_hosts; ++h) {
    if (s.host_send_bytes[h] > s.max_host_send_bytes) {
      s.max_host_send_bytes = s.host_send_bytes[h];
      s.max_host_send_host = h;
    }
    const double bw = in.cluster->hosts[h].bandwidth;
    if (bw > 0) {
      s.max_host_send_seconds =
          std::max(s.max_host_send_seconds, s.host_send_bytes[h] / bw);
    }
  }
  s.small_object_moves = static_cast<int64_t>(plan->small_objects.size());
}

absl::Status PlanSmallObjects(const PlanInput& in, Plan* plan) {
  if (!in.source->config() || !in.target->config()) return absl::OkStatus();
  const ParallelConfig& from = *in.source->config();
  const ParallelConfig& to = *in.target->config();
  // Target ranks with the same coordinates on an object's scope axes take
  // the same copy: resolve each once (a global object on 16,384 ranks
  // would otherwise scan every source rank 16,384 times).
  struct Resolved {
    int32_t source_rank = -1;  // -1: derived from `derive_from`
    std::string derive_from;
    bool from_snapshot = false;  // source_rank's copy in the snapshot
    std::vector<SmallObjectMove::Copy> alternates;
    std::string derive_fallback;
    int32_t kept_rank = -1;  // the candidate whose copy the coordinator keeps
  };
  std::vector<absl::flat_hash_map<std::string, Resolved>> resolved(
      in.spec->small_objects.size());
  plan->small_objects.reserve(static_cast<size_t>(to.world_size()) *
                              in.spec->small_objects.size());
  for (int r = 0; r < to.world_size(); ++r) {
    const MeshCoord coord = to.CoordOf(r);
    const int32_t target_host = in.target_placement->host[r];
    for (size_t o = 0; o < in.spec->small_objects.size(); ++o) {
      const SmallObjectSpec& obj = in.spec->small_objects[o];
      const std::string scope = ScopeCoordinates(obj, to, coord);
      auto it = resolved[o].find(scope);
      if (it == resolved[o].end()) {
        SmallObjectSource source =
            SmallObjectSources(obj, from, to, in.spec->num_layers, coord);
        Resolved res;
        // The candidate whose copy the coordinator keeps: it keeps only
        // objects a new rank copies whose every copy is on one host, so
        // it is looked for only where no other host holds one.
        auto kept_rank = [&]() {
          if (!in.kept || obj.new_ranks != NewRankRule::kCopy) return -1;
          for (int c : source.candidates)
            if (in.kept(obj.name, c)) return c;
          return -1;
        };
        if (!source.derive_from.empty()) {
          res.derive_from = std::move(source.derive_from);
        } else {
          // A holder that is alive, preferably one whose heartbeats are on
          // time.
          auto holds = [&](int c) {
            return in.HoldsSource(in.source_placement->host[c]);
          };
          auto alive = std::find_if(
              source.candidates.begin(), source.candidates.end(), [&](int c) {
                return holds(c) && !in.IsLate(in.source_placement->host[c]);
              });
          if (alive == source.candidates.end()) {
            alive = std::find_if(source.candidates.begin(),
                                 source.candidates.end(), holds);
          }
          if (alive != source.candidates.end()) {
            res.source_rank = *alive;
            // Copies on other hosts, one per host, in case the source
            // host fails during the change.
            std::vector<int32_t> hosts = {in.source_placement->host[*alive]};
            for (int c : source.candidates) {
              if (res.alternates.size() >= kMaxSmallObjectAlternates) break;
              const int32_t h = in.source_placement->host[c];
              if (!holds(c) || std::find(hosts.begin(), hosts.end(), h) != hosts.end())
                continue;
              hosts.push_back(h);
              res.alternates.push_back({c, h});
            }
            if (obj.new_ranks == NewRankRule::kDerive) res.derive_fallback = scope;
            if (res.alternates.empty()) res.kept_rank = kept_rank();
          } else if ((res.kept_rank = kept_rank()) >= 0) {
            // Every copy died with its host; the coordinator kept one.
            res.source_rank = res.kept_rank;
          } else if (in.snapshot_source && !source.candidates.empty()) {
            res.source_rank = source.candidates.front();
            res.from_snapshot = true;
          } else if (obj.new_ranks == NewRankRule::kDerive) {
            // Its copy died with its host: a fresh value (an RNG seed) is
            // as good as the lost one.
            res.derive_from = scope;
          } else {
            return WithPlanFailure(
                absl::FailedPreconditionError(absl::StrCat(
                    "small object '", obj.name, "' (",
                    ScopeString(obj.scope), ") for target rank ", r,
                    " has no surviving source: every rank that may provide "
                    "it is on a dead or restarted host")),
                PlanFailure::kNoSurvivingCopy);
          }
        }
        it = resolved[o].emplace(scope, std::move(res)).first;
      }
      const Resolved& res = it->second;
      if (res.source_rank < 0) {
        plan->small_objects.push_back(
            {obj.name, r, -1, -1, target_host, res.derive_from});
      } else {
        const bool dead =
            res.source_rank == res.kept_rank &&
            !in.HoldsSource(in.source_placement->host[res.source_rank]);
        plan->small_objects.push_back(
            {obj.name, r, res.source_rank,
             res.from_snapshot ? kFromSnapshot
             : dead            ? kFromCoordinator
                               : in.source_placement->host[res.source_rank],
             target_host, "", res.alternates, res.derive_fallback,
             res.kept_rank});
      }
    }
  }
  return absl::OkStatus();
}

// Lower bounds shared by both strategies.
void SetBounds(const PlanInput& in, const Analysis& a, const Balance& weighted,
               Plan* plan) {
  PlanSummary& s = plan->summary;
  s.cross_host_bytes_lower_bound = a.cross_host_lower_bound;
  double fastest = 0;
  for (const Host& h : in.cluster->hosts)
    fastest = std::max(fastest, h.bandwidth);
  s.max_host_send_seconds_lower_bound =
      fastest > 0 ? weighted.budget / fastest : 0;
  s.max_host_send_bytes_lower_bound =
      UniformBandwidth(*in.cluster)
          ? weighted.budget
          : Solve(a, Weights(in, /*uniform=*/true), false).budget;
}

}  // namespace

absl::Status CheckPlanInput(const PlanInput& in) {
  if (!in.spec || !in.cluster || !in.source || !in.source_placement ||
      !in.target || !in.target_placement) {
    return absl::InvalidArgumentError("plan input is missing a part");
  }
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  const int num_tensors = static_cast<int>(in.spec->tensors.size());
  if (in.source->num_tensors() != num_tensors ||
      in.target->num_tensors() != num_tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layouts have ", in.source->num_tensors(), " and ",
                     in.target->num_tensors(), " tensors but model '",
                     in.spec->name, "' has ", num_tensors));
  }
  if (!in.alive.empty() && static_cast<int>(in.alive.size()) != num_hosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("liveness is given for ", in.alive.size(),
                     " hosts but the cluster has ", num_hosts));
  }
  struct Side {
    const char* name;
    const Layout* layout;
    const Placement* placement;
  };
  for (Side side : {Side{"source", in.source, in.source_placement},
                    Side{"target", in.target, in.target_placement}}) {
    if (side.placement->world_size() != side.layout->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", side.name, " layout has ", side.layout->world_size(),
          " ranks but its placement places ", side.placement->world_size()));
    }
    PTC_RETURN_IF_ERROR(
        Annotate(ValidatePlacement(*in.cluster, *side.placement),
                 absl::StrCat(side.name, " placement")));
  }
  for (const Host& h : in.cluster->hosts) {
    if (!(h.bandwidth > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("host ", h.name, " has link bandwidth ", h.bandwidth,
                       " bytes/s; every host needs a positive bandwidth"));
    }
  }
  for (int r = 0; r < in.target_placement->world_size(); ++r) {
    const int h = in.target_placement->host[r];
    if (!in.IsAlive(h)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the target placement puts rank ", r, " on ",
                       in.cluster->hosts[h].name,
                       ", which is dead; place the target on live hosts"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> PlanReconfiguration(const PlanInput& in) {
  PTC_RETURN_IF_ERROR(CheckPlanInput(in));
  PTC_ASSIGN_OR_RETURN(Analysis a, Analyze(in));
  Balance balance = Solve(a, Weights(in, /*uniform=*/false), true);
  Assign(in, &a, &balance);
  Plan plan;
  plan.strategy = proto::PLAN_STRATEGY_PTC;
  for (HostFragment& f : a.fragments) {
    if (!f.holds.empty()) plan.fragments.push_back(std::move(f));
  }
  PTC_RETURN_IF_ERROR(PlanSmallObjects(in, &plan));
  PlanSummary& s = plan.summary;
  s.target_bytes = a.target_bytes;
  s.kept_in_place_bytes = a.kept_in_place_bytes;
  s.copied_within_host_bytes = a.copied_within_host_bytes;
  s.dedup_saved_bytes = a.rank_target_bytes - a.target_bytes;
  SetBounds(in, a, balance, &plan);
  Summarize(in, &plan);
  return plan;
}

absl::StatusOr<Plan> PlanTenplexBaseline(const PlanInput& in) {
  PTC_RETURN_IF_ERROR(CheckPlanInput(in));
  // The analysis proves every region has a live source and gives the
  // bounds both strategies are measured against.
  PTC_ASSIGN_OR_RETURN(Analysis a, Analyze(in));
  Plan plan;
  plan.strategy = proto::PLAN_STRATEGY_TENPLEX;
  plan.per_rank = true;
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  std::vector<HostFragment> fragments(num_hosts);
  for (int h = 0; h < num_hosts; ++h) fragments[h].host = h;
  for (int t = 0; t < static_cast<int>(in.spec->tensors.size()); ++t) {
    const int64_t elem = ElementSize(in.spec->tensors[t].dtype);
    std::vector<const Shard*> sources;  // live, in rank order
    for (const Shard& s : in.source->shards(t)) {
      if (in.HoldsSource(in.source_placement->host[s.rank]))
        sources.push_back(&s);
    }
    for (const Shard& dst : in.target->shards(t)) {
      const int h = in.target_placement->host[dst.rank];
      fragments[h].holds.push_back({t, dst.region});
      plan.summary.target_bytes += dst.region.volume() * elem;
      std::vector<Region> missing = {dst.region};
      for (const Shard* src : sources) {
        if (missing.empty()) break;
        std::vector<Region> still;
        for (const Region& m : missing) {
          const Region got = m.Intersect(src->region);
          if (got.empty()) {
            still.push_back(m);
            continue;
          }
          const int sh = in.source_placement->host[src->rank];
          fragments[h].transfers.push_back({t, got, sh, h, dst.rank});
          if (sh == h)
            plan.summary.copied_within_host_bytes += got.volume() * elem;
          for (Region& rest : m.Difference(src->region))
            still.push_back(std::move(rest));
        }
        missing.swap(still);
      }
    }
  }
  for (HostFragment& f : fragments) {
    if (!f.holds.empty()) plan.fragments.push_back(std::move(f));
  }
  PTC_RETURN_IF_ERROR(PlanSmallObjects(in, &plan));
  SetBounds(in, a, Solve(a, Weights(in, /*uniform=*/false), false), &plan);
  Summarize(in, &plan);
  return plan;
}

}  // namespace ptc
