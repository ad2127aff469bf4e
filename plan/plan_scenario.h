// A planning scenario assembled from the words people use: a model, the
// current and the new parallel config, and the hosts each runs on. Owns
// everything a PlanInput points to. Used by `ptcctl plan`, the planner
// benchmark and the tests.
//
//   PTC_ASSIGN_OR_RETURN(PlanScenario s, MakePlanScenario(
//       "gpt3-2.7b", "tp=4,pp=2", {0, 1}, "tp=2,pp=2,dp=4", {0, 1, 2, 3},
//       Cluster::Uniform(4, 8)));
//   PTC_ASSIGN_OR_RETURN(Plan plan, PlanReconfiguration(s.input()));
#ifndef PTC_PLAN_PLAN_SCENARIO_H_
#define PTC_PLAN_PLAN_SCENARIO_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/placement.h"
#include "plan/plan.h"
#include "proto/coordinator.pb.h"
#include "ptc/layout_cache.h"

namespace ptc {

struct PlanScenario {
  ModelSpec spec;
  Cluster cluster;
  // Shared with the LayoutCache they came from, if any (never null in a
  // made scenario).
  std::shared_ptr<const Layout> source_layout, target_layout;
  Placement source_placement, target_placement;
  std::vector<bool> alive;  // empty: all alive
  // How the target was placed: "contiguous" (MakePlanScenario) or what
  // PlaceScenarioTarget chose, with the candidates it released.
  std::string placement_strategy = "contiguous";
  PlacementResult placement;
  double placement_seconds = 0;

  const Layout& source() const { return *source_layout; }
  const Layout& target() const { return *target_layout; }

  // Points into this object: keep it alive (and unmoved) while in use.
  PlanInput input() const {
    return PlanInput{&spec,     &cluster,          &source(), &source_placement,
                     &target(), &target_placement, alive};
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

// The same with the layouts from `layouts` (a coordinator's: the committed
// layout is built once, not at every change) for `spec`, the cache's key.
absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::shared_ptr<const ModelSpec>& spec, LayoutCache* layouts,
    const std::string& from, const std::vector<int>& from_hosts,
    const std::string& to, const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive = {});

// The same for a built-in model: a known name or a custom architecture
// (SpecForModel).
absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::string& model, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive = {});

// Places the scenario's target again as the coordinator would
// (PlaceJob: "ptc" chooses from the source's holdings, "contiguous" fills
// the candidates in order), with `candidates` the hosts it may use;
// records the result and the time it took.
absl::Status PlaceScenarioTarget(PlanScenario* s,
                                 const proto::PlacementOptions& options,
                                 const std::vector<int>& candidates);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_SCENARIO_H_
