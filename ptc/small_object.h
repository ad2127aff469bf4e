// Small objects: opaque bytes that are part of a job's state but are not
// tensors (RNG states, step counter, LR scheduler, data-loader cursor),
// each with a scope, and the deterministic rule that says from which source
// rank a rank of a new parallel config takes its copy.
//
// The rule, for a target rank at (pp', dp', tp') of config C' from config C:
//   kGlobal:  source ranks in rank order; the first alive one.
//   kStage:   the old stage s holding the first layer of new stage pp';
//             ranks of s in rank order.
//   kTpRank:  stage s as above, old tp index tp' mod C.tp, dp 0 first, then
//             increasing dp.
//   kRank:    stage s, (dp' mod C.dp, tp' mod C.tp) first, then the other
//             dp replicas of that tp index in increasing dp.
// Per-tp-rank and per-rank objects never come from another tp index.
// The first candidate on a live host wins.
//
//   std::vector<int> c = SmallObjectSourceCandidates(
//       SmallObjectScope::kTpRank, from, to, num_layers, to.CoordOf(r));
#ifndef PTC_PTC_SMALL_OBJECT_H_
#define PTC_PTC_SMALL_OBJECT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ptc/parallel_config.h"

namespace ptc {

enum class SmallObjectScope { kGlobal, kStage, kTpRank, kRank };
absl::string_view ScopeName(SmallObjectScope scope);

struct SmallObjectSpec {
  std::string name;
  SmallObjectScope scope = SmallObjectScope::kGlobal;
  // Typical size, for plan accounting only; the bytes themselves are opaque.
  int64_t bytes = 0;
};

// Source ranks of `from` in the order the rule above prefers them.
std::vector<int> SmallObjectSourceCandidates(SmallObjectScope scope,
                                             const ParallelConfig& from,
                                             const ParallelConfig& to,
                                             int num_layers,
                                             const MeshCoord& target);

}  // namespace ptc

#endif  // PTC_PTC_SMALL_OBJECT_H_
