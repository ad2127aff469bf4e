#include "ptc/small_object.h"

#include <algorithm>

namespace ptc {

absl::string_view ScopeName(SmallObjectScope scope) {
  switch (scope) {
    case SmallObjectScope::kGlobal:
      return "global";
    case SmallObjectScope::kStage:
      return "stage";
    case SmallObjectScope::kTpRank:
      return "tp_rank";
    case SmallObjectScope::kRank:
      return "rank";
  }
  return "?";
}

std::vector<int> SmallObjectSourceCandidates(SmallObjectScope scope,
                                             const ParallelConfig& from,
                                             const ParallelConfig& to,
                                             int num_layers,
                                             const MeshCoord& target) {
  std::vector<int> out;
  if (scope == SmallObjectScope::kGlobal) {
    for (int r = 0; r < from.world_size(); ++r) out.push_back(r);
    return out;
  }
  const int first_layer = to.StageLayers(target.pp(), num_layers).first;
  const int stage = from.StageOfLayer(first_layer, num_layers);
  auto rank_of = [&](int dp, int tp) {
    MeshCoord c;
    c.index = {stage, dp, tp};
    return from.RankOf(c);
  };
  std::vector<bool> taken(from.world_size(), false);
  auto add = [&](int rank) {
    if (!taken[rank]) {
      taken[rank] = true;
      out.push_back(rank);
    }
  };
  if (scope == SmallObjectScope::kStage) {
    for (int dp = 0; dp < from.dp; ++dp) {
      for (int tp = 0; tp < from.tp; ++tp) add(rank_of(dp, tp));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // Per-tp-rank and per-rank state never falls back to another tp rank:
  // two tp ranks with the same RNG state would draw identical dropout masks.
  const int tp = target.tp() % from.tp;
  if (scope == SmallObjectScope::kRank) add(rank_of(target.dp() % from.dp, tp));
  for (int dp = 0; dp < from.dp; ++dp) add(rank_of(dp, tp));
  return out;
}

}  // namespace ptc
