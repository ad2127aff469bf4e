#include "plan/job_placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/enum_names.h"

namespace ptc {

std::string PlacementStrategy(const proto::PlacementOptions& options) {
  return PlacementName(options.strategy());
}

absl::StatusOr<PlacementResult> PlaceJob(const proto::PlacementOptions& options,
                                         PlacementRequest req,
                                         const std::vector<std::string>& names) {
  const std::string strategy = PlacementStrategy(options);
  if (!proto::PlacementStrategy_IsValid(options.strategy())) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement ", options.strategy(),
                     " is unknown; use ptc (0), contiguous (1) or explicit (2)"));
  }
  if (options.strategy() == proto::PLACEMENT_PTC) {
    if (options.colocate_size() == 1 && options.colocate(0) == "none") {
      req.colocate.clear();
    } else if (options.colocate_size() > 0) {
      req.colocate.assign(options.colocate().begin(), options.colocate().end());
    } else {
      // The default: a tp group on one host where one fits (a mesh
      // without tp, or tp wider than every candidate, is placed freely).
      int max_free = 0;
      for (int h : req.hosts) {
        const int taken = req.taken.empty() ? 0 : static_cast<int>(req.taken[h].size());
        max_free = std::max(max_free, req.cluster->hosts[h].gpus - taken);
      }
      const ParallelConfig& config = *req.target->config();
      req.colocate.clear();
      if (config.AxisIndex("tp") >= 0 && config.size("tp") <= max_free)
        req.colocate = {"tp"};
    }
    req.survive = !options.prefer_movement();
    return ChoosePlacement(req);
  }
  if (options.prefer_movement()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefer_movement applies to the ptc placement; a ", strategy,
        " placement says where every rank runs itself"));
  }
  if (options.colocate_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "colocate applies to the ptc placement; a ", strategy,
        " placement says where every rank runs itself"));
  }
  PlacementResult result;
  if (options.strategy() == proto::PLACEMENT_CONTIGUOUS) {
    PTC_ASSIGN_OR_RETURN(result, ContiguousPlacementResult(req));
  } else {  // PLACEMENT_EXPLICIT
    const int world = req.target->world_size();
    if (options.rank_hosts_size() != world ||
        options.rank_devices_size() != world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an explicit placement gives the host and GPU of every rank: the "
          "config has ", world, " ranks but ", options.rank_hosts_size(),
          " hosts and ", options.rank_devices_size(), " GPUs were given"));
    }
    Placement p;
    for (int r = 0; r < world; ++r) {
      auto it = std::find(names.begin(), names.end(), options.rank_hosts(r));
      if (it == names.end()) {
        return absl::NotFoundError(absl::StrCat(
            "the explicit placement puts rank ", r, " on host '",
            options.rank_hosts(r), "', which is not registered"));
      }
      const int h = static_cast<int>(it - names.begin());
      if (!req.alive.empty() && !req.alive[h]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the explicit placement puts rank ", r, " on host '",
            names[h], "', which is dead"));
      }
      p.host.push_back(h);
      p.device.push_back(options.rank_devices(r));
      if (std::find(req.hosts.begin(), req.hosts.end(), h) == req.hosts.end())
        req.hosts.push_back(h);
    }
    PTC_ASSIGN_OR_RETURN(result, EvaluatePlacement(req, p));
  }
  PTC_RETURN_IF_ERROR(CheckPlacementFits(req, result));
  return result;
}

void SetPlacementSummary(const PlacementResult& result,
                         const std::string& strategy,
                         const std::vector<std::string>& names,
                         proto::PlanSummary* summary) {
  summary->set_placement(strategy);
  summary->clear_rank_hosts();
  summary->clear_rank_devices();
  summary->clear_released_hosts();
  for (int r = 0; r < result.placement.world_size(); ++r) {
    summary->add_rank_hosts(names[result.placement.host[r]]);
    summary->add_rank_devices(result.placement.device[r]);
  }
  for (int h : result.released) summary->add_released_hosts(names[h]);
  summary->set_survival(result.survival.Describe());
  summary->set_survives_host_loss(result.survival.SurvivesAnyHost());
}

std::vector<std::string> UsedHosts(const PlacementResult& result,
                                   const std::vector<int>& candidates,
                                   const std::vector<std::string>& names) {
  // Marks by host id, not a search per rank and per host: 16,384 ranks
  // on 2,048 candidates were two scans of tens of millions of compares.
  std::vector<char> used(names.size(), 0), listed(names.size(), 0);
  for (int h : result.placement.host) used[h] = 1;
  std::vector<std::string> out;
  for (int h : candidates) {
    if (listed[h]) continue;
    listed[h] = 1;
    if (used[h]) out.push_back(names[h]);
  }
  for (int h : result.placement.host) {
    if (listed[h]) continue;
    listed[h] = 1;
    out.push_back(names[h]);
  }
  return out;
}

}  // namespace ptc
