#include "ptc/parallel_config.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("parallel config: Megatron's rank order is tp, then dp, then pp",
          "[ptc][config]") {
  auto c = ParallelConfig::Parse("tp=2,pp=3,dp=4");
  REQUIRE(c.ok());
  CHECK(c->world_size() == 24);
  for (int r = 0; r < 24; ++r) {
    const MeshCoord m = c->CoordOf(r);
    CHECK(r == m.tp() + 2 * (m.dp() + 4 * m.pp()));
    CHECK(c->RankOf(m) == r);
  }
}

TEST_CASE("parallel config: the rank order is part of the config",
          "[ptc][config]") {
  auto c = ParallelConfig::Parse("tp=2,pp=3,dp=4,order=dp-tp-pp");
  REQUIRE(c.ok());
  const MeshCoord m = c->CoordOf(5);
  CHECK(m.dp() == 1);
  CHECK(m.tp() == 1);
  CHECK(m.pp() == 0);
  CHECK(c->ToString() == "tp=2,pp=3,dp=4,order=dp-tp-pp");
  auto again = ParallelConfig::Parse(c->ToString());
  REQUIRE(again.ok());
  CHECK(again->order == c->order);
}

TEST_CASE("parallel config: uneven and explicit pipeline stages",
          "[ptc][config]") {
  auto c = ParallelConfig::Parse("pp=3");
  REQUIRE(c.ok());
  CHECK(c->StageLayers(0, 10) == std::make_pair(0, 4));
  CHECK(c->StageLayers(1, 10) == std::make_pair(4, 3));
  CHECK(c->StageLayers(2, 10) == std::make_pair(7, 3));
  CHECK(c->StageOfLayer(6, 10) == 1);
  auto e = ParallelConfig::Parse("pp=2,layers=2/8");
  REQUIRE(e.ok());
  REQUIRE(e->Validate(10).ok());
  CHECK(e->StageOfLayer(1, 10) == 0);
  CHECK(e->StageOfLayer(2, 10) == 1);
}

TEST_CASE("parallel config: bad configs are rejected naming the value",
          "[ptc][config]") {
  CHECK(!ParallelConfig::Parse("tp=0").ok());
  CHECK(!ParallelConfig::Parse("tq=2").ok());
  CHECK(!ParallelConfig::Parse("tp=two").ok());
  auto twice = ParallelConfig::Parse("order=tp-tp-pp");
  REQUIRE(twice.ok());
  CHECK(twice->Validate(4).message().find("names tp twice") !=
        std::string::npos);
  auto too_deep = ParallelConfig::Parse("pp=8");
  REQUIRE(too_deep.ok());
  auto s = too_deep->Validate(4);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("pp=8") != std::string::npos);
  auto wrong_sum = ParallelConfig::Parse("pp=2,layers=1/2");
  REQUIRE(wrong_sum.ok());
  CHECK(wrong_sum->Validate(4).message().find("add up to 3") !=
        std::string::npos);
}

TEST_CASE("parallel config: chunks give earlier ranks the larger pieces",
          "[ptc][config]") {
  CHECK(ChunkOf(10, 4, 0) == std::make_pair<int64_t, int64_t>(0, 3));
  CHECK(ChunkOf(10, 4, 1) == std::make_pair<int64_t, int64_t>(3, 6));
  CHECK(ChunkOf(10, 4, 2) == std::make_pair<int64_t, int64_t>(6, 8));
  CHECK(ChunkOf(10, 4, 3) == std::make_pair<int64_t, int64_t>(8, 10));
  CHECK(ChunkOf(2, 4, 3) == std::make_pair<int64_t, int64_t>(2, 2));
}

}  // namespace
}  // namespace ptc
