// JSON forms of a plan, for people's tools and for independent checkers.
//
//   std::string s = PlanSummaryJson(plan.summary, cluster);
//   std::string whole = PlanJson(input, plan);   // both layouts + transfers
//
// The whole-plan document:
//   { "model": str, "strategy": "ptc"|"tenplex", "per_rank": bool,
//     "hosts":   [{"id", "name", "gpus", "bandwidth", "alive"}],
//     "tensors": [{"id", "key", "dtype", "element_size", "shape": [..]}],
//     "source" / "target": {"config": str|null,
//                "ranks": [{"rank", "host", "device"}],
//                "shards": [{"tensor", "rank", "region": [[b, e], ..]}]},
//     "transfers": [{"tensor", "region", "source_host", "target_host",
//                    "target_rank"}],
//     "small_objects": [{"name", "target_rank", "source_rank",
//                        "source_host", "target_host"}],
//     "summary": {...} }
#ifndef PTC_PLAN_PLAN_JSON_H_
#define PTC_PLAN_PLAN_JSON_H_

#include <string>

#include "common/json_writer.h"
#include "plan/plan.h"

namespace ptc {

// Writes the summary object (cross_host_bytes, cross_host_bytes_lower_bound,
// max_host_send_bytes, max_host_send_bytes_lower_bound, plan_seconds, ...).
void WritePlanSummary(const PlanSummary& summary, const Cluster& cluster,
                      JsonWriter* w);

std::string PlanJson(const PlanInput& input, const Plan& plan);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_JSON_H_
