// Model specs: every tensor of a training job's state (parameters and Adam
// state) with its global shape, dtype and sharding rule, generated from the
// architecture's numbers alone, so any (TP, PP, DP) can be planned without
// running the model.
//
//   PTC_ASSIGN_OR_RETURN(Architecture arch, ArchitectureByName("gpt3-2.7b"));
//   PTC_ASSIGN_OR_RETURN(ModelSpec spec, BuildModelSpec(arch));
//   PTC_RETURN_IF_ERROR(CheckFits(arch, config));
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

struct TensorSpec {
  // Stable global key, independent of any framework's parameter path,
  // e.g. "layers.3.mlp.fc1.weight" or "optim.exp_avg.layers.3.mlp.fc1.weight".
  std::string key;
  DType dtype = DType::kFloat32;
  Shape shape;
  Role role = Role::kParameter;
  ShardingRule rule;
  // For optimizer state sharded by ZeRO-1: index (in ModelSpec::tensors) of
  // the parameter whose slot in the flat buffer it shares; -1 otherwise.
  int zero_param = -1;

  int64_t bytes() const { return NumElements(shape) * ElementSize(dtype); }
};

struct ModelSpec {
  std::string name;
  int num_layers = 1;
  std::vector<TensorSpec> tensors;
  std::vector<SmallObjectSpec> small_objects;

  int64_t TotalBytes() const;
  // Index of the tensor with `key`, or -1.
  int FindTensor(absl::string_view key) const;
  // Checks every shape and rule; INVALID_ARGUMENT names the tensor.
  absl::Status Validate() const;
};

struct Architecture {
  enum class Family { kGpt, kLlama };
  std::string name;
  Family family = Family::kGpt;
  int layers = 1;
  int64_t hidden = 64;
  int heads = 1;
  int kv_heads = 1;  // == heads for multi-head attention
  int64_t ffn = 256;
  int64_t vocab = 1000;
  int64_t max_positions = 2048;  // GPT: learned position embedding rows
  bool tied_embeddings = true;   // GPT ties input and output embedding
  DType param_dtype = DType::kFloat16;
  // Adds mixed-precision Adam state: fp32 master weight, exp_avg and
  // exp_avg_sq per parameter.
  bool adam = true;
  // Megatron's make_vocab_size_divisible_by.
  int vocab_pad_multiple = 128;

  int64_t head_dim() const { return hidden / heads; }
};

// The GPT-3 paper's family ("gpt3-125m", "gpt3-350m", "gpt3-760m",
// "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b") and
// LLaMA-style models ("llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b").
// gpt3-13b uses d_model 5120 (the paper's table says 5140, which does not
// divide into its 40 heads; Megatron and others use 5120), and gpt3-1.3b
// 16 heads of 128 (the table's 24 heads of 128 do not make d_model 2048).
absl::StatusOr<Architecture> ArchitectureByName(absl::string_view name);
std::vector<std::string> KnownModels();

// A custom architecture: "gpt:layers=4,hidden=64,heads=4,ffn=256,vocab=1000"
// or "llama:layers=4,hidden=64,heads=8,kv_heads=2,ffn=172,vocab=1000";
// other keys: positions, dtype, adam=0|1, tied=0|1.
absl::StatusOr<Architecture> ParseArchitecture(absl::string_view text);

// Named model or custom text, whichever `text` is.
absl::StatusOr<Architecture> ResolveArchitecture(absl::string_view text);

// Every tensor of the model's state: the parameters in Megatron's order
// (embedding, layers, final norm, output), then, with Adam, the fp32
// master weights, exp_avg and exp_avg_sq of every parameter, in the same
// order ("optim.<slot>.<param key>").
absl::StatusOr<ModelSpec> BuildModelSpec(const Architecture& arch);

// Rejects configs the model cannot run with: tp not dividing the heads or
// the kv groups, hidden not divisible by heads, pp larger than the layers,
// malformed layers-per-stage. INVALID_ARGUMENT names the offending value.
absl::Status CheckFits(const Architecture& arch, const ParallelConfig& config);

// Megatron's padded vocabulary for `tp`: vocab rounded up to a multiple of
// vocab_pad_multiple * tp.
int64_t PaddedVocab(const Architecture& arch, int tp);

}  // namespace ptc

#endif  // PTC_PTC_MODEL_SPEC_H_
