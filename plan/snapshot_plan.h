// Who writes what into a job's snapshot (AssignSnapshotWriters), and how a
// change reads from a snapshot: the plan's pieces with source host
// kFromSnapshot are split along the snapshot's stored regions (each piece
// is then read from one file region), each target host is sent the regions
// and small objects it reads, and the change is proven against the
// fingerprints the snapshot recorded.
#ifndef PTC_PLAN_SNAPSHOT_PLAN_H_
#define PTC_PLAN_SNAPSHOT_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan/plan.h"
#include "proto/snapshot.pb.h"
#include "proto/transformer.pb.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"

namespace ptc {

// The name of the host a restore's source layout is placed on.
inline constexpr char kSnapshotHostName[] = "(snapshot)";

// Which host writes which regions of a version into the job's snapshot.
struct SnapshotWriters {
  // Host id -> the (tensor, region) pairs it writes, in the order its file
  // lists them. Each element of every tensor is written exactly once.
  std::map<int32_t, std::vector<std::pair<int32_t, Region>>> regions;
  // Host id -> bytes it writes.
  std::map<int32_t, int64_t> bytes;
};

// Every region of every tensor once, from a host that holds it: a tensor
// whose distinct regions tile it goes region by region, largest first, to
// the holder with the fewest bytes so far (ties: the first rank's host);
// one whose regions overlap (ZeRO-1 of tp-replicated tensors) is split as
// a disjoint cover of its holders, each part inside one region its writer
// stores. `rank_host[r]` is rank r's host id (-1: none), `holds[h]`
// whether host h holds the version (alive, not lost). FAILED_PRECONDITION
// names a region no holder has (`version` says which).
absl::StatusOr<SnapshotWriters> AssignSnapshotWriters(
    const ModelSpec& spec, const Layout& layout,
    const std::vector<int32_t>& rank_host, const std::vector<bool>& holds,
    int64_t version);

// The writers of `parts` ((tensor, region) pairs a writer that failed was
// to write) among the hosts still holding: each part from a host one of
// whose ranks holds all of it, the least loaded so far. FAILED_PRECONDITION
// names a part no such host holds.
absl::StatusOr<SnapshotWriters> ReassignSnapshotParts(
    const ModelSpec& spec, const Layout& layout,
    const std::vector<int32_t>& rank_host, const std::vector<bool>& holds,
    const std::vector<std::pair<int32_t, Region>>& parts, int64_t version);

// FAILED_PRECONDITION unless the snapshot's tensors are the spec's (same
// keys, dtypes and shapes, in order).
absl::Status CheckSnapshotFitsSpec(const proto::SnapshotManifest& manifest,
                                   const ModelSpec& spec);

// Splits every kFromSnapshot transfer along the manifest's regions of its
// tensor. INVALID_ARGUMENT if the regions do not cover a piece.
absl::Status SplitSnapshotPieces(const proto::SnapshotManifest& manifest,
                                 Plan* plan);

// What host `f` reads from the snapshot in `dir`: the manifest's regions
// its pieces lie in and the small objects it takes from it.
proto::SnapshotSource SnapshotSourceFor(const proto::SnapshotManifest& manifest,
                                        const std::string& dir,
                                        const Plan& plan,
                                        const HostFragment& f);

// Per tensor: the sum of the snapshot's region fingerprints and elements
// (the tensor's fingerprint, as the source version had it).
std::vector<std::pair<uint64_t, int64_t>> SnapshotFingerprints(
    const proto::SnapshotManifest& manifest);

}  // namespace ptc

#endif  // PTC_PLAN_SNAPSHOT_PLAN_H_
