// Where a job's ranks run: the coordinator's choice of host and GPU for
// every rank of a target layout, the one that makes a change shortest and
// then moves the fewest bytes across hosts.
//
// Ranks that must share a host (by default a tp group: equal on every axis
// but tp) form units; consecutive units form blocks, in rank order (the dp
// replicas of one stage, Megatron's order) or replica by replica (a
// stage's replicas on different hosts), as large as the hosts take or
// smaller, down to spreading the job over every candidate (where its
// state already lies on more hosts than it needs, spread moves less).
// The grouping with the largest share of hosts whose loss leaves a copy
// of everything wins (`survive`: recoverability first), then the shorter
// change, then the fewest bytes. A small job (up to 32 units on up to 32 hosts)
// is then searched further: every assignment of units to hosts where there are
// at most 4,096, else local moves (a unit, or a host's replicas of one
// stage, to another host, or exchanged) from each grouping's placement,
// chosen by the same rule. A block needs the
// distinct regions of its ranks; a host holds what its ranks held in the
// committed version. Assigning blocks to hosts is a transportation problem
// between classes of equal blocks and classes of equal hosts (a stage's
// dp replicas need the same regions; hosts of one old stage hold the
// same): solved exactly, first for the smallest largest per-host receive
// time (bytes a host needs and lacks, over its link bandwidth, within a
// small slack), then for the fewest bytes across hosts, each host's GPUs, the
// devices other jobs use and its store memory (old and new version side by
// side) respected. Candidate hosts beyond what the job needs are released.
//
//   PlacementRequest req{&spec, &cluster, &target_layout, candidate_hosts};
//   req.source = &committed_layout; req.source_placement = &where;
//   PTC_ASSIGN_OR_RETURN(PlacementResult r, ChoosePlacement(req));
#ifndef PTC_PLAN_PLACEMENT_H_
#define PTC_PLAN_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"

namespace ptc {

struct PlacementRequest {
  const ModelSpec* spec = nullptr;
  const Cluster* cluster = nullptr;
  // The layout to place; it must come from a parallel config.
  const Layout* target = nullptr;
  // Host ids the ranks may use, in order of preference (ties go to the
  // earlier host, and so do blocks when no data sits anywhere yet).
  std::vector<int> hosts;

  // The committed state, for a change (null at registration).
  const Layout* source = nullptr;
  const Placement* source_placement = nullptr;
  // alive[h] per cluster host (empty: all); hosts that lost the source
  // version (restarted ptcd) hold nothing.
  std::vector<bool> alive;
  std::vector<int> source_lost;

  // Mesh axes whose groups of ranks must share a host; empty: none.
  std::vector<std::string> colocate = {"tp"};
  // Per cluster host (empty: none): GPU indices other jobs use.
  std::vector<std::vector<int32_t>> taken;
  // Largest receive times within this fraction of the least count as
  // equal, and among them the fewest bytes across hosts wins: a placement
  // 0.4% slower on its busiest receiver that moves a third fewer bytes
  // (and spreads the sends over more holders) is the better change.
  double duration_slack = 0.05;
  // Per cluster host (empty: unlimited): store bytes this job may hold
  // there at once (the ptcd's memory less other jobs' state); < 0:
  // unlimited.
  std::vector<int64_t> memory;
  // Recoverability first: where the ranks can be placed in more than one
  // way, the placement with the largest share of hosts whose loss alone
  // keeps a copy of every region wins (a stage's dp replicas on different
  // hosts), before the receive time and the bytes moved. false: movement alone,
  // with the groupings of rank order only (the dp replicas of a stage side by
  // side).
  bool survive = true;
  // The coordinator keeps a copy of every small object whose copies are
  // all on one host (SmallObjectClasses): a host's or domain's loss then
  // loses none, and the survival report counts regions only.
  bool small_objects_kept = false;
};

// Which single failure domain's loss a placement of `layout` survives
// from memory: a host's, or a domain's (Host::domain and each of its
// prefixes), survived when every region its ranks hold is held by a rank
// elsewhere too.
struct SurvivalReport {
  struct Loss {
    std::string domain;   // a host's name, or a domain path ("rack1")
    std::string example;  // what only it holds: "tensor 'w' [0:64, 0:128]"
  };
  int hosts = 0;                     // hosts the placement uses
  std::vector<Loss> hosts_lost;      // hosts whose loss loses a region
  std::vector<std::string> domains;  // the domains of those hosts
  std::vector<Loss> domains_lost;
  // On more than one host, and no host's loss loses a region.
  bool SurvivesAnyHost() const { return hosts > 1 && hosts_lost.empty(); }
  // "survives the loss of any one host; of domain rack1: no (tensor 'w'
  // [0:64, 0:128] is only there)".
  std::string Describe() const;
};
struct PlacementResult {
  Placement placement;
  // Candidate hosts that get no rank.
  std::vector<int> released;
  // Sum over hosts of the bytes a host needs and does not hold: what the
  // planner sends across hosts for this placement.
  int64_t cross_host_bytes = 0;
  // The largest of those per host, in seconds at the host's bandwidth.
  double max_receive_seconds = 0;
  // Store bytes of the new version on each cluster host (0 off the job),
  // and of the committed version it holds meanwhile.
  std::vector<int64_t> host_bytes;
  std::vector<int64_t> host_old_bytes;
  // Which single host's or domain's loss it survives from memory.
  SurvivalReport survival;
  // ChoosePlacement tried every assignment of the target's tp groups to
  // the candidates (a small change within the search's budget), or its
  // choice moves nothing and survives every loss it can: no placement is
  // better by its order. False where it searched by descents from its
  // groupings' placements (their local best), or did not search.
  bool proven_best = false;
};

// The placement described above. INVALID_ARGUMENT: a layout without a
// config, an unknown colocate axis, a unit larger than any host;
// RESOURCE_EXHAUSTED: not enough GPUs or store memory (the message names
// the hosts, GPUs and bytes).
absl::StatusOr<PlacementResult> ChoosePlacement(const PlacementRequest& req);

// Today's rule, for comparison: ranks fill the hosts in the order given,
// GPU 0 upwards (the constraints are not consulted). Its result carries
// the same measures as ChoosePlacement's.
absl::StatusOr<PlacementResult> ContiguousPlacementResult(
    const PlacementRequest& req);

// The measures of a given placement of req.target (cross-host bytes, the
// largest receive time, store bytes per host), for tests and comparisons.
absl::StatusOr<PlacementResult> EvaluatePlacement(const PlacementRequest& req,
                                                  const Placement& placement);

// Checks a placement made by other means (contiguous, explicit) against
// req's constraints: no device another job uses, and every host's old and
// new bytes within its memory. RESOURCE_EXHAUSTED names the host.
absl::Status CheckPlacementFits(const PlacementRequest& req,
                                const PlacementResult& result);

// CheckSurvival: the report above for a placement of `layout` on
// `cluster`.
SurvivalReport CheckSurvival(const ModelSpec& spec, const Layout& layout,
                             const Placement& placement, const Cluster& cluster,
                             bool small_objects_kept = false);

// The classes of ranks of `config` that hold the same copy of a small
// object a new rank can only copy (NewRankRule::kCopy): those that agree
// on its scope's axes. For each, the object's index in spec.small_objects,
// its first rank, and the group all its ranks are in (group_of(rank)), or
// -2 where they span groups. A class in one group (a host) holds the
// object's only copies there: a rank's own object (every axis in scope)
// always; an object per data-parallel rank when a replica is on one host.
struct SmallObjectClass {
  int object = 0;
  int first_rank = 0;
  int group = 0;
};
std::vector<SmallObjectClass> SmallObjectClasses(
    const ModelSpec& spec, const ParallelConfig& config,
    const std::function<int(int)>& group_of);

// Store bytes each cluster host holds of `layout` placed by `placement`
// (distinct regions of its ranks), indexed by host id.
std::vector<int64_t> HostStateBytes(const ModelSpec& spec, const Layout& layout,
                                    const Placement& placement, int num_hosts);

}  // namespace ptc

#endif  // PTC_PLAN_PLACEMENT_H_
