// Pictures of a plan, for people: where a change's bytes go between hosts
// and where the ranks run before and after it.
//
//   std::string svg = PlanSvg(input, plan, "gpt3-1.3b: tp=4 -> tp=2,pp=2");
//   std::string page = PlanHtml(input, plan, title);  // the SVG + tables
//
// The SVG has, top to bottom: the summary (bytes across hosts against the
// least any plan must send, the busiest sender against its bound); a
// matrix of bytes from each sending host (rows) to each receiving host
// (columns), darker for more (a log scale), the diagonal what stays on a
// host (kept in place or copied), a row "snapshot" for regions read from
// disk; and the source and target placements as a strip of ranks coloured
// by host. Beyond 48 hosts the matrix groups consecutive hosts (its labels
// say which); beyond 2,048 ranks the strips are left out. The HTML page
// holds the same SVG and the per-host table (sent, received, kept), and
// needs no script and nothing from the network. For machines, each matrix
// cell carries data-from (a row: a group index, or "snapshot"), data-to and
// data-bytes, and each rank cell data-rank and data-host (class "rank
// source" or "rank target"); groups are host ids up to 48 hosts.
#ifndef PTC_PLAN_PLAN_SVG_H_
#define PTC_PLAN_PLAN_SVG_H_

#include <string>

#include "plan/plan.h"

namespace ptc {

std::string PlanSvg(const PlanInput& input, const Plan& plan,
                    const std::string& title);

std::string PlanHtml(const PlanInput& input, const Plan& plan,
                     const std::string& title);

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_SVG_H_
