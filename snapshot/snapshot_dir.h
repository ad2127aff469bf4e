// Snapshot directories on a filesystem: ROOT/snapshot-<version, 12
// digits>/ holds a snapshot's safetensors files and, once it is complete,
// manifest.json (written last, atomically). A directory without a manifest
// is a snapshot that was cut short: never read, removed by the next
// snapshot's retention.
//
//   PTC_RETURN_IF_ERROR(CheckSnapshotRoot(root, allowed_root));
//   PTC_ASSIGN_OR_RETURN(LatestSnapshotResult latest,
//                        LatestSnapshot(root, "run7"));
#ifndef PTC_SNAPSHOT_SNAPSHOT_DIR_H_
#define PTC_SNAPSHOT_SNAPSHOT_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/snapshot.pb.h"

namespace ptc {

inline constexpr char kSnapshotFormat[] = "ptc-snapshot-1";
inline constexpr char kManifestName[] = "manifest.json";
// The manifest is read whole; larger ones are refused.
inline constexpr int64_t kMaxManifestBytes = int64_t{512} << 20;

// OK if `root` is an absolute path without "." or ".." components (at most
// 4096 bytes) and, if `allowed` is not empty, `allowed` or inside it.
absl::Status CheckSnapshotRoot(const std::string& root,
                               const std::string& allowed);

// "snapshot-000000000042".
std::string SnapshotDirName(int64_t version);

// A plain file name of a snapshot's directory: letters, digits, ". _ -",
// at most 255 bytes, not starting with ".".
absl::Status CheckSnapshotFileName(const std::string& name);

// The manifest as JSON (proto field names, indented), and back. Reading
// checks the format tag and that regions, files and tensors fit together
// (every region's tensor, file and byte range; block checksums enough for
// its bytes); DATA_LOSS names what is wrong.
std::string ManifestToJson(const proto::SnapshotManifest& manifest);
absl::StatusOr<proto::SnapshotManifest> ManifestFromJson(
    const std::string& json, const std::string& where);

// Reads and checks DIR/manifest.json; NOT_FOUND if it does not exist (the
// snapshot is not complete).
absl::StatusOr<proto::SnapshotManifest> ReadManifest(const std::string& dir);
// Writes DIR/manifest.json atomically (temporary file, fsync, rename,
// fsync of DIR): from then on the snapshot is complete.
absl::Status WriteManifest(const std::string& dir,
                           const proto::SnapshotManifest& manifest);

struct LatestSnapshotResult {
  std::string dir;
  proto::SnapshotManifest manifest;
};
// The newest complete snapshot of `job` under `root`. NOT_FOUND if there
// is none; FAILED_PRECONDITION if the newest is of another job.
absl::StatusOr<LatestSnapshotResult> LatestSnapshot(const std::string& root,
                                                    const std::string& job);

// Keeps the newest `keep` complete snapshots of `job` under `root` and
// removes older ones and every incomplete snapshot directory except
// `keep_dir` (the one being written). Returns the removed directories.
absl::StatusOr<std::vector<std::string>> RetainSnapshots(
    const std::string& root, const std::string& job, int keep,
    const std::string& keep_dir);

}  // namespace ptc

#endif  // PTC_SNAPSHOT_SNAPSHOT_DIR_H_
