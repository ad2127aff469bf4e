#include "ptc/sharding.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {

AxisRule AxisRule::Split(int dim, int64_t pad_multiple) {
  AxisRule r;
  r.kind = Kind::kSplit;
  r.dim = dim;
  r.pad_multiple = pad_multiple;
  return r;
}

AxisRule AxisRule::GroupedSplit(int dim, std::vector<int64_t> groups) {
  AxisRule r;
  r.kind = Kind::kGroupedSplit;
  r.dim = dim;
  r.groups = std::move(groups);
  return r;
}

AxisRule AxisRule::ZeroFlat() {
  AxisRule r;
  r.kind = Kind::kZeroFlat;
  return r;
}

std::string AxisRule::ToString() const {
  switch (kind) {
    case Kind::kReplicate:
      return "replicate";
    case Kind::kSplit:
      return pad_multiple > 0
                 ? absl::StrCat("split(", dim, ", pad ", pad_multiple, ")")
                 : absl::StrCat("split(", dim, ")");
    case Kind::kGroupedSplit:
      return absl::StrCat("grouped_split(", dim, ", [",
                          absl::StrJoin(groups, ","), "])");
    case Kind::kZeroFlat:
      return "zero1_flat";
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
      return stage == config.pp - 1;
    case Kind::kFirstAndLast:
      return stage == 0 || stage == config.pp - 1;
    case Kind::kAll:
      return true;
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
  }
  return "?";
}

absl::Status ValidateRule(const ShardingRule& rule,
                          absl::Span<const int64_t> shape,
                          absl::string_view tensor_key) {
  for (const AxisRule* r : {&rule.tp, &rule.dp}) {
    if (r->kind != AxisRule::Kind::kSplit &&
        r->kind != AxisRule::Kind::kGroupedSplit) {
      continue;
    }
    if (r->dim < 0 || r->dim >= static_cast<int>(shape.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor_key, "': rule ", r->ToString(),
                       " splits dimension ", r->dim,
                       " but the tensor has rank ", shape.size()));
    }
    if (r->kind == AxisRule::Kind::kGroupedSplit) {
      const int64_t sum =
          std::accumulate(r->groups.begin(), r->groups.end(), int64_t{0});
      if (sum != shape[r->dim]) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor_key, "': groups of ", r->ToString(),
                         " add up to ", sum, " but dimension ", r->dim,
                         " has extent ", shape[r->dim]));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<Region> ApplyAxisRule(const AxisRule& rule,
                                  const std::vector<Region>& held, int n,
                                  int i) {
  if (rule.kind == AxisRule::Kind::kReplicate ||
      rule.kind == AxisRule::Kind::kZeroFlat || n == 1) {
    return held;
  }
  std::vector<Region> out;
  for (const Region& r : held) {
    const Interval span = r.dim(rule.dim);
    // The groups, in global coordinates, that this rule chunks separately.
    std::vector<Interval> groups;
    if (rule.kind == AxisRule::Kind::kSplit) {
      groups.push_back(span);
    } else {
      int64_t begin = 0;
      for (int64_t g : rule.groups) {
        const Interval gi{std::max(begin, span.begin),
                          std::min(begin + g, span.end)};
        if (gi.size() > 0) groups.push_back(gi);
        begin += g;
      }
    }
    for (const Interval& g : groups) {
      int64_t extent = g.size();
      if (rule.pad_multiple > 0) {
        const int64_t m = rule.pad_multiple * n;
        extent = (extent + m - 1) / m * m;
      }
      auto [b, e] = ChunkOf(extent, n, i);
      Region piece = r;
      piece.mutable_dim(rule.dim) = {g.begin + b, std::min(g.begin + e, g.end)};
      if (!piece.empty()) out.push_back(piece);
    }
  }
  return out;
}

std::vector<Region> RegionsOf(const ShardingRule& rule,
                              absl::Span<const int64_t> shape,
                              const ParallelConfig& config, int num_layers,
                              const MeshCoord& coord) {
  if (!rule.stage.HeldBy(coord.pp(), config, num_layers)) return {};
  std::vector<Region> held = {Region::Full(shape)};
  if (NumElements(shape) == 0) return {};
  held = ApplyAxisRule(rule.dp, held, config.dp, coord.dp());
  held = ApplyAxisRule(rule.tp, held, config.tp, coord.tp());
  return held;
}

}  // namespace ptc
