#include "ptc/small_object.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

MeshCoord At(int pp, int dp, int tp) {
  MeshCoord m;
  m.index = {pp, dp, tp};
  return m;
}

TEST_CASE("small objects: each scope picks a deterministic source",
          "[ptc][small_object]") {
  const ParallelConfig from = *ParallelConfig::Parse("tp=2,pp=2,dp=2");
  const ParallelConfig to = *ParallelConfig::Parse("tp=2,pp=1,dp=1");
  // Global: rank 0 first.
  const SmallObjectSpec global{"iteration", {}, NewRankRule::kCopy, 8};
  CHECK(SmallObjectSources(global, from, to, 8, At(0, 0, 1)).candidates[0] ==
        0);
  // Per (pp, tp): stage 0, tp 1, dp 0 then dp 1.
  const SmallObjectSpec tp_rank{"rng", {"pp", "tp"}, NewRankRule::kCopy, 8};
  CHECK(SmallObjectSources(tp_rank, from, to, 8, At(0, 0, 1)).candidates ==
        std::vector<int>{1, 3});
  // Per rank: exactly the rank at the same coordinates.
  const SmallObjectSpec rank{"rng", {"pp", "dp", "tp"}, NewRankRule::kCopy, 8};
  CHECK(SmallObjectSources(rank, from, to, 8, At(0, 0, 1)).candidates ==
        std::vector<int>{1});
}

TEST_CASE("small objects: a new stage takes the stage of its first layer",
          "[ptc][small_object]") {
  const ParallelConfig from = *ParallelConfig::Parse("pp=2");
  const ParallelConfig to = *ParallelConfig::Parse("pp=4");
  // New stage 3 starts at layer 6 of 8: old stage 1.
  const SmallObjectSpec stage{"sched", {"pp"}, NewRankRule::kCopy, 8};
  CHECK(SmallObjectSources(stage, from, to, 8, At(3, 0, 0)).candidates ==
        std::vector<int>{1});
}

TEST_CASE("small objects: new data-parallel ranks derive fresh RNG seeds",
          "[ptc][small_object]") {
  const ParallelConfig from = *ParallelConfig::Parse("dp=2");
  const ParallelConfig to = *ParallelConfig::Parse("dp=4");
  const SmallObjectSpec rng{"rng.default", {"pp", "dp", "tp"},
                            NewRankRule::kDerive, 16};
  // dp 1 existed: copied from the same coordinates.
  const SmallObjectSource old = SmallObjectSources(rng, from, to, 4, At(0, 1, 0));
  CHECK(old.derive_from.empty());
  CHECK(old.candidates == std::vector<int>{1});
  // dp 2 and 3 are new: derived, and different from each other.
  const SmallObjectSource a = SmallObjectSources(rng, from, to, 4, At(0, 2, 0));
  const SmallObjectSource b = SmallObjectSources(rng, from, to, 4, At(0, 3, 0));
  CHECK(a.derive_from == "pp=0,dp=2,tp=0");
  const std::string va = DerivedSmallObject("job", rng.name, a.derive_from, 7);
  const std::string vb = DerivedSmallObject("job", rng.name, b.derive_from, 7);
  REQUIRE(DerivedSeed(va).has_value());
  CHECK(*DerivedSeed(va) != *DerivedSeed(vb));
  // Deterministic, and new for every version.
  CHECK(DerivedSmallObject("job", rng.name, a.derive_from, 7) == va);
  CHECK(DerivedSmallObject("job", rng.name, a.derive_from, 8) != va);
  CHECK(!DerivedSeed("saved by a rank").has_value());
  // The copy rule takes the old rank's state instead.
  SmallObjectSpec copy = rng;
  copy.new_ranks = NewRankRule::kCopy;
  CHECK(SmallObjectSources(copy, from, to, 4, At(0, 3, 0)).candidates ==
        std::vector<int>{1});
}

TEST_CASE("small objects: a derived seed depends on the job's name",
          "[ptc][small_object]") {
  const std::string from = "pp=0,dp=2,tp=0";
  const std::string a = DerivedSmallObject("job-a", "rng", from, 7);
  const std::string b = DerivedSmallObject("job-b", "rng", from, 7);
  REQUIRE(DerivedSeed(a).has_value());
  REQUIRE(DerivedSeed(b).has_value());
  // Two jobs at the same coordinates and version: two seeds.
  CHECK(*DerivedSeed(a) != *DerivedSeed(b));
  // The same inputs: the same bytes.
  CHECK(DerivedSmallObject("job-a", "rng", from, 7) == a);
  CHECK(DerivedSmallObject("job-a", "rng", from, 8) != a);
}

}  // namespace
}  // namespace ptc
