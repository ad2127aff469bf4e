#include "snapshot/snapshot_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "snapshot/snapshot_dir.h"

namespace ptc {
namespace {

constexpr int64_t kWindowBytes = int64_t{16} << 20;

}  // namespace

SnapshotReader::~SnapshotReader() {
  for (const auto& [name, fd] : fds_) ::close(fd);
}

absl::StatusOr<int> SnapshotReader::File(const std::string& name) {
  PTC_RETURN_IF_ERROR(CheckSnapshotFileName(name));
  absl::MutexLock lock(&mu_);
  auto it = fds_.find(name);
  if (it != fds_.end()) return it->second;
  const std::string path = dir_ + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::DataLossError(absl::StrCat(
        "snapshot file ", path, " cannot be opened: ", std::strerror(errno)));
  }
  fds_[name] = fd;
  return fd;
}

absl::Status SnapshotReader::Read(const proto::SnapshotRegion& entry,
                                  const std::string& key, const Region& piece,
                                  int64_t element_size, const Consumer& consume,
                                  int64_t* read) {
  PTC_ASSIGN_OR_RETURN(const Region stored, RegionFromProto(entry.region()));
  const std::string where =
      absl::StrCat("snapshot file ", dir_, "/", entry.file(), ", region ",
                   stored.ToString(), " of tensor '", key, "'");
  if (stored.rank() != piece.rank() || !stored.Contains(piece)) {
    return absl::InvalidArgumentError(
        absl::StrCat("piece ", piece.ToString(), " is not inside ", where));
  }
  const int64_t bytes = stored.volume() * element_size;
  const int64_t block = entry.block_bytes();
  if (bytes != entry.bytes() || (bytes > 0 && block <= 0) ||
      (bytes > 0 &&
       entry.block_checksums_size() != (bytes + block - 1) / block)) {
    return absl::DataLossError(
        absl::StrCat(where, ": the manifest's sizes do not fit the region"));
  }
  if (piece.empty()) return absl::OkStatus();
  PTC_ASSIGN_OR_RETURN(const int fd, File(entry.file()));
  // The last byte the piece needs: no window reads past its block.
  int64_t last = 0;
  ForEachRun(stored, piece, piece, element_size,
             [&](int64_t src, int64_t, int64_t n) { last = src + n; });
  const int64_t limit = std::min(bytes, (last + block - 1) / block * block);
  std::vector<char> window(static_cast<size_t>(
      std::min(limit, std::max(block, kWindowBytes / block * block))));
  int64_t wa = 0, wb = 0;  // the window holds region bytes [wa, wb)
  absl::Status status;
  auto load = [&](int64_t at) -> absl::Status {
    wa = at / block * block;
    wb = std::min(limit, wa + static_cast<int64_t>(window.size()));
    int64_t got = 0;
    while (got < wb - wa) {
      const ssize_t n =
          ::pread(fd, window.data() + got, static_cast<size_t>(wb - wa - got),
                  entry.offset() + wa + got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::DataLossError(
            absl::StrCat(where, ": reading: ", std::strerror(errno)));
      }
      if (n == 0) {
        struct stat st {};
        ::fstat(fd, &st);
        return absl::DataLossError(absl::StrCat(
            where, ": the file is truncated (", st.st_size,
            " bytes; the region ends at byte ", entry.offset() + bytes, ")"));
      }
      got += n;
    }
    if (read != nullptr) *read += got;
    for (int64_t b = wa; b < wb; b += block) {
      const int64_t n = std::min(block, bytes - b);
      if (Checksum(window.data() + (b - wa), static_cast<size_t>(n)) !=
          entry.block_checksums(static_cast<int>(b / block))) {
        return absl::DataLossError(absl::StrCat(
            where, ": bytes [", b, ", ", b + n,
            ") of the region do not match their checksum (the file is "
            "corrupted)"));
      }
    }
    return absl::OkStatus();
  };
  ForEachRun(stored, piece, piece, element_size,
             [&](int64_t src, int64_t dst, int64_t n) {
               while (n > 0 && status.ok()) {
                 if (src < wa || src >= wb) {
                   status = load(src);
                   if (!status.ok()) return;
                 }
                 const int64_t m = std::min(n, wb - src);
                 consume(dst, window.data() + (src - wa), m);
                 src += m;
                 dst += m;
                 n -= m;
               }
             });
  return status;
}

}  // namespace ptc
