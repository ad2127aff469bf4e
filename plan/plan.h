// A reconfiguration plan: for every target host, the regions it will hold
// and where each piece of them comes from. Produced by the planner
// (planner.h), checked by the validator (plan_validator.h), written as JSON
// (plan_json.h), executed by the state transformers on each host.
#ifndef PTC_PLAN_PLAN_H_
#define PTC_PLAN_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "plan/piece.h"
#include "proto/plan.pb.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"
#include "ptc/region.h"

namespace ptc {

// Why planning or a change failed, carried as a payload of its status:
// callers decide by it (retry from a snapshot, name silent hosts), never
// by the message's text, which is for people.
enum class PlanFailure {
  // Some region (or small object) has no live holder left.
  kNoSurvivingCopy,
  // A host the change needs went silent while it ran.
  kHostWentSilent,
};
inline constexpr char kPlanFailureUrl[] = "ptc/plan-failure";

inline absl::Status WithPlanFailure(absl::Status status, PlanFailure why) {
  status.SetPayload(kPlanFailureUrl,
                    absl::Cord(why == PlanFailure::kNoSurvivingCopy
                                   ? "no-surviving-copy"
                                   : "host-went-silent"));
  return status;
}

inline bool HasPlanFailure(const absl::Status& status, PlanFailure why) {
  const auto payload = status.GetPayload(kPlanFailureUrl);
  return payload.has_value() &&
         *payload == (why == PlanFailure::kNoSurvivingCopy
                          ? "no-surviving-copy"
                          : "host-went-silent");
}

// Everything a plan is computed from. Pointers are borrowed; they must
// outlive the call that takes the input.
struct PlanInput {
  const ModelSpec* spec = nullptr;
  // Hosts of both placements; host ids index cluster->hosts.
  const Cluster* cluster = nullptr;
  const Layout* source = nullptr;
  const Placement* source_placement = nullptr;
  const Layout* target = nullptr;
  const Placement* target_placement = nullptr;
  // alive[h] for every cluster host; empty means every host is alive.
  std::vector<bool> alive;
  // Hosts that are alive but lost the source version (a ptcd that
  // restarted): their shards are left out of `source` by the caller, and
  // they provide no small objects either.
  std::vector<int> source_lost;

  // late[h]: host h is alive but its heartbeats are late (a cut link, a
  // stalled machine). A late host sends only what no other live host
  // holds, so that a change does not wait on a host that may be gone while
  // another copy is at hand. Empty: none is late.
  std::vector<bool> late;

  // Regions and small objects no live host holds come from the job's
  // snapshot of the source version: transfers and small-object moves with
  // source host kFromSnapshot (instead of failing the plan).
  bool snapshot_source = false;

  // Whether the coordinator keeps a copy of small object `name` as source
  // rank `rank` saved it (it keeps those whose every copy is on one host).
  // A move with no other copy on a live host takes it (source host
  // kFromCoordinator, or as the last resort during the change). Empty:
  // none is kept.
  std::function<bool(const std::string& name, int32_t rank)> kept;

  bool IsAlive(int host) const { return alive.empty() || alive[host]; }
  bool IsLate(int host) const {
    return host >= 0 && host < static_cast<int>(late.size()) && late[host];
  }
  bool HoldsSource(int host) const {
    return IsAlive(host) && std::find(source_lost.begin(), source_lost.end(),
                                      host) == source_lost.end();
  }
};

// A region a target host's store will hold in the new version.
struct HeldRegion {
  int32_t tensor = 0;
  Region region;
  // The host's store holds exactly this region of the source version: it
  // stays as it is and no transfer lists it (a piece from the host itself;
  // see ForEachPiece). Most of a failure's recovery is such regions.
  bool kept_in_place = false;
};

struct HostFragment {
  int32_t host = 0;
  // Distinct regions the host holds after the change (ranks on the host
  // that need the same region share it). Distinct regions may overlap:
  // ZeRO-1 shards the optimizer state of a tp-replicated parameter
  // differently in each tp rank's buffer.
  std::vector<HeldRegion> holds;
  // Pieces that fill the holds not kept in place: local copies and pieces
  // from peers. With the kept holds they cover the union of `holds`
  // exactly once; a piece is copied into every held region it intersects.
  std::vector<Transfer> transfers;
};

// Calls fn(const Transfer&) for every piece of `f`: each kept-in-place
// hold as a piece from the host itself, then the transfers. What goes on
// the wire and into plan files is this list.
template <typename Fn>
void ForEachPiece(const HostFragment& f, Fn&& fn) {
  for (const HeldRegion& h : f.holds) {
    if (h.kept_in_place) fn(Transfer{h.tensor, h.region, f.host, f.host, -1});
  }
  for (const Transfer& x : f.transfers) fn(x);
}

struct PlanSummary {
  // Bytes the target hosts hold after the change, each element counted once
  // per host. kept_in_place + copied_within_host + cross_host add up to it.
  int64_t target_bytes = 0;
  // Held regions identical to one the host already stores: no copy at all.
  int64_t kept_in_place_bytes = 0;
  // Bytes the host already had, copied into new region boundaries.
  int64_t copied_within_host_bytes = 0;
  // Bytes sent between hosts, and the least any plan must send: what each
  // host needs minus what it already holds.
  int64_t cross_host_bytes = 0;
  int64_t cross_host_bytes_lower_bound = 0;
  // Bytes the ranks sharing a host would have fetched twice without
  // host-level dedup.
  int64_t dedup_saved_bytes = 0;
  // The largest number of bytes one host sends, and its lower bound: the
  // optimum when pieces may be split across replicas arbitrarily
  // (fractional optimum, rounded up to whole bytes).
  int64_t max_host_send_bytes = 0;
  int64_t max_host_send_bytes_lower_bound = 0;
  int32_t max_host_send_host = -1;
  // The same in seconds at each host's link bandwidth (what the planner
  // balances when bandwidths differ).
  double max_host_send_seconds = 0;
  double max_host_send_seconds_lower_bound = 0;
  int64_t transfers = 0;
  int64_t small_object_moves = 0;
  // Wall time to compute the plan; filled by the caller who timed it.
  double plan_seconds = 0;
  // Bytes read from the snapshot (regions no live host held).
  int64_t snapshot_bytes = 0;
  // Per cluster host.
  std::vector<int64_t> host_send_bytes;
  std::vector<int64_t> host_receive_bytes;
};

struct Plan {
  // The planner's or the comparison baseline's.
  proto::PlanStrategy strategy = proto::PLAN_STRATEGY_PTC;
  // True for per-rank plans: every target rank fetches its own pieces.
  bool per_rank = false;
  std::vector<HostFragment> fragments;
  std::vector<SmallObjectMove> small_objects;
  PlanSummary summary;
};

}  // namespace ptc

#endif  // PTC_PLAN_PLAN_H_
