// A job's parallel configuration: sizes for the named axes of the job's
// mesh, the order in which ranks are numbered, the pipeline's layers per
// stage, and whether optional flat buffers (ZeRO-1) are in use.
//
// The mesh's axes come from the job's layout spec (default: pp, dp, tp);
// the config string gives their sizes:
//
//   PTC_ASSIGN_OR_RETURN(ParallelConfig c,
//       ParallelConfig::Parse("pp=2,dp=2,ep=4,tp=2", {"pp", "dp", "ep", "tp"}));
//   MeshCoord m = c.CoordOf(5);  // one index per axis, in c.axes order
//   int tp = c.IndexOn(m, "tp");
#ifndef PTC_PTC_PARALLEL_CONFIG_H_
#define PTC_PTC_PARALLEL_CONFIG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptc {

// The axis whose index is the pipeline stage; layers map to stages
// through the config's stage map.
inline constexpr absl::string_view kPipelineAxis = "pp";
// At most this many ranks in one job (a guard against hostile configs).
inline constexpr int64_t kMaxWorldSize = 1 << 20;
// At most this many axes in one mesh.
inline constexpr int kMaxMeshAxes = 8;

// The mesh of the built-in model families: pp, dp, tp (Megatron's order).
const std::vector<std::string>& DefaultMesh();

// A rank's position on the mesh: index[i] is its index on axes[i] of the
// config that made it.
struct MeshCoord {
  std::vector<int> index;
  bool operator==(const MeshCoord& o) const { return index == o.index; }
};

struct ParallelConfig {
  // The job's mesh axes as its spec declares them, slowest-varying first.
  std::vector<std::string> mesh = DefaultMesh();
  // The same axes in rank order, slowest-varying first: the rank of
  // coordinate (i0, i1, ..., ik) is ((i0 * n1 + i1) * n2 + ...) + ik.
  // Equal to `mesh` unless the config says order=...
  std::vector<std::string> axes = DefaultMesh();
  // sizes[i] is the degree of axes[i]; every size is >= 1.
  std::vector<int> sizes = std::vector<int>(3, 1);
  // Layers of each pipeline stage; empty means uniform (earlier stages take
  // one more layer when the layers do not divide evenly).
  std::vector<int> layers_per_stage;
  // zero=1: the spec's optional flat buffers (ZeRO-1, Megatron's
  // distributed optimizer) shard their tensors by flat range.
  bool zero1 = false;

  // Position of `axis` in `axes`, or -1 if the mesh has no such axis.
  int AxisIndex(absl::string_view axis) const;
  // Degree of `axis`; 1 for an axis the mesh does not have.
  int size(absl::string_view axis) const;
  int pp() const { return size("pp"); }
  int dp() const { return size("dp"); }
  int tp() const { return size("tp"); }
  // Sets the degree of `axis`, which must be one of `axes`.
  void set_size(absl::string_view axis, int n);
  int world_size() const;

  MeshCoord CoordOf(int rank) const;
  int RankOf(const MeshCoord& coord) const;
  // `coord`'s index on `axis`; 0 for an axis the mesh does not have.
  int IndexOn(const MeshCoord& coord, absl::string_view axis) const;

  // Parses "tp=2,pp=2,dp=4[,zero=1][,layers=10/10/12][,order=tp-dp-pp]"
  // for a job whose mesh has the axes `mesh` (slowest first). Missing
  // axes default to 1; order= lists every axis fastest first.
  // INVALID_ARGUMENT names the bad token, and for an unknown axis the
  // axes the job has.
  static absl::StatusOr<ParallelConfig> Parse(
      absl::string_view text,
      const std::vector<std::string>& mesh = DefaultMesh());
  // The inverse of Parse: tp, pp, dp first (as far as the mesh has them),
  // then the other axes in mesh order; omits defaults.
  std::string ToString() const;
  // "pp=0,dp=1,tp=3": a coordinate for messages.
  std::string CoordString(const MeshCoord& coord) const;

  // Checks degrees >= 1, the world size, and (given the model's layer
  // count) that the pipeline can be built.
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
