#include "coordinator/internal/plan_testing.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace ptc::testing {
namespace {

// Calls fn(flat global index, offset in box) for each element of `what`
// inside a dense row-major buffer holding `box`.
template <typename Fn>
void ForEachElement(const Shape& shape, const Region& box, const Region& what,
                    Fn fn) {
  const int rank = what.rank();
  if (what.empty()) return;
  std::vector<int64_t> idx(rank);
  for (int d = 0; d < rank; ++d) idx[d] = what.dim(d).begin;
  for (int64_t k = 0, n = what.volume(); k < n; ++k) {
    int64_t flat = 0, off = 0;
    for (int d = 0; d < rank; ++d) {
      flat = flat * shape[d] + idx[d];
      off = off * box.dim(d).size() + (idx[d] - box.dim(d).begin);
    }
    fn(flat, off);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < what.dim(d).end) break;
      idx[d] = what.dim(d).begin;
    }
  }
}

int64_t Encode(int t, int64_t flat) { return (int64_t{t} << 40) | flat; }

struct Buffer {
  Region region;
  std::vector<int64_t> values;
  std::vector<int> writes;
};

}  // namespace

TestJob RandomJob(std::mt19937* rng, std::string* description) {
  auto pick = [&](int lo, int hi) {
    return lo + static_cast<int>((*rng)() % (hi - lo + 1));
  };
  while (true) {
    const bool llama = pick(0, 1) == 1;
    const int heads = 1 << pick(1, 3);
    const int kv = llama ? heads >> pick(0, 1) : heads;
    const int head_dim = pick(1, 3);
    std::string model = absl::StrCat(
        llama ? "llama:" : "gpt:", "layers=", pick(1, 4),
        ",hidden=", heads * head_dim, ",heads=", heads, ",kv_heads=", kv,
        ",ffn=", pick(5, 19), ",vocab=", pick(7, 40), ",pad=", 1 << pick(0, 2),
        ",adam=", pick(0, 3) > 0 ? 1 : 0,
        llama ? "" : absl::StrCat(",positions=", pick(2, 5)));
    auto arch = ResolveArchitecture(model);
    if (!arch.ok()) continue;
    auto random_config = [&]() {
      ParallelConfig c;
      do {
        c.tp = 1 << pick(0, 2);
      } while (kv % c.tp != 0);
      c.pp = pick(1, arch->layers);
      c.dp = pick(1, 3);
      c.zero1 = pick(0, 2) == 0;
      if (pick(0, 3) == 0 && c.pp > 1) {
        // An explicit, uneven layers-per-stage list.
        c.layers_per_stage.assign(c.pp, 1);
        for (int extra = arch->layers - c.pp; extra > 0; --extra) {
          ++c.layers_per_stage[pick(0, c.pp - 1)];
        }
      }
      if (pick(0, 4) == 0) std::swap(c.order[1], c.order[2]);
      return c;
    };
    const ParallelConfig from = random_config(), to = random_config();
    const int gpus = 1 << pick(0, 2);
    const int num_hosts = pick(2, 7);
    Cluster cluster = Cluster::Uniform(num_hosts, gpus);
    std::vector<int> order(num_hosts);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), *rng);
    auto take_hosts = [&](int ranks, int offset) {
      std::vector<int> hosts;
      for (int i = 0;
           i < num_hosts && static_cast<int>(hosts.size()) * gpus < ranks;
           ++i) {
        hosts.push_back(order[(i + offset) % num_hosts]);
      }
      return hosts;
    };
    if (from.world_size() > num_hosts * gpus ||
        to.world_size() > num_hosts * gpus)
      continue;
    const std::vector<int> from_hosts = take_hosts(from.world_size(), 0);
    // Targets: the same hosts, shifted (redeploy), or a random offset.
    const std::vector<int> to_hosts =
        take_hosts(to.world_size(), pick(0, num_hosts - 1));
    std::vector<bool> alive(num_hosts, true);
    if (pick(0, 2) == 0) {
      // Kill a source host the target does not use.
      for (int h : from_hosts) {
        if (std::find(to_hosts.begin(), to_hosts.end(), h) == to_hosts.end()) {
          alive[h] = false;
          break;
        }
      }
    }
    auto job = MakeJob(model, from.ToString(), from_hosts, to.ToString(),
                       to_hosts, cluster, alive);
    if (!job.ok()) continue;
    int dead = 0;
    for (bool a : alive) dead += !a;
    *description =
        absl::StrCat(model, " from ", from.ToString(), " to ", to.ToString(),
                     " on ", num_hosts, "x", gpus, " hosts, ", dead, " dead");
    return std::move(*job);
  }
}

absl::Status ExecuteAndVerify(const PlanInput& in, const Plan& plan) {
  const int num_tensors = static_cast<int>(in.spec->tensors.size());
  // Source store: live host -> tensor -> buffers.
  std::map<std::pair<int, int>, std::vector<Buffer>> source;
  for (int t = 0; t < num_tensors; ++t) {
    const Shape& shape = in.spec->tensors[t].shape;
    for (const Shard& s : in.source->shards(t)) {
      const int h = in.source_placement->host[s.rank];
      if (!in.IsAlive(h)) continue;
      auto& list = source[{h, t}];
      if (std::any_of(list.begin(), list.end(),
                      [&](const Buffer& b) { return b.region == s.region; })) {
        continue;
      }
      Buffer b{s.region, std::vector<int64_t>(s.region.volume()), {}};
      ForEachElement(shape, s.region, s.region, [&](int64_t flat, int64_t off) {
        b.values[off] = Encode(t, flat);
      });
      list.push_back(std::move(b));
    }
  }
  // Target store: unit (host or rank) -> tensor -> buffers, all -1.
  std::map<std::pair<int, int>, std::vector<Buffer>> target;
  for (int t = 0; t < num_tensors; ++t) {
    for (const Shard& s : in.target->shards(t)) {
      const int unit =
          plan.per_rank ? s.rank : in.target_placement->host[s.rank];
      auto& list = target[{unit, t}];
      if (std::any_of(list.begin(), list.end(),
                      [&](const Buffer& b) { return b.region == s.region; })) {
        continue;
      }
      list.push_back({s.region, std::vector<int64_t>(s.region.volume(), -1),
                      std::vector<int>(s.region.volume(), 0)});
    }
  }
  for (const HostFragment& f : plan.fragments) {
    for (const Transfer& x : f.transfers) {
      const Shape& shape = in.spec->tensors[x.tensor].shape;
      const int unit = plan.per_rank ? x.target_rank : x.target_host;
      auto& dst = target[{unit, x.tensor}];
      std::vector<Region> missing = {x.region};
      for (const Buffer& src : source[{x.source_host, x.tensor}]) {
        std::vector<Region> still;
        for (const Region& m : missing) {
          const Region got = m.Intersect(src.region);
          if (got.empty()) {
            still.push_back(m);
            continue;
          }
          for (Buffer& d : dst) {
            const Region w = got.Intersect(d.region);
            if (w.empty()) continue;
            CopyRegion(src.values.data(), src.region, d.values.data(), d.region,
                       w, 8);
            ForEachElement(shape, d.region, w,
                           [&](int64_t, int64_t off) { ++d.writes[off]; });
          }
          for (Region& r : m.Difference(src.region))
            still.push_back(std::move(r));
        }
        missing.swap(still);
      }
      if (!missing.empty()) {
        return absl::InternalError(
            absl::StrCat("source host ", x.source_host, " does not hold ",
                         missing[0].ToString(), " of tensor ",
                         in.spec->tensors[x.tensor].key));
      }
    }
  }
  for (auto& [key, list] : target) {
    const int t = key.second;
    const Shape& shape = in.spec->tensors[t].shape;
    for (const Buffer& b : list) {
      absl::Status status;
      ForEachElement(shape, b.region, b.region, [&](int64_t flat, int64_t off) {
        if (!status.ok()) return;
        if (b.writes[off] != 1 || b.values[off] != Encode(t, flat)) {
          status = absl::InternalError(absl::StrCat(
              "unit ", key.first, " tensor ", in.spec->tensors[t].key,
              " element ", flat, " written ", b.writes[off], " times, value ",
              b.values[off]));
        }
      });
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

namespace {

// (tensor, flat) of every element held by each host on one side.
std::map<int, std::unordered_set<int64_t>> ElementsByHost(
    const PlanInput& in, const Layout& layout, const Placement& placement,
    bool alive_only) {
  std::map<int, std::unordered_set<int64_t>> out;
  for (int t = 0; t < layout.num_tensors(); ++t) {
    const Shape& shape = in.spec->tensors[t].shape;
    for (const Shard& s : layout.shards(t)) {
      const int h = placement.host[s.rank];
      if (alive_only && !in.IsAlive(h)) continue;
      ForEachElement(shape, s.region, s.region, [&](int64_t flat, int64_t) {
        out[h].insert(Encode(t, flat));
      });
    }
  }
  return out;
}

}  // namespace

int64_t BruteForceCrossHostLowerBound(const PlanInput& in) {
  auto need = ElementsByHost(in, *in.target, *in.target_placement, false);
  auto have = ElementsByHost(in, *in.source, *in.source_placement, true);
  int64_t bytes = 0;
  for (const auto& [h, elements] : need) {
    const auto& mine = have[h];
    for (int64_t e : elements) {
      if (!mine.count(e)) bytes += ElementSize(in.spec->tensors[e >> 40].dtype);
    }
  }
  return bytes;
}

bool BruteForceSomethingLost(const PlanInput& in) {
  auto need = ElementsByHost(in, *in.target, *in.target_placement, false);
  auto have = ElementsByHost(in, *in.source, *in.source_placement, true);
  std::unordered_set<int64_t> anywhere;
  for (const auto& [h, e] : have) anywhere.insert(e.begin(), e.end());
  for (const auto& [h, elements] : need) {
    for (int64_t e : elements) {
      if (!anywhere.count(e)) return true;
    }
  }
  return false;
}

}  // namespace ptc::testing
