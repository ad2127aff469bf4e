#include "snapshot/snapshot_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"
#include "snapshot/safetensors.h"
#include "snapshot/snapshot_dir.h"

namespace ptc {
namespace {

// Bytes gathered (or taken from a stored buffer) per write: a multiple of
// the checksum block.
constexpr int64_t kChunkBytes = 8 * kSnapshotBlockBytes;

absl::Status ErrnoError(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

// The file being written: writes with throttling, pauses and cancel.
class Sink {
 public:
  Sink(int fd, std::string path, const SnapshotFileRequest& r, int64_t total)
      : fd_(fd), path_(std::move(path)), r_(r), total_(total) {}

  absl::Status Write(const uint8_t* p, int64_t n) {
    while (r_.paused && r_.paused()) {
      if (Cancelled()) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (Cancelled()) {
      return absl::CancelledError(
          absl::StrCat("the snapshot write of ", path_, " was cancelled"));
    }
    if (r_.max_bytes_per_second > 0) {
      const absl::Duration due =
          absl::Seconds(static_cast<double>(written_) /
                        static_cast<double>(r_.max_bytes_per_second));
      const absl::Duration ahead = due - (absl::Now() - start_);
      if (ahead > absl::ZeroDuration()) absl::SleepFor(ahead);
    }
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, static_cast<size_t>(n));
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, absl::StrCat("writing ", path_));
      }
      p += w;
      n -= w;
      written_ += w;
    }
    PTC_RETURN_IF_ERROR(StreamOut());
    if (r_.progress) r_.progress(written_, total_);
    return absl::OkStatus();
  }

 private:
  // Streams the file to the disk while it is written, instead of leaving
  // it all to the final fsync (which would write every byte only after
  // the last one was copied): each window of kWritebackBytes starts its
  // writeback as soon as it is complete, and the window before it is
  // waited for and dropped from the page cache (a snapshot is not read
  // back soon; it must not push the store's memory out).
  static constexpr int64_t kWritebackBytes = int64_t{32} << 20;
  absl::Status StreamOut() {
    while (written_ - started_ >= kWritebackBytes) {
      if (sync_file_range(fd_, started_, kWritebackBytes,
                          SYNC_FILE_RANGE_WRITE) != 0) {
        return ErrnoError(errno, absl::StrCat("writing ", path_));
      }
      if (started_ >= kWritebackBytes) {
        const int64_t older = started_ - kWritebackBytes;
        if (sync_file_range(fd_, older, kWritebackBytes,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
          return ErrnoError(errno, absl::StrCat("writing ", path_));
        }
        posix_fadvise(fd_, older, kWritebackBytes, POSIX_FADV_DONTNEED);
      }
      started_ += kWritebackBytes;
    }
    return absl::OkStatus();
  }

 public:

 private:
  bool Cancelled() const { return r_.cancel != nullptr && r_.cancel->load(); }

  int fd_;
  std::string path_;
  const SnapshotFileRequest& r_;
  int64_t total_;
  int64_t written_ = 0;
  int64_t started_ = 0;  // writeback started for [0, started_)
  absl::Time start_ = absl::Now();
};

}  // namespace

absl::StatusOr<proto::SnapshotProgress> WriteSnapshotFile(
    Store* store, const SnapshotFileRequest& r) {
  PTC_RETURN_IF_ERROR(CheckSnapshotFileName(r.file));
  if (r.regions.size() > static_cast<size_t>(kMaxSnapshotRegions)) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.regions.size(), " regions for one file; at most ",
                     kMaxSnapshotRegions));
  }
  bool committed = false;
  for (const proto::HeldVersion& v : store->Versions()) {
    if (v.job() == r.job && v.version() == r.version) committed = v.committed();
  }
  if (!committed) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", r.version, " of job '", r.job,
                     "' is not committed on this host"));
  }
  // Where each region's bytes are: one stored region holds it.
  struct Item {
    TensorDecl decl;
    Region region;
    StoredRegionRef source;
    int64_t bytes = 0;
  };
  std::vector<Item> items;
  items.reserve(r.regions.size());
  std::vector<SafetensorsEntry> entries;
  int64_t total = 0;
  for (const std::pair<std::string, Region>& want : r.regions) {
    const std::string& tensor = want.first;
    const Region& region = want.second;
    PTC_ASSIGN_OR_RETURN(ReadView view,
                         store->OpenRead(r.job, r.version, tensor, region));
    auto it = std::find_if(
        view.sources.begin(), view.sources.end(),
        [&](const StoredRegionRef& s) { return s.region.Contains(region); });
    if (it == view.sources.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("region ", region.ToString(), " of tensor '", tensor,
                       "' is not inside one region this host stores"));
    }
    Item item{view.decl, region, *it,
              region.volume() * ElementSize(view.decl.dtype)};
    total += item.bytes;
    entries.push_back({absl::StrCat(tensor, region.ToString()), view.decl.dtype,
                       region.shape()});
    items.push_back(std::move(item));
  }
  PTC_ASSIGN_OR_RETURN(
      std::string header,
      SafetensorsHeader(&entries, {{"format", "pt"},
                                   {"ptc", kSnapshotFormat},
                                   {"job", r.job},
                                   {"version", absl::StrCat(r.version)}}));
  std::error_code ec;
  std::filesystem::create_directories(r.dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("creating ", r.dir, ": ", ec.message()));
  }
  const std::string path = r.dir + "/" + r.file;
  const std::string tmp = r.dir + "/." + r.file + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("creating ", tmp));
  bool keep = false;
  absl::Cleanup cleanup = [&] {
    ::close(fd);
    if (!keep) ::unlink(tmp.c_str());
  };
  Sink sink(fd, path, r, static_cast<int64_t>(header.size()) + total);
  PTC_RETURN_IF_ERROR(
      sink.Write(reinterpret_cast<const uint8_t*>(header.data()),
                 static_cast<int64_t>(header.size())));
  proto::SnapshotProgress out;
  std::vector<uint8_t> staging;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    proto::SnapshotRegion* e = out.add_regions();
    e->set_tensor(static_cast<int32_t>(i));
    RegionToProto(item.region, e->mutable_region());
    e->set_file(r.file);
    e->set_name(entries[i].name);
    e->set_offset(static_cast<int64_t>(header.size()) + entries[i].begin);
    e->set_bytes(item.bytes);
    e->set_block_bytes(kSnapshotBlockBytes);
    auto emit = [&](const uint8_t* p, int64_t n) {
      for (int64_t b = 0; b < n; b += kSnapshotBlockBytes) {
        e->add_block_checksums(Checksum(
            p + b, static_cast<size_t>(std::min(kSnapshotBlockBytes, n - b))));
      }
      return sink.Write(p, n);
    };
    const uint8_t* data = item.source.buffer->data();
    const int64_t elem = ElementSize(item.decl.dtype);
    if (item.source.region == item.region) {
      for (int64_t off = 0; off < item.bytes; off += kChunkBytes) {
        PTC_RETURN_IF_ERROR(
            emit(data + off, std::min(kChunkBytes, item.bytes - off)));
      }
    } else {
      // Gather the region's runs out of the stored one, a chunk at a time.
      staging.resize(static_cast<size_t>(std::min(kChunkBytes, item.bytes)));
      int64_t fill = 0;
      absl::Status status;
      ForEachRun(item.source.region, item.region, item.region, elem,
                 [&](int64_t src, int64_t, int64_t n) {
                   while (n > 0 && status.ok()) {
                     const int64_t m = std::min(
                         n, static_cast<int64_t>(staging.size()) - fill);
                     std::memcpy(staging.data() + fill, data + src, m);
                     fill += m;
                     src += m;
                     n -= m;
                     if (fill == static_cast<int64_t>(staging.size())) {
                       status = emit(staging.data(), fill);
                       fill = 0;
                     }
                   }
                 });
      PTC_RETURN_IF_ERROR(status);
      if (fill > 0) PTC_RETURN_IF_ERROR(emit(staging.data(), fill));
    }
    PTC_ASSIGN_OR_RETURN(
        auto fp,
        store->Fingerprint(r.job, r.version, item.decl.key, {item.region}));
    e->set_fingerprint(fp.first);
  }
  if (::fsync(fd) != 0) return ErrnoError(errno, absl::StrCat("syncing ", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return ErrnoError(errno, absl::StrCat("renaming ", tmp));
  keep = true;
  if (const int dfd = ::open(r.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  out.set_done(true);
  out.set_bytes_done(static_cast<int64_t>(header.size()) + total);
  out.set_bytes_total(out.bytes_done());
  out.mutable_file()->set_name(r.file);
  out.mutable_file()->set_bytes(out.bytes_done());
  return out;
}

}  // namespace ptc
