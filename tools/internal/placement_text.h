// How ptcctl shows a placement and reads one: the text and JSON forms of
// a PlanSummary's placement, and the --placement / --colocate options
// that `ptcctl plan`, `register`, `reconfigure` and `prepare` share.
#ifndef PTC_TOOLS_INTERNAL_PLACEMENT_TEXT_H_
#define PTC_TOOLS_INTERNAL_PLACEMENT_TEXT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "common/json_writer.h"
#include "proto/coordinator.pb.h"

namespace ptc::tools {

// {"strategy", "ranks": [{"rank", "host", "gpu"}], "released_hosts",
// "survival", "survives_host_loss"}.
void WritePlacement(const proto::PlanSummary& p, JsonWriter* w);

// "0-3,8" for a sorted list of numbers.
std::string Spans(const std::vector<int>& v);

// One line per host (its ranks and their GPUs), at most `max_hosts` of
// them (0: all), then the released hosts and which losses it survives.
std::string FormatPlacement(const proto::PlanSummary& p, int max_hosts = 0);

// --placement ptc|contiguous|FILE ("HOST GPU" per rank), --colocate and
// --prefer-movement (a flag).
absl::StatusOr<proto::PlacementOptions> PlacementFlags(const Args& args);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_PLACEMENT_TEXT_H_
