#include "plan/advisor.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "ptc/families.h"

namespace ptc {
namespace {

ModelSpec Gpt(int hidden = 64) {
  return *BuildModelSpec(*ParseArchitecture(absl::StrCat(
      "gpt:layers=4,hidden=", hidden, ",heads=4,vocab=512,positions=64")));
}

AdvisorInput Input(const ModelSpec& spec, int gpus, int per_host = 2) {
  AdvisorInput in;
  in.spec = &spec;
  in.current = *ParallelConfig::Parse("tp=2,dp=2", spec.mesh);
  in.gpus = gpus;
  in.gpus_per_host = per_host;
  return in;
}

const ConfigCandidate* Find(const std::vector<ConfigCandidate>& c,
                            const std::string& config) {
  for (const ConfigCandidate& x : c)
    if (x.config == config) return &x;
  return nullptr;
}

TEST_CASE("every config of the GPU count, fastest first") {
  const ModelSpec spec = Gpt();
  auto c = EnumerateConfigs(Input(spec, 4), {});
  REQUIRE(c.ok());
  for (const ConfigCandidate& x : *c) {
    CHECK(x.gpus == 4);
    CHECK(x.fits);
  }
  CHECK(Find(*c, "tp=2,pp=1,dp=2") != nullptr);
  CHECK(Find(*c, "tp=1,pp=4,dp=1") != nullptr);
  CHECK(Find(*c, "tp=4,pp=1,dp=1") != nullptr);
  for (size_t i = 1; i < c->size(); ++i)
    CHECK((*c)[i - 1].step_seconds <= (*c)[i].step_seconds);
  // A pipeline has a bubble; a pure data-parallel config does not.
  CHECK(Find(*c, "tp=1,pp=4,dp=1")->bubble_seconds > 0);
  CHECK(Find(*c, "tp=1,pp=1,dp=4")->bubble_seconds == 0);
}

TEST_CASE("a GPU count no config can use falls back to fewer GPUs") {
  // 3 GPUs: heads=4 refuses tp=3; dp=3 and pp=3 run.
  const ModelSpec spec = Gpt();
  auto c = EnumerateConfigs(Input(spec, 3), {});
  REQUIRE(c.ok());
  CHECK(c->front().gpus == 3);
  CHECK(Find(*c, "tp=3,pp=1,dp=1") == nullptr);
  CHECK(Find(*c, "tp=1,pp=1,dp=3")->fits);
  // The global batch 16 is not divisible by dp=3.
  proto::AutoPolicy policy;
  policy.set_global_batch(16);
  c = EnumerateConfigs(Input(spec, 3), policy);
  REQUIRE(c.ok());
  CHECK_FALSE(Find(*c, "tp=1,pp=1,dp=3")->fits);
  CHECK_THAT(Find(*c, "tp=1,pp=1,dp=3")->why_not,
             Catch::Contains("global batch 16"));
  CHECK(c->front().config == "tp=1,pp=3,dp=1");

}

TEST_CASE("memory: state and gradients must fit each GPU") {
  const ModelSpec spec = Gpt(256);
  AdvisorInput in = Input(spec, 4);
  auto all = EnumerateConfigs(in, {});
  REQUIRE(all.ok());
  const ConfigCandidate* dp4 = Find(*all, "tp=1,pp=1,dp=4");
  REQUIRE(dp4 != nullptr);
  // A GPU just too small for a whole replica: dp=4 no longer fits, tp=4
  // (a quarter of the state per GPU) does.
  in.gpu_memory_bytes =
      static_cast<int64_t>(dp4->gpu_bytes_needed / kStateMemoryFraction) - 1;
  auto c = EnumerateConfigs(in, {});
  REQUIRE(c.ok());
  CHECK_FALSE(Find(*c, "tp=1,pp=1,dp=4")->fits);
  CHECK_THAT(Find(*c, "tp=1,pp=1,dp=4")->why_not,
             Catch::Contains("per GPU"));
  CHECK(Find(*c, "tp=4,pp=1,dp=1")->fits);
  CHECK(c->front().fits);
  // Nothing fits on a tiny GPU.
  in.gpu_memory_bytes = 1024;
  auto none = EnumerateConfigs(in, {});
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("the choice: fewest bytes within the margin, else the fastest") {
  std::vector<ConfigCandidate> c(3);
  c[0] = {.config = "a", .fits = true, .step_seconds = 1.0};
  c[1] = {.config = "b", .fits = true, .step_seconds = 1.04};
  c[2] = {.config = "c", .fits = true, .step_seconds = 1.5};
  c[0].bytes_moved = 100;
  c[1].bytes_moved = 10;
  c[2].bytes_moved = 0;  // fewest, but 50% slower: outside the margin
  proto::AutoPolicy policy;
  CHECK(WithinMargin(c, policy) == std::vector<int>{0, 1});
  auto choice = ChooseConfig(c, policy);
  REQUIRE(choice.ok());
  CHECK(choice->index == 1);
  CHECK_THAT(choice->explanation, Catch::Contains("fewest"));
  policy.set_margin(0.01);
  CHECK(ChooseConfig(c, policy)->index == 0);
  policy.set_margin(1.0);
  CHECK(ChooseConfig(c, policy)->index == 2);
  // Recoverability first: within the margin, a config whose placement
  // survives any one host's loss wins over one that moves fewer bytes.
  policy.clear_margin();
  c[0].survives_host_loss = true;
  choice = ChooseConfig(c, policy);
  REQUIRE(choice.ok());
  CHECK(choice->index == 0);
  CHECK_THAT(choice->explanation, Catch::Contains("that survive the loss of any one host"));
  // Outside the margin it does not count.
  c[0].survives_host_loss = false;
  c[2].survives_host_loss = true;
  CHECK(ChooseConfig(c, policy)->index == 1);
  // Nothing planned: no choice.
  for (ConfigCandidate& x : c) x.bytes_moved = -1;
  CHECK_FALSE(ChooseConfig(c, policy).ok());
}

TEST_CASE("a pinned config is the only candidate") {
  const ModelSpec spec = Gpt();
  proto::AutoPolicy policy;
  policy.set_pinned_config("tp=1,pp=2,dp=1");
  auto c = EnumerateConfigs(Input(spec, 4), policy);
  REQUIRE(c.ok());
  REQUIRE(c->size() == 1);
  CHECK(c->front().config == "tp=1,pp=2,dp=1");
  policy.set_pinned_config("tp=2,pp=2,dp=2");
  CHECK(EnumerateConfigs(Input(spec, 4), policy).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  policy.set_pinned_config("tp=3");  // heads=4
  CHECK_FALSE(EnumerateConfigs(Input(spec, 4), policy).ok());
  policy.set_pinned_config("");
  policy.set_max_gpus(2);
  CHECK(EnumerateConfigs(Input(spec, 4), policy)->front().gpus == 2);
}

TEST_CASE("expert parallelism varies too, for a model with experts") {
  const ModelSpec spec = *SpecForModel(
      "moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,experts=4,vocab=512");
  AdvisorInput in;
  in.spec = &spec;
  in.current = *spec.ParseConfig("ep=2,dp=2");
  in.gpus = 4;
  in.gpus_per_host = 4;
  auto c = EnumerateConfigs(in, {});
  REQUIRE(c.ok());
  bool ep4 = false;
  for (const ConfigCandidate& x : *c) {
    CHECK(x.gpus == 4);
    ep4 |= x.config.find("ep=4") != std::string::npos;
  }
  CHECK(ep4);
}

}  // namespace
}  // namespace ptc
