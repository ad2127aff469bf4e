// Property tests of the planner over hundreds of random small jobs: random
// GPT/LLaMA shapes, uneven and grouped splits, ZeRO-1 ranges, pipeline
// changes, scale up and down, redeploys and dead hosts.
#include <catch2/catch.hpp>
#include <random>

#include "plan/internal/plan_testing.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"

namespace ptc {
namespace {

using testing::BruteForceCrossHostLowerBound;
using testing::BruteForceSomethingLost;
using testing::ExecuteAndVerify;
using testing::RandomJob;
using testing::TestJob;

constexpr int kCases = 400;

TEST_CASE(
    "planner properties: plans reproduce every target region exactly, "
    "with cross-host bytes at the lower bound and balanced senders",
    "[coordinator][planner][property]") {
  std::mt19937 rng(20261122);
  int planned = 0, lost = 0;
  for (int i = 0; i < kCases; ++i) {
    std::string what;
    const TestJob job = RandomJob(&rng, &what);
    INFO("case " << i << ": " << what);
    auto plan = PlanReconfiguration(job.input());
    if (!plan.ok()) {
      // The only acceptable failure: something needed has no live copy.
      CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
      CHECK(BruteForceSomethingLost(job.input()));
      ++lost;
      continue;
    }
    ++planned;
    REQUIRE(ValidatePlan(job.input(), *plan).ok());
    const absl::Status executed = ExecuteAndVerify(job.input(), *plan);
    INFO(executed.ToString());
    REQUIRE(executed.ok());
    const PlanSummary& s = plan->summary;
    CHECK(s.cross_host_bytes == BruteForceCrossHostLowerBound(job.input()));
    CHECK(s.cross_host_bytes == s.cross_host_bytes_lower_bound);
    CHECK(s.max_host_send_bytes >= s.max_host_send_bytes_lower_bound);
    // Within 5% of the fractional optimum; on these tiny tensors a piece
    // split between senders rounds to whole elements (<= 4 bytes each), so
    // allow one element per sender class on top.
    CHECK(s.max_host_send_bytes <=
          1.05 * s.max_host_send_bytes_lower_bound + 4 * 8);
    CHECK(s.kept_in_place_bytes + s.copied_within_host_bytes +
              s.cross_host_bytes ==
          s.target_bytes);

    auto base = PlanTenplexBaseline(job.input());
    REQUIRE(base.ok());
    REQUIRE(ValidatePlan(job.input(), *base).ok());
    REQUIRE(ExecuteAndVerify(job.input(), *base).ok());
    CHECK(base->summary.cross_host_bytes >= s.cross_host_bytes);
    // The bound is a true lower bound: no correct plan beats it, the
    // baseline included, and it is at least an even split over the live
    // senders.
    CHECK(base->summary.max_host_send_bytes >=
          s.max_host_send_bytes_lower_bound);
    int live = 0;
    for (size_t h = 0; h < job.cluster.hosts.size(); ++h)
      live += job.input().IsAlive(h);
    CHECK(s.max_host_send_bytes_lower_bound * live >= s.cross_host_bytes);
  }
  INFO(planned << " planned, " << lost << " with lost regions");
  CHECK(planned >= kCases / 2);
  CHECK(lost > 0);
}

TEST_CASE("planner properties: the validator rejects corrupted plans",
          "[coordinator][planner][property]") {
  std::mt19937 rng(7);
  int corrupted = 0;
  for (int i = 0; i < 200 && corrupted < 60; ++i) {
    std::string what;
    const TestJob job = RandomJob(&rng, &what);
    auto plan = PlanReconfiguration(job.input());
    if (!plan.ok()) continue;
    // Find a fragment with a transfer.
    std::vector<std::pair<size_t, size_t>> where;
    for (size_t f = 0; f < plan->fragments.size(); ++f) {
      for (size_t x = 0; x < plan->fragments[f].transfers.size(); ++x)
        where.push_back({f, x});
    }
    if (where.empty()) continue;
    const auto [f, x] = where[rng() % where.size()];
    INFO(what);
    for (int kind = 0; kind < 4; ++kind) {
      Plan bad = *plan;
      auto& transfers = bad.fragments[f].transfers;
      Transfer& t = transfers[x];
      switch (kind) {
        case 0:  // a piece goes missing
          transfers.erase(transfers.begin() + x);
          break;
        case 1:  // a piece arrives twice
          transfers.push_back(t);
          break;
        case 2:  // a piece comes from a host that does not hold it
          t.source_host =
              (t.source_host + 1) % static_cast<int>(job.cluster.hosts.size());
          if (ValidatePlan(job.input(), bad).ok())
            continue;  // it may hold it too
          break;
        case 3:  // a piece grows past the tensor
          t.region.mutable_dim(0).end += 1000000;
          if (t.region.rank() == 0) continue;
          break;
      }
      CHECK(ValidatePlan(job.input(), bad).code() ==
            absl::StatusCode::kInvalidArgument);
      ++corrupted;
    }
  }
  CHECK(corrupted >= 60);
}

}  // namespace
}  // namespace ptc
