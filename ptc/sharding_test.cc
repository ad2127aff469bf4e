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

TEST_CASE("sharding: column and row splits cut the right dimension",
          "[ptc][sharding]") {
  ShardingRule col;
  col.tp = AxisRule::Split(0);
  ShardingRule row;
  row.tp = AxisRule::Split(1);
  const ParallelConfig c = Config("tp=4");
  CHECK(RegionsOf(col, {16, 8}, c, 1, At(0, 0, 1)) ==
        std::vector<Region>{Region{{4, 8}, {0, 8}}});
  CHECK(RegionsOf(row, {16, 8}, c, 1, At(0, 0, 3)) ==
        std::vector<Region>{Region{{0, 16}, {6, 8}}});
}

TEST_CASE("sharding: uneven splits follow chunk semantics", "[ptc][sharding]") {
  ShardingRule r;
  r.tp = AxisRule::Split(0);
  const ParallelConfig c = Config("tp=3");
  CHECK(RegionsOf(r, {10}, c, 1, At(0, 0, 0))[0] == Region{{0, 4}});
  CHECK(RegionsOf(r, {10}, c, 1, At(0, 0, 2))[0] == Region{{7, 10}});
  // More ranks than rows: the last ranks hold nothing.
  CHECK(RegionsOf(r, {2}, Config("tp=3"), 1, At(0, 0, 2)).empty());
}

TEST_CASE("sharding: grouped split gives a region per group (GQA, SwiGLU)",
          "[ptc][sharding]") {
  // q = 8 rows, k = v = 4 rows; tp = 2.
  ShardingRule qkv;
  qkv.tp = AxisRule::GroupedSplit(0, {8, 4, 4});
  const auto mine = RegionsOf(qkv, {16, 3}, Config("tp=2"), 1, At(0, 0, 1));
  CHECK(mine == std::vector<Region>{Region{{4, 8}, {0, 3}},
                                    Region{{10, 12}, {0, 3}},
                                    Region{{14, 16}, {0, 3}}});
}

TEST_CASE("sharding: padded vocabulary split clips to the real rows",
          "[ptc][sharding]") {
  // vocab 1000, pad multiple 128, tp 4: padded 1024, chunks of 256.
  ShardingRule emb;
  emb.tp = AxisRule::Split(0, 128);
  const ParallelConfig c = Config("tp=4");
  CHECK(RegionsOf(emb, {1000, 2}, c, 1, At(0, 0, 2))[0] ==
        Region{{512, 768}, {0, 2}});
  CHECK(RegionsOf(emb, {1000, 2}, c, 1, At(0, 0, 3))[0] ==
        Region{{768, 1000}, {0, 2}});
}

TEST_CASE("sharding: stage rules place layers and embeddings",
          "[ptc][sharding]") {
  const ParallelConfig c = Config("pp=4");
  ShardingRule layer5;
  layer5.stage = StageRule::Layer(5);
  CHECK(!RegionsOf(layer5, {4}, c, 8, At(1, 0, 0)).empty() == false);
  CHECK(!RegionsOf(layer5, {4}, c, 8, At(2, 0, 0)).empty());
  ShardingRule tied;
  tied.stage = StageRule::FirstAndLast();
  CHECK(!RegionsOf(tied, {4}, c, 8, At(0, 0, 0)).empty());
  CHECK(RegionsOf(tied, {4}, c, 8, At(1, 0, 0)).empty());
  CHECK(!RegionsOf(tied, {4}, c, 8, At(3, 0, 0)).empty());
}

TEST_CASE("sharding: a rule that does not fit the shape is rejected",
          "[ptc][sharding]") {
  ShardingRule r;
  r.tp = AxisRule::Split(2);
  CHECK(ValidateRule(r, {4, 4}, "w").code() ==
        absl::StatusCode::kInvalidArgument);
  r.tp = AxisRule::GroupedSplit(0, {2, 3});
  auto s = ValidateRule(r, {4, 4}, "w");
  CHECK(s.message().find("add up to 5") != std::string::npos);
}

}  // namespace
}  // namespace ptc
