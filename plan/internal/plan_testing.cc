#include "plan/internal/plan_testing.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ptc/families.h"

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

ModelSpec RandomSpec(std::mt19937* rng) {
  auto pick = [&](int lo, int hi) {
    return lo + static_cast<int>((*rng)() % (hi - lo + 1));
  };
  ModelSpec spec;
  spec.name = "random";
  spec.mesh = pick(0, 1) == 0
                  ? std::vector<std::string>{"pp", "dp", "ep", "tp"}
                  : std::vector<std::string>{"pp", "dp_replicate", "dp_shard",
                                             "tp"};
  const std::vector<std::string> cut_axes(spec.mesh.begin() + 1,
                                          spec.mesh.end());
  spec.num_layers = pick(1, 4);
  const int n = pick(2, 7);
  for (int i = 0; i < n; ++i) {
    TensorSpec t;
    t.key = absl::StrCat("t", i);
    t.dtype = pick(0, 1) ? DType::kFloat32 : DType::kBFloat16;
    const int rank = pick(1, 3);
    for (int d = 0; d < rank; ++d) t.shape.push_back(pick(1, 12));
    std::vector<std::string> free = cut_axes;
    std::shuffle(free.begin(), free.end(), *rng);
    const int cuts = pick(0, 2);
    for (int c = 0; c < cuts && !free.empty(); ++c) {
      std::vector<std::string> axes = {free.back()};
      free.pop_back();
      if (!free.empty() && pick(0, 3) == 0) {  // jointly over two axes
        axes.push_back(free.back());
        free.pop_back();
      }
      const int dim = pick(0, rank - 1);
      AxisPlacement p;
      switch (pick(0, 4)) {
        case 0:
          p = AxisPlacement::Replicate(axes);
          break;
        case 1:
          p = AxisPlacement::Shard(axes, dim, pick(0, 1) ? pick(1, 3) : 0);
          break;
        case 2: {
          // Contiguous groups summing to the extent.
          std::vector<int64_t> groups;
          int64_t left = t.shape[dim];
          while (left > 0) {
            const int64_t g = std::min<int64_t>(left, pick(1, 4));
            groups.push_back(g);
            left -= g;
          }
          p = AxisPlacement::GroupedShard(axes, dim, groups);
          break;
        }
        case 3: {
          // Interleaved: blocks of (a, b) rows.
          const int a = pick(1, 2), b = pick(1, 2), blocks = pick(1, 4);
          t.shape[dim] = (a + b) * blocks;
          p = AxisPlacement::GroupedShard(axes, dim, {a, b}, blocks);
          break;
        }
        default: {
          const int items = pick(1, 4);
          p = AxisPlacement::Select(axes, pick(0, items - 1), items);
          break;
        }
      }
      t.placements.push_back(std::move(p));
    }
    switch (pick(0, 5)) {
      case 0:
        t.stage = StageRule::First();
        break;
      case 1:
        t.stage = StageRule::FirstAndLast();
        break;
      case 2:
      case 3:
        t.stage = StageRule::Layer(pick(0, spec.num_layers - 1));
        break;
      default:
        t.stage = StageRule::All();
    }
    spec.tensors.push_back(std::move(t));
  }
  // A flat buffer over an axis no entry is cut by, with state members.
  if (pick(0, 2) > 0) {
    FlatBuffer buf;
    buf.name = "buffer";
    buf.axes = {cut_axes[pick(0, static_cast<int>(cut_axes.size()) - 1)]};
    if (pick(0, 2) == 0) {
      for (const std::string& a : cut_axes) {
        if (a != buf.axes[0] && pick(0, 1)) {
          buf.axes.push_back(a);
          break;
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      bool cut = false;
      for (const AxisPlacement& p : spec.tensors[i].placements) {
        for (const std::string& a : p.axes) {
          cut |= p.kind != AxisPlacement::Kind::kReplicate &&
                 std::find(buf.axes.begin(), buf.axes.end(), a) !=
                     buf.axes.end();
        }
      }
      if (cut || pick(0, 3) == 0) continue;
      buf.entries.push_back(
          {i, pick(0, 3) == 0 ? FlatBuffer::OwnBucket::kWhenShared
                              : FlatBuffer::OwnBucket::kNever});
    }
    if (pick(0, 1)) std::reverse(buf.entries.begin(), buf.entries.end());
    buf.align = pick(1, 4);
    buf.bucket_size = pick(0, 1) ? pick(1, 40) : 0;
    buf.bucket_pad = pick(0, 1) ? pick(1, 4) : 0;
    buf.optional = pick(0, 1);
    if (!buf.entries.empty()) {
      const int b = static_cast<int>(spec.buffers.size());
      for (const FlatBuffer::Entry& e : std::vector<FlatBuffer::Entry>(
               buf.entries.begin(), buf.entries.end())) {
        if (pick(0, 2) == 0) {
          // FSDP-style: the entry itself is flat-sharded.
          spec.tensors[e.tensor].buffer = b;
          spec.tensors[e.tensor].slot = e.tensor;
        }
        TensorSpec m = spec.tensors[e.tensor];
        m.key = absl::StrCat("state.", m.key);
        m.dtype = DType::kFloat32;
        m.role = Role::kOptimizerState;
        m.buffer = b;
        m.slot = e.tensor;
        spec.tensors.push_back(std::move(m));
      }
      spec.buffers.push_back(std::move(buf));
    }
  }
  spec.small_objects = {{"step", {}, NewRankRule::kCopy, 8},
                        {"rng", spec.mesh, NewRankRule::kDerive, 16}};
  return spec;
}

std::string RandomConfig(std::mt19937* rng, const ModelSpec& spec) {
  auto pick = [&](int lo, int hi) {
    return lo + static_cast<int>((*rng)() % (hi - lo + 1));
  };
  std::vector<std::string> parts;
  for (const std::string& a : spec.mesh) {
    parts.push_back(absl::StrCat(
        a, "=", a == "pp" ? pick(1, spec.num_layers) : pick(1, 3)));
  }
  if (pick(0, 2) == 0) parts.push_back("zero=1");
  return absl::StrJoin(parts, ",");
}

namespace {

// A job of a random spec (RandomSpec) between two random configs.
std::optional<TestJob> RandomSpecJob(std::mt19937* rng,
                                     std::string* description) {
  auto pick = [&](int lo, int hi) {
    return lo + static_cast<int>((*rng)() % (hi - lo + 1));
  };
  ModelSpec spec = RandomSpec(rng);
  if (!spec.Validate().ok()) return std::nullopt;
  const std::string from = RandomConfig(rng, spec), to = RandomConfig(rng, spec);
  const int world_from = spec.ParseConfig(from)->world_size();
  const int world_to = spec.ParseConfig(to)->world_size();
  const int gpus = 1 << pick(1, 3);
  const int num_hosts = std::max(world_from, world_to) / gpus + pick(1, 3);
  std::vector<int> from_hosts, to_hosts;
  for (int h = 0; h * gpus < world_from; ++h) from_hosts.push_back(h);
  const int shift = pick(0, num_hosts - 1);
  for (int h = 0; h * gpus < world_to; ++h)
    to_hosts.push_back((h + shift) % num_hosts);
  auto job = MakePlanScenario(spec, from, from_hosts, to, to_hosts,
                              Cluster::Uniform(num_hosts, gpus));
  if (!job.ok()) return std::nullopt;
  *description = absl::StrCat("random spec (", spec.tensors.size(),
                              " tensors, mesh ", absl::StrJoin(spec.mesh, ","),
                              ") from ", from, " to ", to, " on ", num_hosts,
                              "x", gpus, " hosts");
  return std::move(*job);
}

}  // namespace

TestJob RandomJob(std::mt19937* rng, std::string* description) {
  auto pick = [&](int lo, int hi) {
    return lo + static_cast<int>((*rng)() % (hi - lo + 1));
  };
  while (pick(0, 1) == 0) {
    if (auto job = RandomSpecJob(rng, description)) return std::move(*job);
  }
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
      int tp;
      do {
        tp = 1 << pick(0, 2);
      } while (kv % tp != 0);
      c.set_size("tp", tp);
      c.set_size("pp", pick(1, arch->layers));
      c.set_size("dp", pick(1, 3));
      c.zero1 = pick(0, 2) == 0;
      if (pick(0, 3) == 0 && c.pp() > 1) {
        // An explicit, uneven layers-per-stage list.
        c.layers_per_stage.assign(c.pp(), 1);
        for (int extra = arch->layers - c.pp(); extra > 0; --extra) {
          ++c.layers_per_stage[pick(0, c.pp() - 1)];
        }
      }
      if (pick(0, 4) == 0) {
        std::swap(c.axes[1], c.axes[2]);
        std::swap(c.sizes[1], c.sizes[2]);
      }
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
  absl::Status failed;
  for (const HostFragment& f : plan.fragments) {
    ForEachPiece(f, [&](const Transfer& x) {
      if (!failed.ok()) return;
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
        failed = absl::InternalError(
            absl::StrCat("source host ", x.source_host, " does not hold ",
                         missing[0].ToString(), " of tensor ",
                         in.spec->tensors[x.tensor].key));
      }
    });
  }
  if (!failed.ok()) return failed;
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
