// Proves a plan before it runs: every region each target host (or, for
// per-rank plans, each target rank) needs is covered by its pieces exactly
// once, nothing else is delivered, and every piece is held by the live
// host it names as source.
//
//   PTC_RETURN_IF_ERROR(ValidatePlan(input, plan));
#ifndef PTC_PLAN_PLAN_VALIDATOR_H_
#define PTC_PLAN_PLAN_VALIDATOR_H_

#include "absl/status/status.h"
#include "plan/plan.h"

namespace ptc {

// INVALID_ARGUMENT describing the first problem found (tensor, region,
// host) if the plan is not a correct plan for `input`.
absl::Status ValidatePlan(const PlanInput& input, const Plan& plan);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_VALIDATOR_H_
