#include "tensor_store/region_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

absl::Status Errno(const std::string& what) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOMEM || e == ENOSPC) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

bool SharedMemoryHugePages() {
  static const bool huge = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    std::string setting((std::istreambuf_iterator<char>(f)),
                        std::istreambuf_iterator<char>());
    // The chosen setting is in brackets: "always within_size [advise] ...".
    const size_t open = setting.find('[');
    const size_t close = setting.find(']', open);
    if (open == std::string::npos || close == std::string::npos) return false;
    const std::string chosen = setting.substr(open + 1, close - open - 1);
    return chosen != "never" && chosen != "deny";
  }();
  return huge;
}

void AdviseHugePages(void* addr, int64_t size) {
  // Huge pages for shared memory cut page faults 512-fold where the host
  // allows them (/sys/kernel/mm/transparent_hugepage/shmem_enabled set to
  // "advise" or "always"); elsewhere this is a harmless no-op.
  if (size >= kHugePageBytes) madvise(addr, size, MADV_HUGEPAGE);
}

void PrefaultPages(void* addr, int64_t size, bool for_write) {
  // One call into the kernel maps every page, where touching them maps one
  // per fault; errors (kernels before 5.14 do not know the advice) leave
  // the pages to fault on first touch, as without it.
  if (size > 0)
    madvise(addr, size, for_write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

absl::Status WriteAt(int fd, int64_t offset, const void* src, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    const ssize_t w = pwrite(fd, p, static_cast<size_t>(n), offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno(absl::StrCat("writing ", n, " bytes at ", offset));
    if (w == 0) {
      return absl::InternalError(
          absl::StrCat("the region's memory took no bytes at ", offset));
    }
    p += w;
    offset += w;
    n -= w;
  }
  return absl::OkStatus();
}

absl::Status ReadAt(int fd, int64_t offset, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = pread(fd, p, static_cast<size_t>(n), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno(absl::StrCat("reading ", n, " bytes at ", offset));
    if (r == 0) {
      return absl::OutOfRangeError(
          absl::StrCat("the region's memory ends before byte ", offset));
    }
    p += r;
    offset += r;
    n -= r;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<RegionBuffer>> RegionBuffer::Create(
    int64_t size, MemoryBudget::Reservation reservation,
    const std::string& name, bool map) {
  if (size <= 0) {
    return absl::InvalidArgumentError(
        "a region buffer needs at least one byte");
  }
  const int fd = memfd_create(name.substr(0, 200).c_str(),
                              MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, size) != 0) {
    const absl::Status s = Errno(absl::StrCat("ftruncate to ", size, " bytes"));
    close(fd);
    return s;
  }
  return Adopt(fd, size, std::move(reservation), map);
}

absl::StatusOr<std::shared_ptr<RegionBuffer>> RegionBuffer::Adopt(
    int fd, int64_t size, MemoryBudget::Reservation reservation, bool map) {
  std::shared_ptr<RegionBuffer> buf(
      new RegionBuffer(fd, size, std::move(reservation)));
  // Its size is fixed before a client sees the descriptor: a client that
  // could shrink it would make the daemon's reads fault (SIGBUS), one that
  // could grow it would hold memory beyond the limit.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK) != 0)
    return Errno("sealing the region's size");
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("fstat");
  if (st.st_size != size) {
    return absl::InternalError(
        absl::StrCat("memfd has ", st.st_size, " bytes, not ", size));
  }
  buf->inode_ = st.st_ino;
  if (map) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return Errno(absl::StrCat("mmap of ", size, " bytes"));
    AdviseHugePages(p, size);
    // The daemon writes all of it (a transfer's or a stream's bytes).
    PrefaultPages(p, size, /*for_write=*/true);
    buf->data_ = static_cast<uint8_t*>(p);
    buf->populated_ = true;
  }
  return buf;
}

std::shared_ptr<RegionBuffer> RegionBuffer::CreateHollow(
    int64_t size, MemoryBudget::Reservation reservation) {
  std::shared_ptr<RegionBuffer> buf(
      new RegionBuffer(-1, size, std::move(reservation)));
  buf->hollow_ = true;
  return buf;
}

absl::StatusOr<std::vector<std::shared_ptr<RegionBuffer>>> RegionBuffer::Slice(
    const std::shared_ptr<RegionBuffer>& pack,
    const std::vector<std::pair<int64_t, int64_t>>& parts) {
  if (pack == nullptr || pack->pack_ || pack->hollow_ || pack->sealed_) {
    return absl::InvalidArgumentError(
        "only an unsealed buffer that is not itself a view can be sliced");
  }
  std::vector<std::shared_ptr<RegionBuffer>> views;
  views.reserve(parts.size());
  for (const auto& [offset, size] : parts) {
    if (offset < 0 || size <= 0 || offset % kPackAlignment != 0 ||
        offset > pack->size_ - size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "part [", offset, ", +", size, ") is not a page-aligned part of a ",
          pack->size_, "-byte pack"));
    }
    std::shared_ptr<RegionBuffer> view(
        new RegionBuffer(-1, size, MemoryBudget::Reservation()));
    view->pack_ = pack;
    view->offset_ = offset;
    views.push_back(std::move(view));
  }
  return views;
}

const uint8_t* RegionBuffer::ReadableBytes(
    std::vector<uint8_t>* scratch) const {
  if (hollow_ || !sealed() || whole().populated_ || size_ >= kHugePageBytes)
    return data();
  scratch->resize(static_cast<size_t>(size_));
  if (!ReadAt(fd(), offset_, scratch->data(), size_).ok())
    return data();  // the mapping reads the same bytes
  return scratch->data();
}

absl::Status RegionBuffer::WriteFrom(int64_t offset, const void* src,
                                     int64_t n) {
  if (sealed())
    return absl::FailedPreconditionError("the region's buffer is sealed");
  if (offset < 0 || n < 0 || offset > size_ - n) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", +", n, ") are outside the region's ", size_));
  }
  if (hollow_) return absl::OkStatus();
  return WriteAt(fd(), offset_ + offset, src, n);
}

uint64_t RegionBuffer::Memoize(const std::string& key,
                               const std::function<uint64_t()>& compute) {
  {
    absl::MutexLock lock(&memo_mu_);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
  }
  // Computed outside the lock: two first callers may both compute it, and
  // get the same value.
  const uint64_t value = compute();
  absl::MutexLock lock(&memo_mu_);
  memo_.emplace(key, value);
  return value;
}

RegionBuffer::~RegionBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

absl::Status RegionBuffer::Seal() {
  if (sealed_) return absl::OkStatus();
  if (pack_) {
    // The whole pack at once; the view reads through the pack's mapping.
    PTC_RETURN_IF_ERROR(pack_->Seal());
    sealed_ = true;
    return absl::OkStatus();
  }
  if (hollow_) {
    sealed_ = true;
    return absl::OkStatus();
  }
  if (data_ != nullptr) {
    munmap(data_, size_);
    data_ = nullptr;
  }
  if (fcntl(fd_, F_ADD_SEALS,
            F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    if (errno == EBUSY) {
      return absl::FailedPreconditionError(
          "the region's buffer is still mapped writable; unmap it before "
          "committing");
    }
    return Errno("sealing the region's memfd");
  }
  void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("mmap of ", size_, " bytes"));
  AdviseHugePages(p, size_);
  // A region in huge pages is mapped whole at once (a few entries), and
  // read whole next: the store's checksum of what was written. A smaller
  // one is read through the memfd (ReadTo), far cheaper than mapping it
  // page by page; its mapping fills in if something reads data().
  populated_ = size_ >= kHugePageBytes;
  if (populated_) PrefaultPages(p, size_, /*for_write=*/false);
  data_ = static_cast<uint8_t*>(p);
  sealed_ = true;
  return absl::OkStatus();
}

}  // namespace ptc
