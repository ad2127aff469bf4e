// The wire enums as people and `--json` read them: lower case without the
// prefix (PHASE_STAGING is "staging", TRANSPORT_UCX "ucx", PLAN_STRATEGY_PTC
// "ptc"), and the parsers of what ptcctl's flags take. The names come from
// the enums themselves, so the documented lists cannot drift.
//
//   std::cout << PhaseName(event.phase());  // "committed"
//   PTC_ASSIGN_OR_RETURN(proto::Transport t, ParseTransport("grpc"));
#ifndef PTC_PROTO_ENUM_NAMES_H_
#define PTC_PROTO_ENUM_NAMES_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "proto/plan.pb.h"

namespace ptc {

std::string PhaseName(proto::ReconfigurePhase phase);
std::string TransportName(proto::Transport transport);
std::string StrategyName(proto::PlanStrategy strategy);
std::string PlacementName(proto::PlacementStrategy placement);

// True for COMMITTED and ABORTED.
bool PhaseEnded(proto::ReconfigurePhase phase);

// "" and "auto" are TRANSPORT_AUTO; INVALID_ARGUMENT lists the names.
absl::StatusOr<proto::Transport> ParseTransport(absl::string_view name);
// "" is PLAN_STRATEGY_PTC; INVALID_ARGUMENT lists the names.
absl::StatusOr<proto::PlanStrategy> ParseStrategy(absl::string_view name);
// "" is PLACEMENT_PTC; INVALID_ARGUMENT lists the names.
absl::StatusOr<proto::PlacementStrategy> ParsePlacement(absl::string_view name);

}  // namespace ptc

#endif  // PTC_PROTO_ENUM_NAMES_H_
