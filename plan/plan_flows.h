// Bytes a plan moves from each host to each: what its pictures draw (the
// matrix of `ptcctl plan --svg`, the web view's change in flight).
//
//   for (const HostFlow& f : HostFlows(input, plan)) ...  // f.from -> f.to
#ifndef PTC_PLAN_PLAN_FLOWS_H_
#define PTC_PLAN_PLAN_FLOWS_H_

#include <cstdint>
#include <vector>

#include "plan/plan.h"

namespace ptc {

struct HostFlow {
  int32_t from = 0;  // a cluster host, or kFromSnapshot
  int32_t to = 0;
  int64_t bytes = 0;
};

// Every (from, to) pair the plan's transfers move bytes between, once,
// ordered by (from, to); from == to is a copy within the host. Regions
// kept in place are not flows (PlanSummary::kept_in_place_bytes).
std::vector<HostFlow> HostFlows(const PlanInput& input, const Plan& plan);

// Each fragment's bytes (its pieces, kept regions included), in the order
// of plan.fragments: what the host's staging reports progress against.
std::vector<int64_t> FragmentBytes(const PlanInput& input, const Plan& plan);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_FLOWS_H_
