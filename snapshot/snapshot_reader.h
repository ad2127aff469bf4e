// Reads parts of regions back from a snapshot's files: for a piece inside a
// region, only the checksum blocks of the file that hold the piece's bytes
// are read (pread, in windows of up to 16 MiB), each checked against the
// manifest before a byte of it is used. A missing or short file, or a block
// that does not match, is DATA_LOSS naming the file, tensor and region.
//
//   SnapshotReader reader(dir);
//   PTC_RETURN_IF_ERROR(reader.Read(entry, "w", piece, 4, consume));
#ifndef PTC_SNAPSHOT_SNAPSHOT_READER_H_
#define PTC_SNAPSHOT_SNAPSHOT_READER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/snapshot.pb.h"
#include "ptc/region.h"

namespace ptc {

class SnapshotReader {
 public:
  explicit SnapshotReader(std::string dir) : dir_(std::move(dir)) {}
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  // Receives [offset, offset + n) of the piece's row-major bytes.
  using Consumer =
      std::function<void(int64_t offset, const char* src, int64_t n)>;

  // Streams `piece` (inside entry.region; tensor `key`, elements of
  // `element_size` bytes) to `consume`, in row-major order. Thread-safe.
  // Adds the bytes read from the file to `*read` if given.
  absl::Status Read(const proto::SnapshotRegion& entry, const std::string& key,
                    const Region& piece, int64_t element_size,
                    const Consumer& consume, int64_t* read = nullptr);

 private:
  absl::StatusOr<int> File(const std::string& name);

  std::string dir_;
  absl::Mutex mu_;
  std::map<std::string, int> fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_SNAPSHOT_SNAPSHOT_READER_H_
