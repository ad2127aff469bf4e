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
    CHECK(r == c->IndexOn(m, "tp") +
                   2 * (c->IndexOn(m, "dp") + 4 * c->IndexOn(m, "pp")));
    CHECK(c->RankOf(m) == r);
  }
}

TEST_CASE("parallel config: the rank order is part of the config",
          "[ptc][config]") {
  auto c = ParallelConfig::Parse("tp=2,pp=3,dp=4,order=dp-tp-pp");
  REQUIRE(c.ok());
  const MeshCoord m = c->CoordOf(5);
  CHECK(c->IndexOn(m, "dp") == 1);
  CHECK(c->IndexOn(m, "tp") == 1);
  CHECK(c->IndexOn(m, "pp") == 0);
  CHECK(c->ToString() == "tp=2,pp=3,dp=4,order=dp-tp-pp");
  auto again = ParallelConfig::Parse(c->ToString());
  REQUIRE(again.ok());
  CHECK(again->axes == c->axes);
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
  CHECK(twice.status().message().find("list every axis of the mesh once") !=
        std::string::npos);
  // An axis the mesh lacks names the mesh's axes.
  auto ep = ParallelConfig::Parse("ep=2");
  CHECK(ep.status().message().find("mesh has the axes pp, dp, tp") !=
        std::string::npos);
  CHECK(!ParallelConfig::Parse("tp=2000000").ok());
  CHECK(!ParallelConfig::Parse("tp=1024,dp=1024,pp=2").ok());
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

TEST_CASE("parallel config: a job's own mesh axes and their rank order",
          "[ptc][config]") {
  const std::vector<std::string> mesh = {"pp", "dp", "ep", "cp", "tp"};
  auto c = ParallelConfig::Parse("pp=2,dp=2,ep=4,cp=2,tp=2", mesh);
  REQUIRE(c.ok());
  CHECK(c->world_size() == 64);
  CHECK(c->size("ep") == 4);
  CHECK(c->size("zz") == 1);
  for (int r = 0; r < 64; ++r) {
    const MeshCoord m = c->CoordOf(r);
    CHECK(r == c->IndexOn(m, "tp") +
                   2 * (c->IndexOn(m, "cp") +
                        2 * (c->IndexOn(m, "ep") +
                             4 * (c->IndexOn(m, "dp") +
                                  2 * c->IndexOn(m, "pp")))));
    CHECK(c->RankOf(m) == r);
  }
  CHECK(c->ToString() == "tp=2,pp=2,dp=2,ep=4,cp=2");
  auto again = ParallelConfig::Parse(c->ToString(), mesh);
  REQUIRE(again.ok());
  CHECK(again->sizes == c->sizes);
  auto reordered = ParallelConfig::Parse("ep=4,order=ep-tp-cp-dp-pp", mesh);
  REQUIRE(reordered.ok());
  CHECK(reordered->IndexOn(reordered->CoordOf(3), "ep") == 3);
  CHECK(ParallelConfig::Parse(reordered->ToString(), mesh)->axes ==
        reordered->axes);
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
