// Writes regions of a committed version from a host's store into one
// safetensors file of a snapshot: the header first (every region a tensor
// named "KEY[REGION]"), then each region's row-major bytes, straight from
// the store's sealed buffers, under a temporary name; fsync, rename, fsync
// of the directory. Every block of each region is checksummed as it is
// written (xxh3-64), for readers of part of a region.
//
//   PTC_ASSIGN_OR_RETURN(proto::SnapshotProgress done,
//       WriteSnapshotFile(&store, {.job = "run7", .version = 12,
//                                  .dir = dir, .file = "host0.safetensors",
//                                  .regions = regions}));
#ifndef PTC_SNAPSHOT_SNAPSHOT_WRITER_H_
#define PTC_SNAPSHOT_SNAPSHOT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/transformer.pb.h"
#include "tensor_store/store.h"

namespace ptc {

// Block size of the checksums a region's bytes are read back by.
inline constexpr int64_t kSnapshotBlockBytes = int64_t{1} << 20;
// Most regions one file takes.
inline constexpr int kMaxSnapshotRegions = 1'000'000;

struct SnapshotFileRequest {
  std::string job;
  int64_t version = 0;  // committed in the store
  std::string dir;      // the snapshot's directory (created if missing)
  std::string file;     // a plain file name in it
  // (tensor key, region): each inside one stored region of the version.
  std::vector<std::pair<std::string, Region>> regions;
  int64_t max_bytes_per_second = 0;  // 0: unthrottled
  // While it returns true, writing waits (a change is staging here).
  std::function<bool()> paused;
  // Cancels the write (the file is removed).
  const std::atomic<bool>* cancel = nullptr;
  // Called after every chunk with (bytes written, bytes in all).
  std::function<void(int64_t, int64_t)> progress;
};

// Returns the last progress message: done, the file, and each region's
// place (tensor: the index in `regions`). On any error nothing is left
// under the file's name or the temporary one. A full disk is
// RESOURCE_EXHAUSTED naming the file.
absl::StatusOr<proto::SnapshotProgress> WriteSnapshotFile(
    Store* store, const SnapshotFileRequest& request);

}  // namespace ptc

#endif  // PTC_SNAPSHOT_SNAPSHOT_WRITER_H_
