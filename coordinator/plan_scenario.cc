#include "coordinator/plan_scenario.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ptc/families.h"

namespace ptc {

absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::string& model, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive) {
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecForModel(model));
  return MakePlanScenario(std::move(spec), from, from_hosts, to, to_hosts,
                          std::move(cluster), std::move(alive));
}

absl::StatusOr<PlanScenario> MakePlanScenario(
    ModelSpec spec, const std::string& from,
    const std::vector<int>& from_hosts, const std::string& to,
    const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive) {
  PlanScenario s;
  s.spec = std::move(spec);
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
    auto config = s.spec.ParseConfig(*side.text);
    PTC_RETURN_IF_ERROR(Annotate(config.status(), context));
    auto layout = BuildLayout(s.spec, *config);
    PTC_RETURN_IF_ERROR(Annotate(layout.status(), context));
    *side.layout = *std::move(layout);
    auto placement =
        ContiguousPlacement(s.cluster, *side.hosts, config->world_size());
    PTC_RETURN_IF_ERROR(Annotate(placement.status(), context));
    *side.placement = std::move(*placement);
  }
  return s;
}

}  // namespace ptc
