#include "ptc/sharding.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

ParallelConfig Config(const char* text) { return *ParallelConfig::Parse(text); }

MeshCoord At(int pp, int dp, int tp) {
  MeshCoord m;
  m.index = {pp, dp, tp};
  return m;
}

std::vector<Region> Regions(const AxisPlacement& p, const Shape& shape,
                            const ParallelConfig& c, const MeshCoord& at,
                            StageRule stage = StageRule::All(),
                            int layers = 1) {
  return RegionsOf({p}, stage, shape, c, layers, at);
}

TEST_CASE("sharding: column and row shards cut the right dimension",
          "[ptc][sharding]") {
  const ParallelConfig c = Config("tp=4");
  CHECK(Regions(AxisPlacement::Shard({"tp"}, 0), {16, 8}, c, At(0, 0, 1)) ==
        std::vector<Region>{Region{{4, 8}, {0, 8}}});
  CHECK(Regions(AxisPlacement::Shard({"tp"}, 1), {16, 8}, c, At(0, 0, 3)) ==
        std::vector<Region>{Region{{0, 16}, {6, 8}}});
}

TEST_CASE("sharding: uneven shards follow chunk semantics", "[ptc][sharding]") {
  const AxisPlacement r = AxisPlacement::Shard({"tp"}, 0);
  const ParallelConfig c = Config("tp=3");
  CHECK(Regions(r, {10}, c, At(0, 0, 0))[0] == Region{{0, 4}});
  CHECK(Regions(r, {10}, c, At(0, 0, 2))[0] == Region{{7, 10}});
  // More ranks than rows: the last ranks hold nothing.
  CHECK(Regions(r, {2}, c, At(0, 0, 2)).empty());
}

TEST_CASE("sharding: grouped shard gives a region per group (GQA, SwiGLU)",
          "[ptc][sharding]") {
  // q = 8 rows, k = v = 4 rows; tp = 2.
  const auto mine =
      Regions(AxisPlacement::GroupedShard({"tp"}, 0, {8, 4, 4}), {16, 3},
              Config("tp=2"), At(0, 0, 1));
  CHECK(mine == std::vector<Region>{Region{{4, 8}, {0, 3}},
                                    Region{{10, 12}, {0, 3}},
                                    Region{{14, 16}, {0, 3}}});
}

TEST_CASE("sharding: interleaved groups give each rank whole blocks",
          "[ptc][sharding]") {
  // Megatron-core's qkv: 4 query groups of (2 q rows, 1 k, 1 v); tp = 2
  // takes two whole groups each: one contiguous region.
  const AxisPlacement qkv = AxisPlacement::GroupedShard({"tp"}, 0, {2, 1, 1}, 4);
  const ParallelConfig c = Config("tp=2");
  CHECK(Regions(qkv, {16, 3}, c, At(0, 0, 1)) ==
        std::vector<Region>{Region{{8, 16}, {0, 3}}});
  AxisPlacement even = qkv;
  even.Even(1, "query groups");
  CHECK(CheckAxisPlacementFits(even, {16, 3}, Config("tp=4"), "qkv").ok());
  auto s = CheckAxisPlacementFits(even, {16, 3}, Config("tp=3"), "qkv");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("tp=3 does not divide the 4 query groups of tensor "
                         "'qkv'") != std::string::npos);
}

TEST_CASE("sharding: select gives an expert to one expert-parallel rank",
          "[ptc][sharding]") {
  // 8 experts over ep=4: expert 5 lives on ep index 2.
  const std::vector<std::string> mesh = {"pp", "dp", "ep", "tp"};
  const ParallelConfig c = *ParallelConfig::Parse("ep=4,tp=2", mesh);
  const AxisPlacement e5 = AxisPlacement::Select({"ep"}, 5, 8);
  for (int r = 0; r < c.world_size(); ++r) {
    const MeshCoord m = c.CoordOf(r);
    const auto held = RegionsOf({e5, AxisPlacement::Shard({"tp"}, 1)},
                                StageRule::All(), {3, 4}, c, 1, m);
    CHECK(held.empty() == (c.IndexOn(m, "ep") != 2));
  }
}

TEST_CASE("sharding: a placement over several axes flattens them",
          "[ptc][sharding]") {
  const std::vector<std::string> mesh = {"pp", "dp_replicate", "dp_shard",
                                         "tp"};
  const ParallelConfig c =
      *ParallelConfig::Parse("dp_replicate=2,dp_shard=3", mesh);
  const AxisPlacement p = AxisPlacement::Shard({"dp_replicate", "dp_shard"}, 0);
  // dp_replicate 1, dp_shard 2: index 5 of 6 over 12 rows.
  MeshCoord m;
  m.index = {0, 1, 2, 0};
  CHECK(RegionsOf({p}, StageRule::All(), {12}, c, 1, m) ==
        std::vector<Region>{Region{{10, 12}}});
}

TEST_CASE("sharding: padded vocabulary shard clips to the real rows",
          "[ptc][sharding]") {
  // vocab 1000, pad multiple 128, tp 4: padded 1024, chunks of 256.
  const AxisPlacement emb = AxisPlacement::Shard({"tp"}, 0, 128);
  const ParallelConfig c = Config("tp=4");
  CHECK(Regions(emb, {1000, 2}, c, At(0, 0, 2))[0] ==
        Region{{512, 768}, {0, 2}});
  CHECK(Regions(emb, {1000, 2}, c, At(0, 0, 3))[0] ==
        Region{{768, 1000}, {0, 2}});
}

TEST_CASE("sharding: stage rules place layers, embeddings and lists",
          "[ptc][sharding]") {
  const ParallelConfig c = Config("pp=4");
  const AxisPlacement rep = AxisPlacement::Replicate({"tp"});
  CHECK(Regions(rep, {4}, c, At(1, 0, 0), StageRule::Layer(5), 8).empty());
  CHECK(!Regions(rep, {4}, c, At(2, 0, 0), StageRule::Layer(5), 8).empty());
  const StageRule tied = StageRule::FirstAndLast();
  CHECK(!Regions(rep, {4}, c, At(0, 0, 0), tied, 8).empty());
  CHECK(Regions(rep, {4}, c, At(1, 0, 0), tied, 8).empty());
  CHECK(!Regions(rep, {4}, c, At(3, 0, 0), tied, 8).empty());
  const StageRule list = StageRule::List({1, 2});
  CHECK(Regions(rep, {4}, c, At(0, 0, 0), list, 8).empty());
  CHECK(!Regions(rep, {4}, c, At(2, 0, 0), list, 8).empty());
}

TEST_CASE("sharding: a placement that does not fit the tensor is rejected",
          "[ptc][sharding]") {
  const std::vector<std::string> mesh = DefaultMesh();
  CHECK(ValidateAxisPlacement(AxisPlacement::Shard({"tp"}, 2), {4, 4}, mesh,
                              "w")
            .code() == absl::StatusCode::kInvalidArgument);
  auto s = ValidateAxisPlacement(AxisPlacement::GroupedShard({"tp"}, 0, {2, 3}),
                                 {4, 4}, mesh, "w");
  CHECK(s.message().find("add up to 5") != std::string::npos);
  s = ValidateAxisPlacement(AxisPlacement::Shard({"ep"}, 0), {4}, mesh, "w");
  CHECK(s.message().find("unknown axis 'ep'") != std::string::npos);
  s = ValidateAxisPlacement(AxisPlacement::Shard({"pp"}, 0), {4}, mesh, "w");
  CHECK(s.message().find("stage rule") != std::string::npos);
  s = ValidateAxisPlacement(AxisPlacement::Select({"tp"}, 9, 8), {4}, mesh,
                            "w");
  CHECK(s.message().find("item 9") != std::string::npos);
}

}  // namespace
}  // namespace ptc
