// The hot switch's plan: ptc's plan (planner.h) between the processes of a
// live job instead of between hosts' stores. The planner decides which
// host sends each piece (nothing crosses hosts that the receiving host
// holds, senders balanced); this chooses, on that host, the process that
// sends it (the receiving process itself when it holds the piece, else
// the least loaded holder), and gives every target rank its own copy of
// each of its regions (processes share no memory, unlike ranks in one
// ptcd). Every process computes the same plan from the same inputs, so
// senders and receivers agree without talking.
//
//   PTC_ASSIGN_OR_RETURN(ProcessPlan p, PlanProcessSwitch(input));
//   for (const ProcessTransfer& x : p.transfers)
//     if (x.source_rank == my_old_rank) ... send x.region of x.tensor
#ifndef PTC_PLAN_HOT_PLAN_H_
#define PTC_PLAN_HOT_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/plan.h"

namespace ptc {

// A piece of one of target_rank's regions, sent by the process of
// source_rank (a rank of the source layout).
struct ProcessTransfer {
  int32_t tensor = 0;
  Region region;
  int32_t source_rank = 0;
  int32_t target_rank = 0;
};

struct ProcessPlan {
  // Ordered by target rank, tensor, then the piece's place in the
  // target's region: the order of the bytes on the wire.
  std::vector<ProcessTransfer> transfers;
  // The store plan's small-object moves (source ranks are source-layout
  // ranks; derive_from set: a fresh value, as the store would derive).
  std::vector<SmallObjectMove> small_objects;
  // Bytes every target rank receives in all; of them, what another
  // process sends, and what comes from another host.
  int64_t bytes = 0;
  int64_t bytes_between_processes = 0;
  int64_t bytes_between_hosts = 0;
  // The host-level plan it follows.
  PlanSummary host_plan;
};

// INVALID_ARGUMENT / FAILED_PRECONDITION as PlanReconfiguration; every
// host must be alive (a hot switch runs only while every process does).
absl::StatusOr<ProcessPlan> PlanProcessSwitch(const PlanInput& input);

}  // namespace ptc

#endif  // PTC_PLAN_HOT_PLAN_H_
