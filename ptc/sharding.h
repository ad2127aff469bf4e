// Sharding rules: how one tensor is cut into the regions each rank holds.
//
// Per mesh axis (tp, dp) a rule says Replicate, Split(dim) (chunk
// semantics, uneven sizes allowed, optionally over a padded extent as
// Megatron pads the vocabulary), GroupedSplit(dim, group sizes) (each group,
// e.g. q|k|v or gate|up, split on its own, so a rank holds one region per
// group) or ZeroFlat (ZeRO-1: a flat range of the stage's optimizer buffer,
// resolved by the layout builder). The pipeline rule says which stages hold
// the tensor: the stage of one layer, the first, the last, or both ends.
//
//   ShardingRule fc2;
//   fc2.tp = AxisRule::Split(1);               // row-parallel
//   fc2.stage = StageRule::Layer(7);
//   std::vector<Region> mine = RegionsOf(fc2, shape, config, coord);
#ifndef PTC_PTC_SHARDING_H_
#define PTC_PTC_SHARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ptc/parallel_config.h"
#include "ptc/region.h"

namespace ptc {

struct AxisRule {
  enum class Kind { kReplicate, kSplit, kGroupedSplit, kZeroFlat };
  Kind kind = Kind::kReplicate;
  // Dimension cut by kSplit / kGroupedSplit.
  int dim = 0;
  // kGroupedSplit: consecutive group extents along `dim`; they sum to the
  // tensor's extent there.
  std::vector<int64_t> groups;
  // kSplit: if > 0 the extent is first padded up to a multiple of
  // pad_multiple * axis size (Megatron's make_vocab_size_divisible_by), the
  // padded extent is chunked, and chunks are clipped to the real extent.
  int64_t pad_multiple = 0;

  static AxisRule Replicate() { return AxisRule(); }
  static AxisRule Split(int dim, int64_t pad_multiple = 0);
  static AxisRule GroupedSplit(int dim, std::vector<int64_t> groups);
  static AxisRule ZeroFlat();

  std::string ToString() const;
};

struct StageRule {
  enum class Kind { kLayer, kFirst, kLast, kFirstAndLast, kAll };
  Kind kind = Kind::kAll;
  int layer = 0;  // for kLayer

  static StageRule Layer(int layer) { return {Kind::kLayer, layer}; }
  static StageRule First() { return {Kind::kFirst, 0}; }
  static StageRule Last() { return {Kind::kLast, 0}; }
  static StageRule FirstAndLast() { return {Kind::kFirstAndLast, 0}; }
  static StageRule All() { return {Kind::kAll, 0}; }

  // Whether pipeline stage `stage` holds the tensor.
  bool HeldBy(int stage, const ParallelConfig& config, int num_layers) const;
  std::string ToString() const;
};

struct ShardingRule {
  AxisRule tp;
  AxisRule dp;
  StageRule stage;
};

// Checks the rule against the tensor's shape: split dimensions exist,
// groups sum to the extent. INVALID_ARGUMENT names the tensor.
absl::Status ValidateRule(const ShardingRule& rule,
                          absl::Span<const int64_t> shape,
                          absl::string_view tensor_key);

// Applies one axis rule for index `i` of an axis of `n` ranks to the
// regions held so far (a kZeroFlat rule leaves them unchanged). Empty
// pieces are dropped.
std::vector<Region> ApplyAxisRule(const AxisRule& rule,
                                  const std::vector<Region>& held, int n,
                                  int i);

// The regions of a tensor that the rank at `coord` holds under `rule`,
// ignoring ZeRO (kZeroFlat is resolved by BuildLayout). Empty if the
// rank's stage does not hold the tensor.
std::vector<Region> RegionsOf(const ShardingRule& rule,
                              absl::Span<const int64_t> shape,
                              const ParallelConfig& config, int num_layers,
                              const MeshCoord& coord);

}  // namespace ptc

#endif  // PTC_PTC_SHARDING_H_
