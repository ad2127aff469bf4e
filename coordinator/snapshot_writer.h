// Writing a snapshot of a job's committed version, the coordinator's side
// (the hosts' side is the transformer's WriteSnapshot): which live holder
// writes which regions (AssignSnapshotWriters, plan/snapshot_plan.h), the
// small objects gathered from the hosts that saved them, every writer's
// file in parallel (a writer that fails is replaced by other holders, up
// to three rounds), and the manifest last, which makes the snapshot
// complete. It holds no coordinator state: the coordinator hands it what
// it knows of the job and records the result.
//
//   SnapshotJob in = ...;  // the job's record and the hosts, copied
//   PTC_ASSIGN_OR_RETURN(SnapshotWritten w, WriteSnapshot(in, progress));
//   job.state.set_snapshot_version(w.event.version());
#ifndef PTC_COORDINATOR_SNAPSHOT_WRITER_H_
#define PTC_COORDINATOR_SNAPSHOT_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/kept_small_objects.h"
#include "proto/coordinator.pb.h"
#include "proto/snapshot.pb.h"
#include "proto/transformer.grpc.pb.h"
#include "ptc/model_spec.h"

namespace ptc {

// Snapshots kept under a root unless the job says (and at most).
inline constexpr int kDefaultSnapshotKeep = 3;
inline constexpr int kMaxSnapshotKeep = 1000;

// What a snapshot writes, as the coordinator holds it.
struct SnapshotJob {
  std::string job;
  std::string root;  // the directory the hosts write under
  std::shared_ptr<const ModelSpec> spec;
  // The job's record: its committed version and step, config, layout or
  // model, lost hosts, how many snapshots to keep and the write rate.
  proto::CoordinatorState::Job state;
  // The host of each rank of the committed layout.
  std::vector<std::string> rank_hosts;
  // The registered hosts (ids index `names`): alive or not, addresses.
  std::vector<std::string> names;
  std::vector<bool> alive;
  std::map<int32_t, std::string> addresses;
  // The copies the coordinator keeps of the committed version's small
  // objects (null: none): a rank whose host is dead takes them from here
  // where no live rank holds the same copy.
  std::shared_ptr<const KeptSmallObjects> kept;
};

struct SnapshotWritten {
  // done, with its directory, files, bytes, seconds and the snapshots
  // removed beyond those kept.
  proto::SnapshotEvent event;
  int64_t created_unix = 0;  // the manifest's
};

// Writes the snapshot; `progress` (may be empty) sees the bytes written so
// far. FAILED_PRECONDITION when a small object of a rank whose host is
// dead or lost it has no other copy (on a live host, kept by the
// coordinator) and no fresh value, or a region has no live holder left;
// the writers' errors otherwise, annotated with the host.
absl::StatusOr<SnapshotWritten> WriteSnapshot(
    const SnapshotJob& in,
    const std::function<void(const proto::SnapshotEvent&)>& progress);

// A client of a host's transformer that takes messages as large as a
// snapshot's manifest.
std::unique_ptr<proto::Transformer::Stub> SnapshotStub(
    const std::string& address);

// A host's snapshot file name: its name, with characters a file name
// cannot hold replaced.
std::string SnapshotFileFor(const std::string& host);

}  // namespace ptc

#endif  // PTC_COORDINATOR_SNAPSHOT_WRITER_H_
