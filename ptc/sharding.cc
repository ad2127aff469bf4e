#include "ptc/sharding.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {

AxisPlacement AxisPlacement::Replicate(std::vector<std::string> axes) {
  AxisPlacement p;
  p.axes = std::move(axes);
  return p;
}

AxisPlacement AxisPlacement::Shard(std::vector<std::string> axes, int dim,
                           int64_t pad_multiple) {
  AxisPlacement p;
  p.kind = Kind::kShard;
  p.axes = std::move(axes);
  p.dim = dim;
  p.pad_multiple = pad_multiple;
  return p;
}

AxisPlacement AxisPlacement::GroupedShard(std::vector<std::string> axes, int dim,
                                  std::vector<int64_t> groups,
                                  int64_t repeats) {
  AxisPlacement p;
  p.kind = Kind::kGroupedShard;
  p.axes = std::move(axes);
  p.dim = dim;
  p.groups = std::move(groups);
  p.repeats = repeats;
  return p;
}

AxisPlacement AxisPlacement::Select(std::vector<std::string> axes, int64_t item,
                            int64_t items) {
  AxisPlacement p;
  p.kind = Kind::kSelect;
  p.axes = std::move(axes);
  p.item = item;
  p.items = items;
  return p;
}

AxisPlacement& AxisPlacement::Even(int64_t size, std::string name) {
  even = true;
  unit_size = size;
  unit = std::move(name);
  return *this;
}

std::string AxisPlacement::ToString() const {
  const std::string on = absl::StrJoin(axes, "+");
  switch (kind) {
    case Kind::kReplicate:
      return absl::StrCat(on, ": replicate");
    case Kind::kShard:
      return pad_multiple > 0 ? absl::StrCat(on, ": shard(dim ", dim, ", pad ",
                                             pad_multiple, ")")
                              : absl::StrCat(on, ": shard(dim ", dim, ")");
    case Kind::kGroupedShard:
      return absl::StrCat(on, ": grouped_shard(dim ", dim, ", [",
                          absl::StrJoin(groups, ","), "]",
                          repeats > 1 ? absl::StrCat(" x ", repeats) : "", ")");
    case Kind::kSelect:
      return absl::StrCat(on, ": select(item ", item, " of ", items, ")");
  }
  return "?";
}

bool StageRule::HeldBy(int stage, const ParallelConfig& config,
                       int num_layers) const {
  switch (kind) {
    case Kind::kLayer:
      return config.StageOfLayer(layer, num_layers) == stage;
    case Kind::kFirst:
      return stage == 0;
    case Kind::kLast:
      return stage == config.pp() - 1;
    case Kind::kFirstAndLast:
      return stage == 0 || stage == config.pp() - 1;
    case Kind::kAll:
      return true;
    case Kind::kList:
      return std::find(stages.begin(), stages.end(), stage) != stages.end();
  }
  return false;
}

std::string StageRule::ToString() const {
  switch (kind) {
    case Kind::kLayer:
      return absl::StrCat("layer ", layer);
    case Kind::kFirst:
      return "first stage";
    case Kind::kLast:
      return "last stage";
    case Kind::kFirstAndLast:
      return "first and last stage";
    case Kind::kAll:
      return "every stage";
    case Kind::kList:
      return absl::StrCat("stages ", absl::StrJoin(stages, ","));
  }
  return "?";
}

absl::Status ValidateAxisPlacement(const AxisPlacement& p,
                               absl::Span<const int64_t> shape,
                               const std::vector<std::string>& mesh,
                               absl::string_view tensor_key) {
  auto bad = [&](auto&&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor_key, "': placement ", p.ToString(),
                     ": ", what...));
  };
  if (p.axes.empty()) return bad("names no mesh axis");
  std::set<std::string> seen;
  for (const std::string& a : p.axes) {
    if (std::find(mesh.begin(), mesh.end(), a) == mesh.end()) {
      return bad("unknown axis '", a, "'; the mesh has ",
                 absl::StrJoin(mesh, ", "));
    }
    if (a == kPipelineAxis) {
      return bad("the pipeline axis '", a,
                 "' is given by the stage rule, not by a placement");
    }
    if (!seen.insert(a).second) return bad("names axis '", a, "' twice");
  }
  if (p.unit_size < 1) return bad("unit_size must be at least 1");
  switch (p.kind) {
    case AxisPlacement::Kind::kReplicate:
      return absl::OkStatus();
    case AxisPlacement::Kind::kSelect:
      if (p.items < 1 || p.item < 0 || p.item >= p.items) {
        return bad("item ", p.item, " is not in [0, ", p.items, ")");
      }
      return absl::OkStatus();
    case AxisPlacement::Kind::kShard:
    case AxisPlacement::Kind::kGroupedShard:
      break;
  }
  if (p.dim < 0 || p.dim >= static_cast<int>(shape.size())) {
    return bad("dimension ", p.dim, " does not exist; the tensor has rank ",
               shape.size());
  }
  if (p.pad_multiple < 0) return bad("pad_multiple is negative");
  if (p.kind == AxisPlacement::Kind::kShard) return absl::OkStatus();
  if (p.groups.empty()) return bad("lists no groups");
  if (p.repeats < 1) return bad("repeats must be at least 1");
  int64_t sum = 0;
  for (int64_t g : p.groups) {
    if (g < 0 || g > shape[p.dim]) return bad("group extent ", g, " is out of range");
    sum += g;
  }
  if (sum > shape[p.dim] || sum * p.repeats != shape[p.dim]) {
    return bad("groups add up to ", sum, " x ", p.repeats,
               " repeats but dimension ", p.dim, " has extent ",
               shape[p.dim]);
  }
  return absl::OkStatus();
}

int64_t AxisPlacementParts(const AxisPlacement& p, const ParallelConfig& config) {
  int64_t n = 1;
  for (const std::string& a : p.axes) n *= config.size(a);
  return n;
}

int64_t AxisPlacementIndex(const AxisPlacement& p, const ParallelConfig& config,
                       const MeshCoord& coord) {
  int64_t i = 0;
  for (const std::string& a : p.axes) {
    i = i * config.size(a) + config.IndexOn(coord, a);
  }
  return i;
}

absl::Status CheckAxisPlacementFits(const AxisPlacement& p,
                                absl::Span<const int64_t> shape,
                                const ParallelConfig& config,
                                absl::string_view tensor_key) {
  const int64_t n = AxisPlacementParts(p, config);
  if (!p.even || n == 1) return absl::OkStatus();
  auto degree = [&] {
    std::vector<std::string> parts;
    for (const std::string& a : p.axes)
      parts.push_back(absl::StrCat(a, "=", config.size(a)));
    return absl::StrJoin(parts, "*");
  };
  const std::string unit = p.unit.empty() ? "elements" : p.unit;
  auto refuse = [&](int64_t count, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        degree(), " does not divide the ", count, " ", what, " of tensor '",
        tensor_key, "'",
        p.kind == AxisPlacement::Kind::kSelect ? ""
                                           : absl::StrCat(" (dimension ", p.dim, ")"),
        "; choose ",
        p.axes.size() == 1 ? p.axes[0] : "those axes", " to divide ", count));
  };
  if (p.kind == AxisPlacement::Kind::kShard) {
    const int64_t units = shape[p.dim] / p.unit_size;
    if (shape[p.dim] % p.unit_size != 0 || units % n != 0)
      return refuse(units, unit);
  } else if (p.kind == AxisPlacement::Kind::kSelect) {
    if (p.items % n != 0) return refuse(p.items, p.unit.empty() ? "items" : p.unit);
  } else if (p.kind == AxisPlacement::Kind::kGroupedShard) {
    if (p.repeats > 1) {
      if (p.repeats % n != 0)
        return refuse(p.repeats, p.unit.empty() ? "blocks" : p.unit);
    } else {
      for (int64_t g : p.groups) {
        const int64_t units = g / p.unit_size;
        if (g % p.unit_size != 0 || units % n != 0) return refuse(units, unit);
      }
    }
  }
  return absl::OkStatus();
}

std::vector<Region> ApplyAxisPlacement(const AxisPlacement& p,
                                   const std::vector<Region>& held, int64_t n,
                                   int64_t i) {
  if (p.kind == AxisPlacement::Kind::kReplicate || n == 1) return held;
  if (p.kind == AxisPlacement::Kind::kSelect) {
    auto [b, e] = ChunkOf(p.items, n, i);
    if (p.item >= b && p.item < e) return held;
    return {};
  }
  std::vector<Region> out;
  for (const Region& r : held) {
    const Interval span = r.dim(p.dim);
    // The ranges, in global coordinates, that are chunked separately, with
    // the granule each chunk boundary must respect.
    std::vector<Interval> groups;
    int64_t granule = 1;
    if (p.kind == AxisPlacement::Kind::kShard) {
      groups.push_back(span);
    } else if (p.repeats > 1) {
      granule = std::accumulate(p.groups.begin(), p.groups.end(), int64_t{0});
      groups.push_back({0, granule * p.repeats});
    } else {
      int64_t begin = 0;
      for (int64_t g : p.groups) {
        const Interval gi{std::max(begin, span.begin),
                          std::min(begin + g, span.end)};
        if (gi.size() > 0) groups.push_back(gi);
        begin += g;
      }
    }
    for (const Interval& g : groups) {
      Interval mine;
      if (granule > 1) {
        auto [b, e] = ChunkOf(g.size() / granule, n, i);
        mine = {g.begin + b * granule, g.begin + e * granule};
      } else {
        int64_t extent = g.size();
        if (p.pad_multiple > 0) {
          const int64_t m = p.pad_multiple * n;
          extent = (extent + m - 1) / m * m;
        }
        auto [b, e] = ChunkOf(extent, n, i);
        mine = {g.begin + b, std::min(g.begin + e, g.end)};
      }
      // Intersect with what is held.
      mine = {std::max(mine.begin, span.begin), std::min(mine.end, span.end)};
      if (mine.size() == 0) continue;
      Region piece = r;
      piece.mutable_dim(p.dim) = mine;
      out.push_back(piece);
    }
  }
  return out;
}

std::vector<Region> RegionsOf(absl::Span<const AxisPlacement> placements,
                              const StageRule& stage,
                              absl::Span<const int64_t> shape,
                              const ParallelConfig& config, int num_layers,
                              const MeshCoord& coord) {
  if (!stage.HeldBy(config.IndexOn(coord, kPipelineAxis), config,
                    num_layers)) {
    return {};
  }
  if (NumElements(shape) == 0) return {};
  std::vector<Region> held = {Region::Full(shape)};
  for (const AxisPlacement& p : placements) {
    held = ApplyAxisPlacement(p, held, AxisPlacementParts(p, config),
                          AxisPlacementIndex(p, config, coord));
    if (held.empty()) break;
  }
  return held;
}

}  // namespace ptc
