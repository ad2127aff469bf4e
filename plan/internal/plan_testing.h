// Test support for plans: a job builder, an in-memory executor that runs a
// plan on tensors whose every element encodes (tensor, global index), and a
// brute-force cross-host lower bound computed element by element. Neither
// shares code with the planner's refinement, so they check it
// independently.
#ifndef PTC_PLAN_INTERNAL_PLAN_TESTING_H_
#define PTC_PLAN_INTERNAL_PLAN_TESTING_H_

#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/plan.h"
#include "plan/plan_scenario.h"

namespace ptc::testing {

// Test jobs are plan scenarios.
using TestJob = PlanScenario;

inline absl::StatusOr<TestJob> MakeJob(const std::string& model,
                                       const std::string& from,
                                       const std::vector<int>& from_hosts,
                                       const std::string& to,
                                       const std::vector<int>& to_hosts,
                                       Cluster cluster,
                                       std::vector<bool> alive = {}) {
  return MakePlanScenario(model, from, from_hosts, to, to_hosts,
                          std::move(cluster), std::move(alive));
}

// A random layout spec: a random mesh (pp, dp, ep, tp or pp, dp_replicate,
// dp_shard, tp), tensors with every placement kind (replicate, shard with
// and without padding, contiguous and interleaved groups, select, joint
// axes), stage rules, and a flat buffer (aligned, bucketed, padded, with
// state members and FSDP-style flat entries).
ModelSpec RandomSpec(std::mt19937* rng);
// A random config string for `spec`'s mesh.
std::string RandomConfig(std::mt19937* rng, const ModelSpec& spec);

// A random small job (half of them of a random spec, the others of a random
// architecture; random configs, placements, extra hosts and dead hosts);
// for property tests. `description` says what it is.
TestJob RandomJob(std::mt19937* rng, std::string* description);

// Runs `plan` against the source state held by the live source hosts and
// checks that every target unit (host, or rank for per-rank plans) ends
// with exactly the right value in every element of every region it needs,
// each written exactly once. The first problem is returned as an error.
absl::Status ExecuteAndVerify(const PlanInput& input, const Plan& plan);

// sum over target hosts of the bytes they need but do not hold, counted
// element by element.
int64_t BruteForceCrossHostLowerBound(const PlanInput& input);

// Whether some element a target host needs has no copy on a live host.
bool BruteForceSomethingLost(const PlanInput& input);

}  // namespace ptc::testing

#endif  // PTC_PLAN_INTERNAL_PLAN_TESTING_H_
