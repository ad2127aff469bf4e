#include "proto/enum_names.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ptc {
namespace {

std::string Short(const std::string& full, absl::string_view prefix) {
  return absl::AsciiStrToLower(absl::StripPrefix(full, prefix));
}

// Every value of an enum whose values are 0..n-1, by its short name.
template <typename E>
absl::StatusOr<E> Parse(absl::string_view name, const char* what,
                        absl::string_view prefix, int count,
                        const std::string& (*full)(E)) {
  std::vector<std::string> names;
  for (int v = 0; v < count; ++v) {
    names.push_back(Short(full(static_cast<E>(v)), prefix));
    if (names.back() == name) return static_cast<E>(v);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", name, "' is unknown; use ", absl::StrJoin(names, ", ")));
}

}  // namespace

std::string PhaseName(proto::ReconfigurePhase phase) {
  return Short(proto::ReconfigurePhase_Name(phase), "PHASE_");
}

std::string TransportName(proto::Transport transport) {
  return Short(proto::Transport_Name(transport), "TRANSPORT_");
}

std::string StrategyName(proto::PlanStrategy strategy) {
  return Short(proto::PlanStrategy_Name(strategy), "PLAN_STRATEGY_");
}

std::string PlacementName(proto::PlacementStrategy placement) {
  return Short(proto::PlacementStrategy_Name(placement), "PLACEMENT_");
}

bool PhaseEnded(proto::ReconfigurePhase phase) {
  return phase == proto::PHASE_COMMITTED || phase == proto::PHASE_ABORTED;
}

absl::StatusOr<proto::Transport> ParseTransport(absl::string_view name) {
  if (name.empty()) return proto::TRANSPORT_AUTO;
  return Parse<proto::Transport>(name, "transport", "TRANSPORT_",
                                 proto::Transport_ARRAYSIZE,
                                 &proto::Transport_Name<proto::Transport>);
}

absl::StatusOr<proto::PlanStrategy> ParseStrategy(absl::string_view name) {
  if (name.empty()) return proto::PLAN_STRATEGY_PTC;
  return Parse<proto::PlanStrategy>(
      name, "strategy", "PLAN_STRATEGY_", proto::PlanStrategy_ARRAYSIZE,
      &proto::PlanStrategy_Name<proto::PlanStrategy>);
}

absl::StatusOr<proto::PlacementStrategy> ParsePlacement(
    absl::string_view name) {
  if (name.empty()) return proto::PLACEMENT_PTC;
  return Parse<proto::PlacementStrategy>(
      name, "placement", "PLACEMENT_", proto::PlacementStrategy_ARRAYSIZE,
      &proto::PlacementStrategy_Name<proto::PlacementStrategy>);
}

}  // namespace ptc
