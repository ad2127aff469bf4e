// The built-in model families as layout-spec generators: GPT-3 (Megatron's
// GPT), LLaMA-style (grouped-query attention, SwiGLU) and MoE (Mixtral-style
// top-k routed experts; DeepSeek-style shared + routed experts). They are
// the only code that knows model families: each turns an architecture's
// numbers into a ModelSpec like any framework's spec file.
//
//   PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecForModel("llama3-8b"));
//   PTC_ASSIGN_OR_RETURN(ModelSpec moe,
//       SpecForModel("moe:layers=4,hidden=64,heads=4,kv_heads=2,ffn=96,"
//                    "experts=8,shared_ffn=128,vocab=1000"));
#ifndef PTC_PTC_FAMILIES_H_
#define PTC_PTC_FAMILIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ptc/dtype.h"
#include "ptc/model_spec.h"

namespace ptc {

struct Architecture {
  enum class Family { kGpt, kLlama, kMoe };
  std::string name;
  Family family = Family::kGpt;
  int layers = 1;
  int64_t hidden = 64;
  int heads = 1;
  int kv_heads = 1;  // == heads for multi-head attention
  int64_t ffn = 256;  // MoE: each routed expert's
  int64_t vocab = 1000;
  int64_t max_positions = 2048;  // GPT: learned position embedding rows
  bool tied_embeddings = true;   // GPT ties input and output embedding
  DType param_dtype = DType::kFloat16;
  // Adds mixed-precision Adam state: fp32 master weight, exp_avg and
  // exp_avg_sq per parameter.
  bool adam = true;
  // Megatron's make_vocab_size_divisible_by.
  int vocab_pad_multiple = 128;
  // MoE: routed experts per layer, the router's top-k (recorded in the
  // name only: it does not change the state), the shared experts' fused
  // ffn width (0: none), and whether experts are one stacked tensor per
  // weight ([experts, ...], sharded over ep) or one tensor per expert.
  int experts = 0;
  int top_k = 2;
  int64_t shared_ffn = 0;
  bool stacked_experts = true;
  // Megatron-core's layout (megatron-core 0.16.1, docs/layout-spec.md
  // cites the source): qkv rows ordered per query group, each attention's
  // linear_proj registered before its linear_qkv, and (under zero=1) the
  // distributed optimizer's param_and_grad_buffer: parameters in reverse
  // order, starts aligned to 64 elements, buckets padded to lcm(dp, 128),
  // the shared embedding in a bucket of its own (first on the last stage),
  // buckets on the first stage only, MoE experts in the dense buffer at
  // ep=1, the padded vocabulary rows in the buffer. Otherwise Megatron-LM's:
  // q|k|v blocks, one unpadded buffer per stage in parameter order.
  bool megatron_core = false;
  // Megatron-core's buckets: with overlap_grad_reduce (--overlap-grad-reduce)
  // buckets of bucket_size elements (--ddp-bucket-size), by default
  // 40,000,000 (Megatron's max(40M, 1M x dp), exact for dp <= 40); without
  // it one bucket. "bucket=N" sets both (N > 0) or neither (0).
  bool overlap_grad_reduce = false;
  int64_t bucket_size = 0;  // 0: Megatron's default

  // The bucket size the buffer uses: 0 for one bucket.
  int64_t mcore_bucket_size() const {
    if (!overlap_grad_reduce) return 0;
    return bucket_size > 0 ? bucket_size : 40000000;
  }

  int64_t head_dim() const { return hidden / heads; }
};

// The GPT-3 paper's family ("gpt3-125m" ... "gpt3-175b"), LLaMA-style
// models ("llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b",
// "llama3-405b") and MoE
// models ("mixtral-8x7b", "mixtral-8x22b", "deepseek-moe-16b",
// "moe-64x-132b"). gpt3-13b uses d_model 5120 (the paper's 5140 does not
// divide into its 40 heads), and gpt3-1.3b 16 heads of 128.
absl::StatusOr<Architecture> ArchitectureByName(absl::string_view name);
std::vector<std::string> KnownModels();

// A custom architecture: "gpt:layers=4,hidden=64,heads=4,ffn=256,vocab=1000",
// "llama:layers=4,hidden=64,heads=8,kv_heads=2,ffn=172,vocab=1000" or
// "moe:...,experts=8,top_k=2,shared_ffn=0,stacked=1"; other keys:
// positions, dtype, adam=0|1, tied=0|1, pad, mcore=0|1, overlap=0|1,
// bucket.
absl::StatusOr<Architecture> ParseArchitecture(absl::string_view text);

// Named model or custom text, whichever `text` is.
absl::StatusOr<Architecture> ResolveArchitecture(absl::string_view text);

// The architecture's spec: parameters in Megatron's order (embedding,
// layers, final norm, output), then with Adam the fp32 master weights,
// exp_avg and exp_avg_sq of every parameter ("optim.<slot>.<param key>"),
// sharded by the optional flat buffers (zero=1). The mesh is pp, dp, tp
// (MoE: pp, dp, ep, tp; experts are replicated over dp, dense weights
// over dp and ep). RNG states derive fresh seeds on new ranks.
absl::StatusOr<ModelSpec> BuildModelSpec(const Architecture& arch);

// ResolveArchitecture, then BuildModelSpec.
absl::StatusOr<ModelSpec> SpecForModel(absl::string_view text);

// Megatron's padded vocabulary for `tp`: vocab rounded up to a multiple of
// vocab_pad_multiple * tp.
int64_t PaddedVocab(const Architecture& arch, int tp);

}  // namespace ptc

#endif  // PTC_PTC_FAMILIES_H_
