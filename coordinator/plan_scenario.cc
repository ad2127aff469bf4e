#include "coordinator/plan_scenario.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ptc {

absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::string& model, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive) {
  PlanScenario s;
  PTC_ASSIGN_OR_RETURN(s.arch, ResolveArchitecture(model));
  PTC_ASSIGN_OR_RETURN(s.spec, BuildModelSpec(s.arch));
  s.cluster = std::move(cluster);
  s.alive = std::move(alive);
  struct Side {
    const char* name;
    const std::string* text;
    const std::vector<int>* hosts;
    Layout* layout;
    Placement* placement;
  };
  for (Side side :
       {Side{"source", &from, &from_hosts, &s.source, &s.source_placement},
        Side{"target", &to, &to_hosts, &s.target, &s.target_placement}}) {
    const std::string context =
        absl::StrCat(side.name, " config '", *side.text, "'");
    PTC_ASSIGN_OR_RETURN(ParallelConfig config,
                         ParallelConfig::Parse(*side.text));
    PTC_RETURN_IF_ERROR(Annotate(CheckFits(s.arch, config), context));
    PTC_ASSIGN_OR_RETURN(*side.layout, BuildLayout(s.spec, config));
    auto placement =
        ContiguousPlacement(s.cluster, *side.hosts, config.world_size());
    PTC_RETURN_IF_ERROR(Annotate(placement.status(), context));
    *side.placement = std::move(*placement);
  }
  return s;
}

}  // namespace ptc
