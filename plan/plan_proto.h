// Conversion between a Plan and its wire form (proto/plan.proto).
//
//   ptc::proto::Plan wire = PlanToProto(plan);
//   PTC_ASSIGN_OR_RETURN(Plan back, PlanFromProto(wire));
#ifndef PTC_PLAN_PLAN_PROTO_H_
#define PTC_PLAN_PLAN_PROTO_H_

#include "absl/status/statusor.h"
#include "plan/plan.h"
#include "proto/plan.pb.h"
#include "ptc/region_proto.h"

namespace ptc {

proto::Plan PlanToProto(const Plan& plan);
// The summary alone, as PlanToProto(plan).summary() without converting
// every held region and transfer of the plan first.
proto::PlanSummary SummaryToProto(const PlanSummary& summary);
// INVALID_ARGUMENT if a region has begin > end; ids are checked against a
// job by ValidatePlan, not here.
absl::StatusOr<Plan> PlanFromProto(const proto::Plan& wire);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_PROTO_H_
