#include "ptc/model_spec.h"

#include "ptc/families.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

int64_t ParamCount(const ModelSpec& spec) {
  int64_t n = 0;
  for (const TensorSpec& t : spec.tensors) {
    // The tied embedding is one tensor held by two stages: counted once.
    if (t.role == Role::kParameter) n += NumElements(t.shape);
  }
  return n;
}

TEST_CASE("model spec: GPT-3 sizes match the paper's parameter counts",
          "[ptc][spec]") {
  struct Want {
    const char* name;
    double billions;
  };
  for (Want w :
       {Want{"gpt3-125m", 0.125}, Want{"gpt3-350m", 0.35},
        Want{"gpt3-760m", 0.76}, Want{"gpt3-1.3b", 1.3}, Want{"gpt3-2.7b", 2.7},
        Want{"gpt3-6.7b", 6.7}, Want{"gpt3-13b", 13}, Want{"gpt3-175b", 175}}) {
    auto arch = ArchitectureByName(w.name);
    REQUIRE(arch.ok());
    auto spec = BuildModelSpec(*arch);
    REQUIRE(spec.ok());
    const double got = ParamCount(*spec) / 1e9;
    INFO(w.name << " has " << got << "B parameters");
    CHECK(got > w.billions * 0.93);
    CHECK(got < w.billions * 1.07);
  }
}

TEST_CASE("model spec: Adam state is three fp32 tensors per parameter",
          "[ptc][spec]") {
  auto spec = BuildModelSpec(*ArchitectureByName("gpt3-125m"));
  REQUIRE(spec.ok());
  const int64_t params = ParamCount(*spec);
  // fp16 weights + fp32 master, exp_avg, exp_avg_sq: 14 bytes per parameter.
  CHECK(spec->TotalBytes() == 14 * params);
  const int i = spec->FindTensor("optim.exp_avg.layers.3.mlp.fc1.weight");
  REQUIRE(i >= 0);
  CHECK(spec->tensors[i].dtype == DType::kFloat32);
  CHECK(spec->tensors[i].role == Role::kOptimizerState);
  CHECK(spec->tensors[spec->tensors[i].slot].key == "layers.3.mlp.fc1.weight");
  CHECK(spec->buffers[spec->tensors[i].buffer].name == "optimizer");
}

TEST_CASE("model spec: Megatron's layouts for GPT layers", "[ptc][spec]") {
  auto spec = BuildModelSpec(*ArchitectureByName("gpt3-350m"));
  REQUIRE(spec.ok());
  auto rule = [&](const char* key) -> const TensorSpec& {
    const int i = spec->FindTensor(key);
    REQUIRE(i >= 0);
    return spec->tensors[i];
  };
  // Rows ordered per head: tp takes whole heads.
  const AxisPlacement& qkv = rule("layers.0.attn.qkv.weight").placements[0];
  CHECK(qkv.kind == AxisPlacement::Kind::kGroupedShard);
  CHECK(qkv.repeats == 16);
  CHECK(rule("layers.0.attn.proj.weight").placements[0].dim == 1);
  CHECK(rule("layers.0.attn.proj.bias").placements.empty());
  CHECK(rule("layers.0.mlp.fc2.weight").placements[0].dim == 1);
  CHECK(rule("layers.0.mlp.norm.weight").placements.empty());
  CHECK(rule("embedding.word.weight").stage.kind ==
        StageRule::Kind::kFirstAndLast);
  CHECK(rule("final_norm.weight").stage.kind == StageRule::Kind::kLast);
}

TEST_CASE("model spec: the padded vocabulary grows with tp as in Megatron",
          "[ptc][spec]") {
  auto arch = ArchitectureByName("gpt3-175b");
  REQUIRE(arch.ok());
  CHECK(PaddedVocab(*arch, 1) == 50304);
  CHECK(PaddedVocab(*arch, 2) == 50432);
  CHECK(PaddedVocab(*arch, 4) == 50688);
  CHECK(PaddedVocab(*arch, 8) == 51200);
  CHECK(PaddedVocab(*arch, 16) == 51200);
}

TEST_CASE("model spec: LLaMA uses grouped splits for GQA and SwiGLU",
          "[ptc][spec]") {
  auto spec = BuildModelSpec(*ArchitectureByName("llama3-8b"));
  REQUIRE(spec.ok());
  const TensorSpec& qkv =
      spec->tensors[spec->FindTensor("layers.0.attn.qkv.weight")];
  CHECK(qkv.placements[0].kind == AxisPlacement::Kind::kGroupedShard);
  CHECK(qkv.placements[0].groups == std::vector<int64_t>{4096, 1024, 1024});
  const TensorSpec& fc1 =
      spec->tensors[spec->FindTensor("layers.0.mlp.fc1.weight")];
  CHECK(fc1.placements[0].groups == std::vector<int64_t>{14336, 14336});
  CHECK(spec->FindTensor("output.weight") >= 0);
  CHECK(spec->FindTensor("layers.0.attn.qkv.bias") < 0);
}

TEST_CASE("model spec: configs that cannot work are rejected with a reason",
          "[ptc][spec]") {
  auto spec = SpecForModel("llama3-8b");  // 32 heads, 8 kv groups
  REQUIRE(spec.ok());
  auto s = CheckConfig(*spec, *ParallelConfig::Parse("tp=16"));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("tp=16 does not divide the 8 heads") !=
        std::string::npos);
  s = CheckConfig(*spec, *ParallelConfig::Parse("tp=3"));
  CHECK(s.message().find("tp=3 does not divide the 32 heads") !=
        std::string::npos);
  s = CheckConfig(*spec, *ParallelConfig::Parse("pp=64"));
  CHECK(s.message().find("pp=64") != std::string::npos);
  CHECK(CheckConfig(*spec, *ParallelConfig::Parse("tp=8,pp=4,dp=2")).ok());
  // Megatron-core's layout counts query groups.
  auto mcore = SpecForModel(
      "llama:layers=2,hidden=64,heads=8,kv_heads=4,ffn=96,mcore=1");
  REQUIRE(mcore.ok());
  s = CheckConfig(*mcore, *ParallelConfig::Parse("tp=8"));
  CHECK(s.message().find("tp=8 does not divide the 4 query groups") !=
        std::string::npos);
}

TEST_CASE("model spec: custom architectures parse and unknown names fail",
          "[ptc][spec]") {
  auto a = ResolveArchitecture(
      "llama:layers=3,hidden=32,heads=4,kv_heads=2,ffn=40,vocab=77");
  REQUIRE(a.ok());
  CHECK(a->layers == 3);
  CHECK(a->kv_heads == 2);
  CHECK(ResolveArchitecture("gpt3-9b").status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(!ResolveArchitecture("gpt:heads=3,hidden=64").ok());
  CHECK(!ResolveArchitecture("gpt:wings=2").ok());
}

TEST_CASE("model spec: mcore=1 follows Megatron-core's parameter order and "
          "bucket defaults",
          "[ptc][spec]") {
  // Megatron-core builds each attention's linear_proj before its
  // linear_qkv; its buffer reverses the order (tests/python/
  // test_layout_spec.py compares whole layouts with Megatron-core's).
  auto spec = SpecForModel("gpt:layers=1,hidden=16,heads=4,vocab=64,mcore=1");
  REQUIRE(spec.ok());
  const int proj = spec->FindTensor("layers.0.attn.proj.weight");
  const int qkv = spec->FindTensor("layers.0.attn.qkv.weight");
  CHECK(spec->FindTensor("layers.0.attn.norm.bias") < proj);
  CHECK(proj < spec->FindTensor("layers.0.attn.proj.bias"));
  CHECK(spec->FindTensor("layers.0.attn.proj.bias") < qkv);
  CHECK(qkv < spec->FindTensor("layers.0.attn.qkv.bias"));
  CHECK(spec->FindTensor("layers.0.attn.qkv.bias") <
        spec->FindTensor("layers.0.mlp.norm.weight"));
  // Megatron-LM's ParallelAttention registers query_key_value first.
  auto lm = SpecForModel("gpt:layers=1,hidden=16,heads=4,vocab=64");
  REQUIRE(lm.ok());
  CHECK(lm->FindTensor("layers.0.attn.qkv.weight") <
        lm->FindTensor("layers.0.attn.proj.weight"));
  // Without overlap_grad_reduce one bucket; with it 40M elements by
  // default; bucket=N is --overlap-grad-reduce --ddp-bucket-size N.
  CHECK(spec->buffers[0].bucket_size == 0);
  CHECK(SpecForModel("gpt:layers=1,hidden=16,heads=4,vocab=64,mcore=1,overlap=1")
            ->buffers[0]
            .bucket_size == 40000000);
  CHECK(SpecForModel("gpt:layers=1,hidden=16,heads=4,vocab=64,mcore=1,bucket=300")
            ->buffers[0]
            .bucket_size == 300);
  CHECK(SpecForModel("gpt:layers=1,hidden=16,heads=4,vocab=64,mcore=1,"
                     "overlap=1,bucket=0")
            ->buffers[0]
            .bucket_size == 0);
  CHECK(SpecForModel("mixtral-8x7b")->buffers[0].bucket_size == 0);
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

TEST_CASE("model spec: MoE families shard experts over ep and state over "
          "dp and ep",
          "[ptc][spec]") {
  auto spec = SpecForModel("mixtral-8x7b");
  REQUIRE(spec.ok());
  CHECK(spec->mesh == std::vector<std::string>{"pp", "dp", "ep", "tp"});
  const TensorSpec& fc1 =
      spec->tensors[spec->FindTensor("layers.0.mlp.experts.fc1.weight")];
  CHECK(fc1.shape == Shape{8, 2 * 14336, 4096});
  CHECK(fc1.placements[0].axes == std::vector<std::string>{"ep"});
  int64_t params = 0;
  for (const TensorSpec& t : spec->tensors)
    if (t.role == Role::kParameter) params += NumElements(t.shape);
  // Mixtral 8x7B has 46.7B parameters.
  CHECK(params > 46.0e9);
  CHECK(params < 47.5e9);
  auto big = SpecForModel("moe-64x-136b");
  REQUIRE(big.ok());
  params = 0;
  for (const TensorSpec& t : big->tensors)
    if (t.role == Role::kParameter) params += NumElements(t.shape);
  CHECK(params > 135e9);
  CHECK(params < 137e9);
  auto s = CheckConfig(*spec, *spec->ParseConfig("ep=3"));
  CHECK(s.message().find("ep=3 does not divide the 8 experts") !=
        std::string::npos);
  // Per-expert tensors and shared experts.
  auto ds = SpecForModel(
      "moe:layers=2,hidden=32,heads=4,kv_heads=2,ffn=24,experts=4,"
      "shared_ffn=48,stacked=0");
  REQUIRE(ds.ok());
  CHECK(ds->FindTensor("layers.1.mlp.experts.3.fc2.weight") >= 0);
  CHECK(ds->FindTensor("layers.1.mlp.shared.fc1.weight") >= 0);
  CHECK(ds->buffers.size() == 2);
}

}  // namespace
}  // namespace ptc
