// The coordinator's use of the placement (placement.h): a registration's
// or a change's PlacementOptions turned into the ranks' hosts and GPUs,
// and the placement written into a PlanSummary for ptcctl and launchers.
#ifndef PTC_PLAN_JOB_PLACEMENT_H_
#define PTC_PLAN_JOB_PLACEMENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/placement.h"
#include "proto/coordinator.pb.h"

namespace ptc {

// "ptc" chooses (ChoosePlacement, colocating options.colocate: empty
// means tp, ["none"] nothing); "contiguous" fills the candidates in order;
// "explicit" takes options.rank_hosts / rank_devices (host names among
// `names`, the cluster's hosts by id). The last two are checked against
// the request's GPUs and memory. `req.hosts` are the candidates.
absl::StatusOr<PlacementResult> PlaceJob(const proto::PlacementOptions& options,
                                         PlacementRequest req,
                                         const std::vector<std::string>& names);

// The strategy's name as the summary reports it.
std::string PlacementStrategy(const proto::PlacementOptions& options);

// Writes the placement (strategy, every rank's host and GPU, released
// candidates) into `summary`.
void SetPlacementSummary(const PlacementResult& result,
                         const std::string& strategy,
                         const std::vector<std::string>& names,
                         proto::PlanSummary* summary);

// The hosts the placement uses, in the candidates' order.
std::vector<std::string> UsedHosts(const PlacementResult& result,
                                   const std::vector<int>& candidates,
                                   const std::vector<std::string>& names);

}  // namespace ptc

#endif  // PTC_PLAN_JOB_PLACEMENT_H_
