// Model specs (layout specs): every tensor of a training job's state with
// its global shape, dtype and placements over the job's named mesh axes,
// the flat buffers that shard some of them by flat range (distributed
// optimizers, ZeRO, FSDP), and the small objects. A spec describes the
// job's state for every mesh size at once: the layout of any parallel
// config follows from the spec and the config alone (BuildLayout).
//
// Specs come from a framework (a proto or JSON file, see
// ptc/layout_spec_proto.h) or from the built-in generators
// (ptc/families.h).
//
//   PTC_RETURN_IF_ERROR(spec.Validate());
//   PTC_ASSIGN_OR_RETURN(ParallelConfig c, spec.ParseConfig("tp=2,ep=4"));
//   PTC_RETURN_IF_ERROR(CheckConfig(spec, c));
#ifndef PTC_PTC_MODEL_SPEC_H_
#define PTC_PTC_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ptc/dtype.h"
#include "ptc/parallel_config.h"
#include "ptc/region.h"
#include "ptc/sharding.h"
#include "ptc/small_object.h"

namespace ptc {

enum class Role { kParameter, kOptimizerState, kDataset, kOther };
absl::string_view RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

struct TensorSpec {
  // Stable global key, independent of any framework's parameter path,
  // e.g. "layers.3.mlp.fc1.weight" or "optim.exp_avg.layers.3.mlp.fc1.weight".
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;
  Role role = Role::kParameter;
  // Cuts over mesh axes, applied in order; axes not named replicate.
  std::vector<AxisPlacement> placements;
  // Which pipeline stages hold it.
  StageRule stage;
  // Index (in ModelSpec::buffers) of the flat buffer this tensor is
  // sharded by, or -1. When the buffer is in use, the tensor's regions on
  // a rank are the flat ranges of the buffer that the rank owns, taken
  // from the local shard its `slot` would have.
  int buffer = -1;
  // Index (in ModelSpec::tensors) of the buffer entry whose place in the
  // buffer this tensor shares (a parameter for its Adam state; itself for
  // FSDP-style flat parameters); -1 when buffer is -1. The slot's
  // placements and stage apply to this tensor.
  int slot = -1;

  int64_t bytes() const { return NumElements(shape) * ElementSize(dtype); }
};

// A flat buffer: the local shards of `entries` (each region row-major, in
// order) concatenated, each entry's start rounded up to `align` elements,
// cut into buckets, and each bucket split over the buffer's axes in
// contiguous chunks. One buffer instance exists per group of ranks that
// agree on every axis but the buffer's; entries must not be cut by those
// axes. This states Megatron-core's param_and_grad_buffer with the
// distributed optimizer (entries in reverse order, align 64, bucket_size,
// bucket_pad 128), ZeRO-1/2 (one bucket, no padding) and FSDP-style flat
// parameters (members are the entries themselves).
struct FlatBuffer {
  enum class OwnBucket { kNever, kAlways, kWhenShared };
  struct Entry {
    int tensor = 0;  // index in ModelSpec::tensors
    // kAlways: the entry gets a bucket of its own; kWhenShared: only when
    // more than one pipeline stage holds it (Megatron's shared embedding).
    OwnBucket own_bucket = OwnBucket::kNever;
    // On the pipeline stages after the first, the entry comes first in the
    // buffer, before the entries listed ahead of it (Megatron-core's tied
    // output weight, last in the last stage's module order, so first in
    // its reversed buffer). false: its listed place on every stage.
    bool first_on_later_stages = false;
    // In a buffer that joins another (`join`): index in ModelSpec::tensors
    // of the other buffer's entry this entry goes just before when joined;
    // -1: after its last entry.
    int join_before = -1;
    // The entry takes the room of its padded local shard: the rows that a
    // `shard` placement's pad_multiple adds (Megatron's padded vocabulary)
    // count in the buffer, after the real rows of each region. The tensor
    // must have such a placement on dimension 0 and no other placement
    // cutting dimension 0. false: only the real elements take room.
    bool with_padding = false;
  };
  std::string name;
  // Mesh axes the buffer is sharded over, jointly (first slowest).
  std::vector<std::string> axes;
  std::vector<Entry> entries;
  // Entry starts are multiples of `align` elements (>= 1).
  int64_t align = 1;
  // A bucket closes once it holds at least bucket_size elements; 0: one
  // bucket for the whole buffer.
  int64_t bucket_size = 0;
  // bucket_size applies on the first pipeline stage only; later stages
  // have one bucket (apart from own_bucket entries), as Megatron-core
  // gives stages with pp rank > 0 no bucket size. false: every stage.
  bool bucket_first_stage_only = false;
  // > 0: each bucket's end is padded to a multiple of lcm(shards,
  // bucket_pad) so that it splits evenly; 0: no padding, chunks may differ
  // by one element.
  int64_t bucket_pad = 0;
  // Only in use under a config with zero=1 (otherwise members follow
  // their own placements, replicated over the buffer's axes).
  bool optional = false;
  // Index in ModelSpec::buffers of the buffer this one joins, or -1. Under
  // a config where every axis of `join_when_size_one` has size 1, this
  // buffer has no instance of its own: its entries are laid out in buffer
  // `join` (each before its `join_before` entry, entries with the same
  // one in listed order), and its members are cut by that buffer's
  // instance. (Megatron-core's experts at ep=1, which are dense
  // parameters, interleaved in module order.)
  int join = -1;
  std::vector<std::string> join_when_size_one;
};

struct ModelSpec {
  // Version of the spec format this spec was written in.
  static constexpr int kFormatVersion = 1;

  std::string name;
  // Mesh axes, slowest-varying first in rank order (e.g. pp, dp, ep, tp).
  std::vector<std::string> mesh = DefaultMesh();
  int num_layers = 1;
  std::vector<TensorSpec> tensors;
  std::vector<FlatBuffer> buffers;
  std::vector<SmallObjectSpec> small_objects;

  int64_t TotalBytes() const;
  // Index of the tensor with `key`, or -1.
  int FindTensor(absl::string_view key) const;
  // Checks every field: mesh axes, shapes, placements, stage rules,
  // buffers and small objects. INVALID_ARGUMENT names the tensor or field.
  absl::Status Validate() const;
  // Parses a parallel config for this spec's mesh.
  absl::StatusOr<ParallelConfig> ParseConfig(absl::string_view text) const;
};

// Rejects configs the spec cannot run with: a mesh other than the spec's,
// more stages than layers, an explicit stage the pipeline lacks, an axis
// that must divide a dimension and does not. INVALID_ARGUMENT names the
// tensor or axis.
absl::Status CheckConfig(const ModelSpec& spec, const ParallelConfig& config);

}  // namespace ptc

#endif  // PTC_PTC_MODEL_SPEC_H_
