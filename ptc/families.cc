#include "ptc/families.h"

#include <algorithm>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

Architecture Gpt3(const char* name, int layers, int64_t hidden, int heads) {
  Architecture a;
  a.name = name;
  a.family = Architecture::Family::kGpt;
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = heads;
  a.ffn = 4 * hidden;
  a.vocab = 50257;
  a.max_positions = 2048;
  a.tied_embeddings = true;
  a.param_dtype = DType::kFloat16;
  return a;
}

Architecture Llama(const char* name, int layers, int64_t hidden, int heads,
                   int kv_heads, int64_t ffn, int64_t vocab) {
  Architecture a;
  a.name = name;
  a.family = Architecture::Family::kLlama;
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.ffn = ffn;
  a.vocab = vocab;
  a.max_positions = 0;  // rotary positions: no table
  a.tied_embeddings = false;
  a.param_dtype = DType::kBFloat16;
  return a;
}

Architecture Moe(const char* name, int layers, int64_t hidden, int heads,
                 int kv_heads, int64_t ffn, int experts, int top_k,
                 int64_t shared_ffn, int64_t vocab) {
  Architecture a = Llama(name, layers, hidden, heads, kv_heads, ffn, vocab);
  a.family = Architecture::Family::kMoe;
  a.experts = experts;
  a.top_k = top_k;
  a.shared_ffn = shared_ffn;
  a.megatron_core = true;
  return a;
}

const std::vector<Architecture>& Known() {
  static const std::vector<Architecture>* known = new std::vector<Architecture>{
      Gpt3("gpt3-125m", 12, 768, 12),
      Gpt3("gpt3-350m", 24, 1024, 16),
      Gpt3("gpt3-760m", 24, 1536, 16),
      Gpt3("gpt3-1.3b", 24, 2048, 16),
      Gpt3("gpt3-2.7b", 32, 2560, 32),
      Gpt3("gpt3-6.7b", 32, 4096, 32),
      Gpt3("gpt3-13b", 40, 5120, 40),
      Gpt3("gpt3-175b", 96, 12288, 96),
      Llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
      Llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
      Llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
      Llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
      Llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
      Moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 8, 2, 0, 32000),
      Moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 8, 2, 0, 32768),
      // Every layer routed (the released model's first layer is dense).
      Moe("deepseek-moe-16b", 28, 2048, 16, 16, 1408, 64, 6, 2816, 102400),
      // The benchmark's model: 64 experts, top-2, 136B parameters.
      Moe("moe-64x-136b", 24, 4096, 32, 8, 7168, 64, 2, 0, 32000),
  };
  return *known;
}

}  // namespace

std::vector<std::string> KnownModels() {
  std::vector<std::string> names;
  for (const Architecture& a : Known()) names.push_back(a.name);
  return names;
}

absl::StatusOr<Architecture> ArchitectureByName(absl::string_view name) {
  for (const Architecture& a : Known()) {
    if (a.name == name) return a;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model '", name,
                   "'; known models: ", absl::StrJoin(KnownModels(), ", "),
                   " (or a custom one, e.g. "
                   "gpt:layers=4,hidden=64,heads=4,ffn=256,vocab=1000, or a "
                   "layout spec file)"));
}

absl::StatusOr<Architecture> ParseArchitecture(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> fam =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  Architecture a;
  if (fam.first == "gpt") {
    a = Gpt3("gpt", 2, 64, 4);
    a.vocab = 1000;
    a.max_positions = 128;
  } else if (fam.first == "llama") {
    a = Llama("llama", 2, 64, 4, 2, 172, 1000);
  } else if (fam.first == "moe") {
    a = Moe("moe", 2, 64, 4, 2, 96, 8, 2, 0, 1000);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom model '", text, "' must start with 'gpt:', 'llama:' or 'moe:'"));
  }
  a.name = std::string(text);
  bool ffn_given = false;
  for (absl::string_view kv :
       absl::StrSplit(fam.second, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p =
        absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first == "dtype") {
      PTC_ASSIGN_OR_RETURN(a.param_dtype, ParseDType(p.second));
      continue;
    }
    int64_t v;
    if (!absl::SimpleAtoi(p.second, &v) || v < 0 || v > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value in '", kv, "' of custom model '", text, "'"));
    }
    const int small = static_cast<int>(std::min<int64_t>(v, 1 << 30));
    if (p.first == "layers") {
      a.layers = small;
    } else if (p.first == "hidden") {
      a.hidden = v;
    } else if (p.first == "heads") {
      a.heads = small;
    } else if (p.first == "kv_heads") {
      a.kv_heads = small;
    } else if (p.first == "ffn") {
      a.ffn = v;
      ffn_given = true;
    } else if (p.first == "vocab") {
      a.vocab = v;
    } else if (p.first == "positions") {
      a.max_positions = v;
    } else if (p.first == "adam") {
      a.adam = v != 0;
    } else if (p.first == "tied") {
      a.tied_embeddings = v != 0;
    } else if (p.first == "pad") {
      a.vocab_pad_multiple = small;
    } else if (p.first == "mcore") {
      a.megatron_core = v != 0;
    } else if (p.first == "overlap") {
      a.overlap_grad_reduce = v != 0;
    } else if (p.first == "bucket") {
      // --overlap-grad-reduce --ddp-bucket-size N; 0: one bucket.
      a.bucket_size = v;
      a.overlap_grad_reduce = v > 0;
    } else if (p.first == "experts" && a.family == Architecture::Family::kMoe) {
      a.experts = small;
    } else if (p.first == "top_k" && a.family == Architecture::Family::kMoe) {
      a.top_k = small;
    } else if (p.first == "shared_ffn" &&
               a.family == Architecture::Family::kMoe) {
      a.shared_ffn = v;
    } else if (p.first == "stacked" && a.family == Architecture::Family::kMoe) {
      a.stacked_experts = v != 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", p.first, "' in custom model '", text,
          "'; expected layers, hidden, heads, kv_heads, ffn, vocab, "
          "positions, dtype, adam, tied, pad, mcore, overlap, bucket (moe: "
          "experts, top_k, shared_ffn, stacked)"));
    }
  }
  if (a.family == Architecture::Family::kGpt) {
    a.kv_heads = a.heads;
    if (!ffn_given) a.ffn = 4 * a.hidden;
  }
  if (a.layers < 1 || a.hidden < 1 || a.heads < 1 || a.kv_heads < 1 ||
      a.vocab < 1 || a.vocab_pad_multiple < 1 ||
      (a.family == Architecture::Family::kMoe && a.experts < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom model '", text,
        "': layers, hidden, heads, kv_heads, vocab, pad (and experts) must "
        "be >= 1"));
  }
  if (a.layers > 4096 || a.experts > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom model '", text, "': at most 4096 layers and 4096 experts"));
  }
  if (a.hidden % a.heads != 0 || a.heads % a.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("custom model '", text, "': hidden (", a.hidden,
                     ") must divide by heads (", a.heads,
                     ") and heads by kv_heads (", a.kv_heads, ")"));
  }
  return a;
}

absl::StatusOr<Architecture> ResolveArchitecture(absl::string_view text) {
  if (absl::StrContains(text, ':')) return ParseArchitecture(text);
  return ArchitectureByName(text);
}

int64_t PaddedVocab(const Architecture& arch, int tp) {
  const int64_t m = static_cast<int64_t>(arch.vocab_pad_multiple) * tp;
  return (arch.vocab + m - 1) / m * m;
}

namespace {

using Axes = std::vector<std::string>;

class Generator {
 public:
  explicit Generator(const Architecture& arch) : arch_(arch) {
    spec_.name = arch.name;
    spec_.num_layers = arch.layers;
    if (arch.family == Architecture::Family::kMoe) {
      spec_.mesh = {"pp", "dp", "ep", "tp"};
    }
  }

  ModelSpec Build() {
    Embedding();
    for (int l = 0; l < arch_.layers; ++l) Layer(l);
    Output();
    if (arch_.adam) Optimizer();
    SmallObjects();
    return std::move(spec_);
  }

 private:
  bool gpt() const { return arch_.family == Architecture::Family::kGpt; }
  bool moe() const { return arch_.family == Architecture::Family::kMoe; }

  void Add(std::string key, Shape shape, std::vector<AxisPlacement> placements,
           StageRule stage, bool expert = false) {
    TensorSpec t;
    t.key = std::move(key);
    t.dtype = arch_.param_dtype;
    t.shape = std::move(shape);
    t.role = Role::kParameter;
    t.placements = std::move(placements);
    t.stage = std::move(stage);
    (expert ? expert_params_ : dense_params_)
        .push_back(static_cast<int>(spec_.tensors.size()));
    spec_.tensors.push_back(std::move(t));
  }

  static AxisPlacement Tp(int dim) { return AxisPlacement::Shard({"tp"}, dim); }
  // [gate; up] or q|k|v: each group chunked over tp on its own.
  static AxisPlacement TpGroups(int dim, std::vector<int64_t> groups,
                            int64_t unit, const char* what) {
    AxisPlacement p = AxisPlacement::GroupedShard({"tp"}, dim, std::move(groups));
    if (unit > 0) p.Even(unit, what);
    return p;
  }

  void Embedding() {
    // Vocab-parallel over the padded vocabulary; tied embeddings keep a
    // copy on the last stage for the output layer.
    Add("embedding.word.weight", {arch_.vocab, arch_.hidden},
        {AxisPlacement::Shard({"tp"}, 0, arch_.vocab_pad_multiple)},
        arch_.tied_embeddings ? StageRule::FirstAndLast() : StageRule::First());
    if (gpt() && arch_.max_positions > 0) {
      Add("embedding.position.weight", {arch_.max_positions, arch_.hidden}, {},
          StageRule::First());
    }
  }

  void Attention(const std::string& p, const StageRule& st) {
    const int64_t h = arch_.hidden, d = arch_.head_dim();
    Add(p + "attn.norm.weight", {h}, {}, st);
    if (gpt()) Add(p + "attn.norm.bias", {h}, {}, st);
    // Megatron-core's Attention.__init__ builds linear_proj before
    // SelfAttention.__init__ builds linear_qkv (attention.py:349, 1267), so
    // proj precedes qkv in its parameter order; Megatron-LM's legacy
    // ParallelAttention registers query_key_value first
    // (megatron/legacy/model/transformer.py:573, 616).
    if (arch_.megatron_core) Proj(p, st);
    const int64_t q = arch_.heads * d, kv = arch_.kv_heads * d;
    if (gpt()) {
      // Megatron's GPT orders the rows per head (q_h, k_h, v_h): tp takes
      // whole heads.
      AxisPlacement qkv =
          AxisPlacement::GroupedShard({"tp"}, 0, {d, d, d}, arch_.heads);
      qkv.Even(1, "attention heads");
      Add(p + "attn.qkv.weight", {3 * h, h}, {qkv}, st);
      Add(p + "attn.qkv.bias", {3 * h}, {qkv}, st);
    } else if (arch_.megatron_core) {
      // Megatron-core orders the rows per query group: the group's q
      // heads, then its k and v; tp takes whole groups.
      AxisPlacement qkv = AxisPlacement::GroupedShard(
          {"tp"}, 0, {q / arch_.kv_heads, d, d}, arch_.kv_heads);
      qkv.Even(1, "query groups");
      Add(p + "attn.qkv.weight", {q + 2 * kv, h}, {qkv}, st);
    } else {
      // q, k and v stored as separate blocks, each split on its own.
      Add(p + "attn.qkv.weight", {q + 2 * kv, h},
          {TpGroups(0, {q, kv, kv}, d, "heads")}, st);
    }
    if (!arch_.megatron_core) Proj(p, st);
  }

  void Proj(const std::string& p, const StageRule& st) {
    const int64_t h = arch_.hidden, q = arch_.heads * arch_.head_dim();
    Add(p + "attn.proj.weight", {h, q},
        {AxisPlacement::Shard({"tp"}, 1).Even(arch_.head_dim(), "attention heads")},
        st);
    if (gpt()) Add(p + "attn.proj.bias", {h}, {}, st);
  }

  void Mlp(const std::string& p, const StageRule& st) {
    const int64_t h = arch_.hidden;
    Add(p + "mlp.norm.weight", {h}, {}, st);
    if (gpt()) {
      Add(p + "mlp.norm.bias", {h}, {}, st);
      Add(p + "mlp.fc1.weight", {arch_.ffn, h}, {Tp(0)}, st);
      Add(p + "mlp.fc1.bias", {arch_.ffn}, {Tp(0)}, st);
      Add(p + "mlp.fc2.weight", {h, arch_.ffn}, {Tp(1)}, st);
      Add(p + "mlp.fc2.bias", {h}, {}, st);
      return;
    }
    if (!moe()) {
      // SwiGLU: fc1 holds [gate; up]; each tp rank owns a slice of both.
      Add(p + "mlp.fc1.weight", {2 * arch_.ffn, h},
          {TpGroups(0, {arch_.ffn, arch_.ffn}, 0, "")}, st);
      Add(p + "mlp.fc2.weight", {h, arch_.ffn}, {Tp(1)}, st);
      return;
    }
    const int64_t e = arch_.experts, f = arch_.ffn;
    const int router = static_cast<int>(spec_.tensors.size());
    Add(p + "mlp.router.weight", {e, h}, {}, st);
    const size_t first_expert = expert_params_.size();
    if (arch_.stacked_experts) {
      // [experts, ...]: ep takes whole experts, tp cuts inside each.
      AxisPlacement ep = AxisPlacement::Shard({"ep"}, 0).Even(1, "experts");
      Add(p + "mlp.experts.fc1.weight", {e, 2 * f, h},
          {ep, TpGroups(1, {f, f}, 0, "")}, st, /*expert=*/true);
      Add(p + "mlp.experts.fc2.weight", {e, h, f}, {ep, Tp(2)}, st,
          /*expert=*/true);
    } else {
      for (int x = 0; x < e; ++x) {
        AxisPlacement ep = AxisPlacement::Select({"ep"}, x, e).Even(1, "experts");
        const std::string k = absl::StrCat(p, "mlp.experts.", x, ".");
        Add(k + "fc1.weight", {2 * f, h}, {ep, TpGroups(0, {f, f}, 0, "")}, st,
            /*expert=*/true);
        Add(k + "fc2.weight", {h, f}, {ep, Tp(1)}, st, /*expert=*/true);
      }
    }
    for (size_t i = first_expert; i < expert_params_.size(); ++i)
      router_of_[expert_params_[i]] = router;
    if (arch_.shared_ffn > 0) {
      const int64_t s = arch_.shared_ffn;
      Add(p + "mlp.shared.fc1.weight", {2 * s, h},
          {TpGroups(0, {s, s}, 0, "")}, st);
      Add(p + "mlp.shared.fc2.weight", {h, s}, {Tp(1)}, st);
    }
  }

  void Layer(int l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    const StageRule st = StageRule::Layer(l);
    Attention(p, st);
    Mlp(p, st);
  }

  void Output() {
    const int64_t h = arch_.hidden;
    Add("final_norm.weight", {h}, {}, StageRule::Last());
    if (gpt()) Add("final_norm.bias", {h}, {}, StageRule::Last());
    if (!arch_.tied_embeddings) {
      Add("output.weight", {arch_.vocab, h},
          {AxisPlacement::Shard({"tp"}, 0, arch_.vocab_pad_multiple)},
          StageRule::Last());
    }
  }

  // The optimizer's flat buffer over `axes` for `params`, and its fp32
  // state tensors as members.
  void Buffer(const std::string& name, Axes axes,
              const std::vector<int>& params) {
    if (params.empty()) return;
    FlatBuffer buf;
    buf.name = name;
    buf.axes = std::move(axes);
    buf.optional = true;
    std::vector<int> order = params;
    if (arch_.megatron_core) {
      std::reverse(order.begin(), order.end());
      buf.align = 64;
      buf.bucket_size = arch_.mcore_bucket_size();
      buf.bucket_pad = 128;
      // distributed_data_parallel.py:101-102: stages with pp rank > 0 get
      // no bucket size.
      buf.bucket_first_stage_only = true;
    }
    for (int t : order) {
      FlatBuffer::Entry e{t, FlatBuffer::OwnBucket::kNever};
      // The vocabulary is padded to a multiple of 128 x tp
      // (megatron/training/tokenizer/tokenizer.py:117) and each tp rank's
      // embedding and output weight hold padded_vocab / tp rows
      // (tensor_parallel/layers.py:230,234), padding included.
      const std::string& key = spec_.tensors[t].key;
      if (arch_.megatron_core &&
          (key == "embedding.word.weight" || key == "output.weight")) {
        e.with_padding = true;
      }
      if (arch_.megatron_core && arch_.tied_embeddings &&
          spec_.tensors[t].key == "embedding.word.weight") {
        e.own_bucket = FlatBuffer::OwnBucket::kWhenShared;
        // The last stage's copy is output_layer.weight, last in its module
        // order, so first in its reversed buffer.
        e.first_on_later_stages = true;
      }
      buf.entries.push_back(e);
    }
    const int b = static_cast<int>(spec_.buffers.size());
    spec_.buffers.push_back(std::move(buf));
    for (const char* slot : {"master", "exp_avg", "exp_avg_sq"}) {
      for (int i : params) {
        TensorSpec t = spec_.tensors[i];
        t.key = absl::StrCat("optim.", slot, ".", spec_.tensors[i].key);
        t.dtype = DType::kFloat32;
        t.role = Role::kOptimizerState;
        t.buffer = b;
        t.slot = i;
        spec_.tensors.push_back(std::move(t));
      }
    }
  }

  void Optimizer() {
    // Dense weights are replicated over dp (and ep): their state shards
    // over both; experts' over dp (expert data parallelism).
    Buffer("optimizer", moe() ? Axes{"dp", "ep"} : Axes{"dp"}, dense_params_);
    Buffer("optimizer.experts", {"dp"}, expert_params_);
    if (arch_.megatron_core && !expert_params_.empty()) {
      // At ep=1 Megatron-core's experts are dense parameters
      // (transformer/moe/experts.py:89,203-204 set allreduce False only
      // when ep > 1), in the dense buffer in module order
      // (distributed_data_parallel.py:122,292): between the layer's
      // router and its shared experts, so before the router reversed.
      FlatBuffer& experts = spec_.buffers.back();
      experts.join = 0;
      experts.join_when_size_one = {"ep"};
      for (FlatBuffer::Entry& e : experts.entries)
        e.join_before = router_of_.at(e.tensor);
    }
  }

  void SmallObjects() {
    const Axes& mesh = spec_.mesh;
    spec_.small_objects = {
        {"iteration", {}, NewRankRule::kCopy, 8},
        {"lr_scheduler", {}, NewRankRule::kCopy, 64},
        {"data_cursor", {}, NewRankRule::kCopy, 32},
        {"rng.model_parallel", {"pp", "tp"}, NewRankRule::kDerive, 16},
        {"rng.default", mesh, NewRankRule::kDerive, 5056},
    };
    if (moe()) {
      spec_.small_objects.push_back(
          {"rng.expert_parallel", {"pp", "ep", "tp"}, NewRankRule::kDerive, 16});
    }
  }

  const Architecture& arch_;
  ModelSpec spec_;
  std::vector<int> dense_params_, expert_params_;
  std::map<int, int> router_of_;  // expert parameter -> its layer's router
};

}  // namespace

absl::StatusOr<ModelSpec> BuildModelSpec(const Architecture& arch) {
  ModelSpec spec = Generator(arch).Build();
  PTC_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

absl::StatusOr<ModelSpec> SpecForModel(absl::string_view text) {
  PTC_ASSIGN_OR_RETURN(Architecture arch, ResolveArchitecture(text));
  return BuildModelSpec(arch);
}

}  // namespace ptc
