#include "ptc/model_spec.h"

#include <map>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace ptc {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kParameter:
      return "parameter";
    case Role::kOptimizerState:
      return "optimizer_state";
    case Role::kDataset:
      return "dataset";
    case Role::kOther:
      return "other";
  }
  return "?";
}

int64_t ModelSpec::TotalBytes() const {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.bytes();
  return total;
}

int ModelSpec::FindTensor(absl::string_view key) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].key == key) return static_cast<int>(i);
  }
  return -1;
}

absl::Status ModelSpec::Validate() const {
  for (const TensorSpec& t : tensors) {
    for (int64_t e : t.shape) {
      if (e < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.key, "' has a negative extent in shape [",
            absl::StrJoin(t.shape, ", "), "]"));
      }
    }
    PTC_RETURN_IF_ERROR(ValidateRule(t.rule, t.shape, t.key));
    if (t.rule.stage.kind == StageRule::Kind::kLayer &&
        (t.rule.stage.layer < 0 || t.rule.stage.layer >= num_layers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.key, "' belongs to layer ", t.rule.stage.layer,
          " but the model has ", num_layers, " layers"));
    }
  }
  return absl::OkStatus();
}

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
                   "gpt:layers=4,hidden=64,heads=4,ffn=256,vocab=1000)"));
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
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom model '", text, "' must start with 'gpt:' or 'llama:'"));
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
    if (!absl::SimpleAtoi(p.second, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value in '", kv, "' of custom model '", text, "'"));
    }
    if (p.first == "layers")
      a.layers = static_cast<int>(v);
    else if (p.first == "hidden")
      a.hidden = v;
    else if (p.first == "heads")
      a.heads = static_cast<int>(v);
    else if (p.first == "kv_heads")
      a.kv_heads = static_cast<int>(v);
    else if (p.first == "ffn") {
      a.ffn = v;
      ffn_given = true;
    } else if (p.first == "vocab")
      a.vocab = v;
    else if (p.first == "positions")
      a.max_positions = v;
    else if (p.first == "adam")
      a.adam = v != 0;
    else if (p.first == "tied")
      a.tied_embeddings = v != 0;
    else if (p.first == "pad")
      a.vocab_pad_multiple = static_cast<int>(v);
    else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", p.first, "' in custom model '", text,
          "'; expected layers, hidden, heads, kv_heads, ffn, vocab, "
          "positions, dtype, adam, tied, pad"));
    }
  }
  if (a.family == Architecture::Family::kGpt) {
    a.kv_heads = a.heads;
    if (!ffn_given) a.ffn = 4 * a.hidden;
  }
  if (a.layers < 1 || a.hidden < 1 || a.heads < 1 || a.kv_heads < 1 ||
      a.vocab < 1 || a.vocab_pad_multiple < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "custom model '", text,
        "': layers, hidden, heads, kv_heads, vocab and pad must be >= 1"));
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

absl::Status CheckFits(const Architecture& arch, const ParallelConfig& config) {
  PTC_RETURN_IF_ERROR(config.Validate(arch.layers));
  if (arch.heads % config.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp=", config.tp, " does not divide the ", arch.heads,
                     " attention heads of ", arch.name,
                     "; choose a tp that divides the head count"));
  }
  if (arch.kv_heads % config.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp=", config.tp, " does not divide the ", arch.kv_heads,
        " key/value groups of ", arch.name,
        "; with grouped-query attention tp must divide the kv heads"));
  }
  return absl::OkStatus();
}

namespace {

void AddParam(ModelSpec* spec, const Architecture& arch, std::string key,
              Shape shape, AxisRule tp, StageRule stage) {
  TensorSpec t;
  t.key = std::move(key);
  t.dtype = arch.param_dtype;
  t.shape = std::move(shape);
  t.role = Role::kParameter;
  t.rule.tp = std::move(tp);
  t.rule.stage = stage;
  spec->tensors.push_back(std::move(t));
}

}  // namespace

absl::StatusOr<ModelSpec> BuildModelSpec(const Architecture& arch) {
  ModelSpec spec;
  spec.name = arch.name;
  spec.num_layers = arch.layers;
  const int64_t h = arch.hidden, d = arch.head_dim();
  const bool gpt = arch.family == Architecture::Family::kGpt;
  const AxisRule rep = AxisRule::Replicate();
  const AxisRule col = AxisRule::Split(0), row = AxisRule::Split(1);

  // Word embedding: vocab-parallel over the padded vocabulary; tied
  // embeddings keep a copy on the last stage for the output layer.
  AddParam(
      &spec, arch, "embedding.word.weight", {arch.vocab, h},
      AxisRule::Split(0, arch.vocab_pad_multiple),
      arch.tied_embeddings ? StageRule::FirstAndLast() : StageRule::First());
  if (gpt && arch.max_positions > 0) {
    AddParam(&spec, arch, "embedding.position.weight", {arch.max_positions, h},
             rep, StageRule::First());
  }
  for (int l = 0; l < arch.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    const StageRule st = StageRule::Layer(l);
    AddParam(&spec, arch, p + "attn.norm.weight", {h}, rep, st);
    if (gpt) AddParam(&spec, arch, p + "attn.norm.bias", {h}, rep, st);
    if (gpt) {
      // Megatron interleaves q, k, v per head: a contiguous split of dim 0
      // gives each tp rank whole heads.
      AddParam(&spec, arch, p + "attn.qkv.weight", {3 * h, h}, col, st);
      AddParam(&spec, arch, p + "attn.qkv.bias", {3 * h}, col, st);
    } else {
      // q, k and v stored as separate blocks: each split on its own.
      const int64_t q = arch.heads * d, kv = arch.kv_heads * d;
      AddParam(&spec, arch, p + "attn.qkv.weight", {q + 2 * kv, h},
               AxisRule::GroupedSplit(0, {q, kv, kv}), st);
    }
    AddParam(&spec, arch, p + "attn.proj.weight", {h, arch.heads * d}, row, st);
    if (gpt) AddParam(&spec, arch, p + "attn.proj.bias", {h}, rep, st);
    AddParam(&spec, arch, p + "mlp.norm.weight", {h}, rep, st);
    if (gpt) AddParam(&spec, arch, p + "mlp.norm.bias", {h}, rep, st);
    if (gpt) {
      AddParam(&spec, arch, p + "mlp.fc1.weight", {arch.ffn, h}, col, st);
      AddParam(&spec, arch, p + "mlp.fc1.bias", {arch.ffn}, col, st);
    } else {
      // SwiGLU: fc1 holds [gate; up]; each tp rank owns a slice of both.
      AddParam(&spec, arch, p + "mlp.fc1.weight", {2 * arch.ffn, h},
               AxisRule::GroupedSplit(0, {arch.ffn, arch.ffn}), st);
    }
    AddParam(&spec, arch, p + "mlp.fc2.weight", {h, arch.ffn}, row, st);
    if (gpt) AddParam(&spec, arch, p + "mlp.fc2.bias", {h}, rep, st);
  }
  AddParam(&spec, arch, "final_norm.weight", {h}, rep, StageRule::Last());
  if (gpt)
    AddParam(&spec, arch, "final_norm.bias", {h}, rep, StageRule::Last());
  if (!arch.tied_embeddings) {
    AddParam(&spec, arch, "output.weight", {arch.vocab, h},
             AxisRule::Split(0, arch.vocab_pad_multiple), StageRule::Last());
  }

  if (arch.adam) {
    const int num_params = static_cast<int>(spec.tensors.size());
    for (const char* slot : {"master", "exp_avg", "exp_avg_sq"}) {
      for (int i = 0; i < num_params; ++i) {
        TensorSpec t = spec.tensors[i];
        t.key = absl::StrCat("optim.", slot, ".", spec.tensors[i].key);
        t.dtype = DType::kFloat32;
        t.role = Role::kOptimizerState;
        t.zero_param = i;
        spec.tensors.push_back(std::move(t));
      }
    }
  }
  spec.small_objects = {
      {"iteration", SmallObjectScope::kGlobal, 8},
      {"lr_scheduler", SmallObjectScope::kGlobal, 64},
      {"data_cursor", SmallObjectScope::kGlobal, 32},
      {"rng.model_parallel", SmallObjectScope::kTpRank, 16},
      {"rng.default", SmallObjectScope::kRank, 5056},
  };
  PTC_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

}  // namespace ptc
