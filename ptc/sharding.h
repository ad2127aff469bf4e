// Placements: how one tensor is cut into the regions each rank holds.
//
// A tensor lists placements, each over one mesh axis or several axes
// jointly (their ranks flattened, the first axis slowest); axes it does not
// name replicate it. Placements apply in the order listed, each cutting
// what the previous ones left:
//   Replicate                 every index holds all of it;
//   Shard(dim)                chunk semantics, uneven sizes allowed,
//                             optionally over a padded extent (Megatron's
//                             padded vocabulary), clipped to the real one;
//   GroupedShard(dim, groups) the dimension is `repeats` blocks of groups
//                             (q|k|v, gate|up). repeats == 1: each group is
//                             chunked on its own, one region per group;
//                             repeats > 1 (rows ordered per query group, as
//                             Megatron-core's fused qkv): whole blocks are
//                             chunked, one region per rank;
//   Select(item, items)       the tensor is item `item` of `items` (an
//                             expert of a layer): the axis index whose chunk
//                             of the items contains it holds all of it,
//                             the others nothing.
// The stage rule says which pipeline stages hold the tensor: the stage of
// one layer, the first, the last, both ends, every stage, or a list.
//
//   AxisPlacement col = AxisPlacement::Shard({"tp"}, 0);
//   std::vector<Region> mine = ApplyAxisPlacement(col, {Region::Full(s)}, 4, 1);
#ifndef PTC_PTC_SHARDING_H_
#define PTC_PTC_SHARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ptc/parallel_config.h"
#include "ptc/region.h"

namespace ptc {

struct AxisPlacement {
  enum class Kind { kReplicate, kShard, kGroupedShard, kSelect };
  Kind kind = Kind::kReplicate;
  // Mesh axes the placement cuts over, jointly; the first varies slowest.
  std::vector<std::string> axes;
  // Dimension cut by kShard / kGroupedShard.
  int dim = 0;
  // kShard: if > 0 the extent is first padded up to a multiple of
  // pad_multiple * axis size (Megatron's make_vocab_size_divisible_by).
  int64_t pad_multiple = 0;
  // kGroupedShard: one block's group extents along `dim`, and the number
  // of blocks; sum(groups) * repeats is the tensor's extent there.
  std::vector<int64_t> groups;
  int64_t repeats = 1;
  // kSelect: this tensor is item `item` of `items`.
  int64_t item = 0;
  int64_t items = 0;
  // Configs must divide evenly: for kShard the extent (in units), for a
  // contiguous kGroupedShard each group (in units), for an interleaved
  // one the blocks. A config that does not is refused.
  bool even = false;
  // Size of one unit along `dim` and its name, for `even` and messages:
  // e.g. 128 rows per "attention heads".
  int64_t unit_size = 1;
  std::string unit;

  static AxisPlacement Replicate(std::vector<std::string> axes);
  static AxisPlacement Shard(std::vector<std::string> axes, int dim,
                         int64_t pad_multiple = 0);
  static AxisPlacement GroupedShard(std::vector<std::string> axes, int dim,
                                std::vector<int64_t> groups,
                                int64_t repeats = 1);
  static AxisPlacement Select(std::vector<std::string> axes, int64_t item,
                          int64_t items);
  // Sets even, unit_size and unit; returns *this.
  AxisPlacement& Even(int64_t unit_size = 1, std::string unit = "");

  std::string ToString() const;
};

struct StageRule {
  enum class Kind { kLayer, kFirst, kLast, kFirstAndLast, kAll, kList };
  Kind kind = Kind::kAll;
  int layer = 0;            // for kLayer
  std::vector<int> stages;  // for kList

  static StageRule Layer(int layer) { return {Kind::kLayer, layer, {}}; }
  static StageRule First() { return {Kind::kFirst, 0, {}}; }
  static StageRule Last() { return {Kind::kLast, 0, {}}; }
  static StageRule FirstAndLast() { return {Kind::kFirstAndLast, 0, {}}; }
  static StageRule All() { return {Kind::kAll, 0, {}}; }
  static StageRule List(std::vector<int> s) {
    return {Kind::kList, 0, std::move(s)};
  }

  // Whether pipeline stage `stage` holds the tensor.
  bool HeldBy(int stage, const ParallelConfig& config, int num_layers) const;
  std::string ToString() const;
};

// Checks a placement against the tensor's shape and the mesh: known axes,
// no axis twice, dimensions that exist, groups that add up, items in
// range. INVALID_ARGUMENT names the tensor and the field.
absl::Status ValidateAxisPlacement(const AxisPlacement& p,
                               absl::Span<const int64_t> shape,
                               const std::vector<std::string>& mesh,
                               absl::string_view tensor_key);

// Checks that `config` can run the placement (`even`). INVALID_ARGUMENT
// names the axis, the tensor and what does not divide.
absl::Status CheckAxisPlacementFits(const AxisPlacement& p,
                                absl::Span<const int64_t> shape,
                                const ParallelConfig& config,
                                absl::string_view tensor_key);

// Number of ranks of the placement's axes under `config`, and the rank at
// `coord`'s index among them (flattened, first axis slowest).
int64_t AxisPlacementParts(const AxisPlacement& p, const ParallelConfig& config);
int64_t AxisPlacementIndex(const AxisPlacement& p, const ParallelConfig& config,
                       const MeshCoord& coord);

// Applies one placement for index `i` of `n` to the regions held so far.
// Empty pieces are dropped.
std::vector<Region> ApplyAxisPlacement(const AxisPlacement& p,
                                   const std::vector<Region>& held, int64_t n,
                                   int64_t i);

// The regions of a tensor of `shape` that the rank at `coord` holds under
// `placements` and `stage`; empty if its stage does not hold the tensor.
std::vector<Region> RegionsOf(absl::Span<const AxisPlacement> placements,
                              const StageRule& stage,
                              absl::Span<const int64_t> shape,
                              const ParallelConfig& config, int num_layers,
                              const MeshCoord& coord);

}  // namespace ptc

#endif  // PTC_PTC_SHARDING_H_
