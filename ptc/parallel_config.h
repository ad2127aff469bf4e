// A job's parallel configuration: the mesh of ranks with named axes
// (pp, dp, tp), the order in which ranks are numbered, the pipeline's
// layers per stage, and whether the optimizer state is ZeRO-1 sharded.
//
//   PTC_ASSIGN_OR_RETURN(ParallelConfig c,
//   ParallelConfig::Parse("tp=2,pp=2,dp=4")); MeshCoord m = c.CoordOf(5);   //
//   {pp=0, dp=2, tp=1} in Megatron order
#ifndef PTC_PTC_PARALLEL_CONFIG_H_
#define PTC_PTC_PARALLEL_CONFIG_H_

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptc {

enum class Axis : int { kPipeline = 0, kData = 1, kTensor = 2 };
inline constexpr int kNumAxes = 3;

// "pp", "dp", "tp".
absl::string_view AxisName(Axis axis);

// A rank's position on the mesh.
struct MeshCoord {
  std::array<int, kNumAxes> index = {0, 0, 0};

  int pp() const { return index[0]; }
  int dp() const { return index[1]; }
  int tp() const { return index[2]; }
  int at(Axis a) const { return index[static_cast<int>(a)]; }
  bool operator==(const MeshCoord& o) const { return index == o.index; }
};

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  // Axes from fastest- to slowest-varying in the rank number. Megatron's
  // order is the default: rank = tp + TP * (dp + DP * pp).
  std::array<Axis, kNumAxes> order = {Axis::kTensor, Axis::kData,
                                      Axis::kPipeline};
  // Layers of each pipeline stage; empty means uniform (earlier stages take
  // one more layer when the layers do not divide evenly).
  std::vector<int> layers_per_stage;
  // ZeRO-1 (Megatron's distributed optimizer): optimizer state sharded over
  // dp by flat range of each stage's parameter buffer.
  bool zero1 = false;

  int size(Axis a) const;
  int world_size() const { return tp * pp * dp; }
  MeshCoord CoordOf(int rank) const;
  int RankOf(const MeshCoord& coord) const;

  // Parses "tp=2,pp=2,dp=4[,zero=1][,layers=10/10/12][,order=tp-dp-pp]".
  // Missing axes default to 1. INVALID_ARGUMENT names the bad token.
  static absl::StatusOr<ParallelConfig> Parse(absl::string_view text);
  // The inverse of Parse; omits defaults.
  std::string ToString() const;

  // Checks degrees >= 1, an order that names each axis once, and (given
  // the model's layer count) that the pipeline can be built.
  absl::Status Validate(int num_layers) const;

  // First layer and number of layers of `stage`, after Validate.
  std::pair<int, int> StageLayers(int stage, int num_layers) const;
  // The stage holding `layer`.
  int StageOfLayer(int layer, int num_layers) const;
};

// Chunk semantics for splitting `extent` into `parts`: the first
// extent % parts chunks get one more element. Returns [begin, end) of `i`.
std::pair<int64_t, int64_t> ChunkOf(int64_t extent, int64_t parts, int64_t i);

}  // namespace ptc

#endif  // PTC_PTC_PARALLEL_CONFIG_H_
