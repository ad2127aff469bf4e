// How a change reads from a snapshot: the plan's pieces with source host
// kFromSnapshot are split along the snapshot's stored regions (each piece
// is then read from one file region), each target host is sent the regions
// and small objects it reads, and the change is proven against the
// fingerprints the snapshot recorded.
#ifndef PTC_PLAN_SNAPSHOT_PLAN_H_
#define PTC_PLAN_SNAPSHOT_PLAN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "plan/plan.h"
#include "proto/snapshot.pb.h"
#include "proto/transformer.pb.h"
#include "ptc/model_spec.h"

namespace ptc {

// The name of the host a restore's source layout is placed on.
inline constexpr char kSnapshotHostName[] = "(snapshot)";

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
