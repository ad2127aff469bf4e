#include "ptc/small_object.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("small objects: each scope picks a deterministic source",
          "[ptc][small_object]") {
  const ParallelConfig from = *ParallelConfig::Parse("tp=2,pp=2,dp=2");
  const ParallelConfig to = *ParallelConfig::Parse("tp=4,pp=1,dp=1");
  MeshCoord t;
  t.index = {0, 0, 3};
  // Global: rank 0 first.
  CHECK(SmallObjectSourceCandidates(SmallObjectScope::kGlobal, from, to, 8,
                                    t)[0] == 0);
  // Per tp rank: old tp 3 % 2 = 1 of stage 0, dp 0 then dp 1.
  CHECK(SmallObjectSourceCandidates(SmallObjectScope::kTpRank, from, to, 8,
                                    t) == std::vector<int>{1, 3});
  // Per rank never falls back to another tp index.
  for (int r :
       SmallObjectSourceCandidates(SmallObjectScope::kRank, from, to, 8, t)) {
    CHECK(from.CoordOf(r).tp() == 1);
  }
}

TEST_CASE("small objects: a new stage takes the stage of its first layer",
          "[ptc][small_object]") {
  const ParallelConfig from = *ParallelConfig::Parse("pp=2");
  const ParallelConfig to = *ParallelConfig::Parse("pp=4");
  MeshCoord t;
  t.index = {3, 0, 0};  // new stage 3 starts at layer 6 of 8: old stage 1
  CHECK(SmallObjectSourceCandidates(SmallObjectScope::kStage, from, to, 8, t) ==
        std::vector<int>{1});
}

}  // namespace
}  // namespace ptc
