// A planning scenario assembled from the words people use: a model, the
// current and the new parallel config, and the hosts each runs on. Owns
// everything a PlanInput points to. Used by `ptcctl plan`, the planner
// benchmark and the tests.
//
//   PTC_ASSIGN_OR_RETURN(PlanScenario s, MakePlanScenario(
//       "gpt3-2.7b", "tp=4,pp=2", {0, 1}, "tp=2,pp=2,dp=4", {0, 1, 2, 3},
//       Cluster::Uniform(4, 8)));
//   PTC_ASSIGN_OR_RETURN(Plan plan, PlanReconfiguration(s.input()));
#ifndef PTC_COORDINATOR_PLAN_SCENARIO_H_
#define PTC_COORDINATOR_PLAN_SCENARIO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/plan.h"

namespace ptc {

struct PlanScenario {
  ModelSpec spec;
  Cluster cluster;
  Layout source, target;
  Placement source_placement, target_placement;
  std::vector<bool> alive;  // empty: all alive

  // Points into this object: keep it alive (and unmoved) while in use.
  PlanInput input() const {
    return PlanInput{&spec,   &cluster,          &source, &source_placement,
                     &target, &target_placement, alive};
  }
};

// Each side is placed contiguously on its host ids, in the order given;
// configs are for the spec's mesh. INVALID_ARGUMENT / NOT_FOUND name the
// offending config, tensor or host.
absl::StatusOr<PlanScenario> MakePlanScenario(
    ModelSpec spec, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive = {});

// The same for a built-in model: a known name or a custom architecture
// (SpecForModel).
absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::string& model, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive = {});

}  // namespace ptc

#endif  // PTC_COORDINATOR_PLAN_SCENARIO_H_
