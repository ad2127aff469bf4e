// The reconfiguration planner: a pure function from (source layout and
// placement, live hosts, target layout and placement, link bandwidths) to
// a plan with these properties:
//   1. Nothing crosses hosts that the receiving host already holds: bytes
//      across hosts equal the lower bound sum_h |needs(h) \ holds(h)|.
//   2. Senders are balanced: a piece may come from any live replica and may
//      be striped across several; the per-host send time is minimised by a
//      bisection on the makespan with a max-flow feasibility test, so the
//      largest send is within rounding of the fractional optimum.
//   3. Ranks on one host that need the same region get it once.
//   4. Cheap: the common refinement of source and target regions is built
//      per tensor on a grid of their boundaries (linear in the cells),
//      and the flow network has one node per class of pieces with the same
//      senders, not one per piece.
//
//   PlanInput in{&spec, &cluster, &src, &src_placement, &dst, &dst_placement};
//   PTC_ASSIGN_OR_RETURN(Plan plan, PlanReconfiguration(in));
//   PTC_RETURN_IF_ERROR(ValidatePlan(in, plan));
#ifndef PTC_PLAN_PLANNER_H_
#define PTC_PLAN_PLANNER_H_

#include "absl/status/statusor.h"
#include "plan/plan.h"

namespace ptc {

// Errors: INVALID_ARGUMENT for inputs that do not fit together (layouts of
// other models, placements of the wrong size, unknown hosts);
// FAILED_PRECONDITION when a target rank sits on a dead host or a needed
// region has no surviving copy (the message names tensor, region and the
// dead hosts that held it).
absl::StatusOr<Plan> PlanReconfiguration(const PlanInput& input);

// The plan Tenplex's implementation uses, for comparison: every target
// rank fetches each of its regions from the lowest-numbered live source
// rank holding it (data-parallel replica 0 in Megatron's order), with no
// preference for local copies and no sharing between ranks on one host.
// Its lower-bound fields are the same as PlanReconfiguration's.
absl::StatusOr<Plan> PlanTenplexBaseline(const PlanInput& input);

// Checks that the input's parts fit together (used by both planners).
absl::Status CheckPlanInput(const PlanInput& input);

}  // namespace ptc

#endif  // PTC_PLAN_PLANNER_H_
