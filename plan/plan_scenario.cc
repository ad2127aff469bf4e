#include "plan/plan_scenario.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "plan/job_placement.h"
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
  return MakePlanScenario(std::make_shared<const ModelSpec>(std::move(spec)),
                          nullptr, from, from_hosts, to, to_hosts,
                          std::move(cluster), std::move(alive));
}

absl::StatusOr<PlanScenario> MakePlanScenario(
    const std::shared_ptr<const ModelSpec>& spec, LayoutCache* layouts,
    const std::string& from, const std::vector<int>& from_hosts,
    const std::string& to, const std::vector<int>& to_hosts, Cluster cluster,
    std::vector<bool> alive) {
  PlanScenario s;
  s.spec = *spec;
  s.cluster = std::move(cluster);
  s.alive = std::move(alive);
  struct Side {
    const char* name;
    const std::string* text;
    const std::vector<int>* hosts;
    std::shared_ptr<const Layout>* layout;
    Placement* placement;
  };
  for (Side side : {Side{"source", &from, &from_hosts, &s.source_layout,
                         &s.source_placement},
                    Side{"target", &to, &to_hosts, &s.target_layout,
                         &s.target_placement}}) {
    const std::string context =
        absl::StrCat(side.name, " config '", *side.text, "'");
    auto config = s.spec.ParseConfig(*side.text);
    PTC_RETURN_IF_ERROR(Annotate(config.status(), context));
    if (layouts != nullptr) {
      auto layout = layouts->Get(spec, *side.text);
      PTC_RETURN_IF_ERROR(Annotate(layout.status(), context));
      *side.layout = *std::move(layout);
    } else {
      auto layout = BuildLayout(s.spec, *config);
      PTC_RETURN_IF_ERROR(Annotate(layout.status(), context));
      *side.layout = std::make_shared<const Layout>(*std::move(layout));
    }
    auto placement =
        ContiguousPlacement(s.cluster, *side.hosts, config->world_size());
    PTC_RETURN_IF_ERROR(Annotate(placement.status(), context));
    *side.placement = std::move(*placement);
  }
  return s;
}

absl::Status PlaceScenarioTarget(PlanScenario* s,
                                 const proto::PlacementOptions& options,
                                 const std::vector<int>& candidates) {
  PlacementRequest req;
  req.spec = &s->spec;
  req.cluster = &s->cluster;
  req.target = &s->target();
  req.hosts = candidates;
  req.source = &s->source();
  req.source_placement = &s->source_placement;
  req.alive = s->alive;
  // As the coordinator runs it: each save keeps what one host alone holds
  // of the small objects.
  req.small_objects_kept = true;
  std::vector<std::string> names;
  for (const Host& h : s->cluster.hosts) names.push_back(h.name);
  const absl::Time start = absl::Now();
  PTC_ASSIGN_OR_RETURN(s->placement, PlaceJob(options, std::move(req), names));
  s->placement_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  s->placement_strategy = PlacementStrategy(options);
  s->target_placement = s->placement.placement;
  return absl::OkStatus();
}

}  // namespace ptc
