#include "coordinator/kept_small_objects.h"

#include <catch2/catch.hpp>

#include "ptc/families.h"

namespace ptc {
namespace {

// A small GPT with the built-in objects (global ones and RNG states, which
// need no copy) and a data loader's position per data-parallel rank.
ModelSpec Spec() {
  auto spec =
      SpecForModel("gpt:layers=2,hidden=16,heads=2,vocab=64,positions=8");
  REQUIRE(spec.ok());
  spec->small_objects.push_back({"loader", {"dp"}, NewRankRule::kCopy, 64});
  return *std::move(spec);
}

TEST_CASE("keep plan: one rank per class that is all on one host sends it") {
  const ModelSpec spec = Spec();
  // tp=2,dp=2: each data-parallel replica on its own host. Each replica's
  // loader has its copies on one host (rank 0's and rank 2's are asked
  // for); the global objects are on both hosts, the RNG states derive.
  auto plan = MakeKeepPlan(spec, "tp=2,dp=2", {"a", "a", "b", "b"});
  REQUIRE(plan.ok());
  CHECK(plan->objects == 2);
  REQUIRE(plan->names.size() == 4);
  const std::vector<std::string> loader = {"loader"};
  CHECK(plan->names[0] == loader);
  CHECK(plan->names[1].empty());
  CHECK(plan->names[2] == loader);
  CHECK(plan->names[3].empty());

  // Each host holds a rank of either replica: every object has a copy on
  // both hosts, and nothing is asked for.
  plan = MakeKeepPlan(spec, "tp=2,dp=2", {"a", "b", "a", "b"});
  REQUIRE(plan.ok());
  CHECK(plan->objects == 0);

  // One host: every copy of everything is there; the global objects too.
  plan = MakeKeepPlan(spec, "tp=2,dp=2", {"a", "a", "a", "a"});
  REQUIRE(plan.ok());
  CHECK(plan->objects == 5);  // iteration, lr_scheduler, data_cursor, 2 loaders
  CHECK(plan->names[0].size() == 4);
  CHECK(plan->names[2] == loader);
}

TEST_CASE("keep plan: a placement that does not place every rank is refused") {
  const ModelSpec spec = Spec();
  CHECK(absl::IsInvalidArgument(
      MakeKeepPlan(spec, "tp=2,dp=2", {"a", "a"}).status()));
  CHECK(!MakeKeepPlan(spec, "tp=3,dp=5", {"a"}).ok());
}

TEST_CASE(
    "kept copies: found by name and rank, replaced, bounded per version") {
  const ModelSpec spec = Spec();
  auto plan = MakeKeepPlan(spec, "tp=2,dp=2", {"a", "a", "b", "b"});
  REQUIRE(plan.ok());
  KeptSmallObjects kept(std::make_shared<const KeepPlan>(*plan));
  CHECK_FALSE(kept.Complete());
  CHECK(kept.Add("loader", 0, "zero"));
  CHECK(kept.Find("loader", 0) != nullptr);
  CHECK(*kept.Find("loader", 0) == "zero");
  CHECK(kept.Find("loader", 2) == nullptr);
  CHECK(kept.Find("iteration", 0) == nullptr);
  CHECK_FALSE(kept.Complete());
  CHECK(kept.Add("loader", 2, "two"));
  CHECK(kept.Complete());
  // A report sent again replaces its copy, and counts once.
  CHECK(kept.Add("loader", 2, "TWO!"));
  CHECK(*kept.Find("loader", 2) == "TWO!");
  CHECK(kept.size() == 2);
  CHECK(kept.bytes() == 8);
  // The budget: a version keeps at most kMaxKeptBytesPerVersion.
  const std::string big(kMaxKeptSmallObjectBytes, 'x');
  int added = 0;
  while (kept.Add("loader", 1000 + added, big)) ++added;
  CHECK(added == (kMaxKeptBytesPerVersion - 8) / kMaxKeptSmallObjectBytes);
  CHECK(kept.bytes() <= kMaxKeptBytesPerVersion);
  CHECK(kept.Find("loader", 1000 + added) == nullptr);
}

}  // namespace
}  // namespace ptc
