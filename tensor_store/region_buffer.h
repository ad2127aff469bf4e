// The bytes of one stored region, in a memfd. A buffer is writable until
// Seal(); sealing forbids every later write or resize (F_SEAL_WRITE,
// F_SEAL_GROW, F_SEAL_SHRINK) and maps it read-only, so the checksum taken
// at sealing stays true and the fd can be handed to local clients to map,
// zero-copy, with no way to change it. The buffer owns the memory
// reservation that pays for it; the memory returns to the budget when the
// last reference (the store's or a local client's lease) goes away.
//
// A pack is one buffer that holds several regions (a rank's small regions
// of one save: one memfd, written and sealed once, in huge pages where the
// host allows them, instead of hundreds of 4 KiB-paged ones). Slice makes
// each region's buffer, a view at its own page-aligned offset; a view is
// used like any other buffer, and the pack's memory returns when the pack
// and every view are gone.
//
//   PTC_ASSIGN_OR_RETURN(auto buf, RegionBuffer::Create(n, std::move(r),
//   "job/v1/w")); std::memcpy(buf->mutable_data(), src, n);
//   PTC_RETURN_IF_ERROR(buf->Seal());
//   const uint8_t* bytes = buf->data();
#ifndef PTC_TENSOR_STORE_REGION_BUFFER_H_
#define PTC_TENSOR_STORE_REGION_BUFFER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ptc/packs.h"
#include "tensor_store/memory_budget.h"

namespace ptc {

class RegionBuffer {
 public:
  // A writable buffer of `size` > 0 bytes. If `map` is false the daemon
  // does not map it until Seal() (a local client fills it through the fd).
  static absl::StatusOr<std::shared_ptr<RegionBuffer>> Create(
      int64_t size, MemoryBudget::Reservation reservation,
      const std::string& name, bool map = true);

  // Takes ownership of `fd`, a writable memfd of exactly `size` bytes
  // created with MFD_ALLOW_SEALING (e.g. a spare from the SparePool).
  static absl::StatusOr<std::shared_ptr<RegionBuffer>> Adopt(
      int fd, int64_t size, MemoryBudget::Reservation reservation, bool map);

  // A hollow buffer: its size and reservation, no memory, no fd (a hollow
  // store's: the scale harness's hosts keep every region's metadata but
  // none of its bytes). data() is null, WriteFrom takes and drops bytes,
  // Seal only marks it sealed.
  static std::shared_ptr<RegionBuffer> CreateHollow(
      int64_t size, MemoryBudget::Reservation reservation);

  // The views of `pack` (unsealed, not itself a view) at `parts`, each
  // (offset, size) with offset a multiple of kPackAlignment and the part
  // within the pack (INVALID_ARGUMENT otherwise). Sealing any view seals
  // the whole pack: no part of it can be written after that.
  static absl::StatusOr<std::vector<std::shared_ptr<RegionBuffer>>> Slice(
      const std::shared_ptr<RegionBuffer>& pack,
      const std::vector<std::pair<int64_t, int64_t>>& parts);

  ~RegionBuffer();
  RegionBuffer(const RegionBuffer&) = delete;
  RegionBuffer& operator=(const RegionBuffer&) = delete;

  // Seals and maps read-only. FAILED_PRECONDITION if someone still maps it
  // writable (a local client must unmap before committing).
  absl::Status Seal();

  int64_t size() const { return size_; }
  bool sealed() const { return whole().sealed_; }
  bool hollow() const { return hollow_; }
  // Readable after Seal(), or writable before it if created mapped.
  const uint8_t* data() const {
    if (!pack_) return data_;
    return pack_->data_ == nullptr ? nullptr : pack_->data_ + offset_;
  }
  uint8_t* mutable_data() {
    return sealed() ? nullptr : const_cast<uint8_t*>(data());
  }
  // The memfd (-1 if hollow), the pack's for a view; stays owned by the
  // buffer. The region's bytes start at offset() in it.
  int fd() const { return whole().fd_; }
  int64_t offset() const { return offset_; }
  // The size of the memfd: the pack's for a view.
  int64_t memfd_size() const { return whole().size_; }
  // The memfd's inode: two fds with the same inode share the same memory.
  ino_t inode() const { return whole().inode_; }
  // The sealed bytes to read whole: data() where the mapping is populated
  // (a region in huge pages, whose mapping Seal fills; a smaller one's
  // pages are mapped by its first reader through data()), else a copy
  // read into `scratch`
  // (resized; under kHugePageBytes), which on a VM costs a fraction of
  // mapping it page by page. Valid while the buffer and `scratch` are.
  const uint8_t* ReadableBytes(std::vector<uint8_t>* scratch) const;
  // Writes `n` bytes at `offset` through the memfd (unsealed only): how
  // a buffer created unmapped is filled without mapping it.
  absl::Status WriteFrom(int64_t offset, const void* src, int64_t n);

  // A value derived from the sealed bytes (such as the fingerprint of the
  // whole region), computed by the first caller for `key` and remembered:
  // the bytes never change, and versions that share the buffer share it.
  uint64_t Memoize(const std::string& key,
                   const std::function<uint64_t()>& compute);

 private:
  RegionBuffer(int fd, int64_t size, MemoryBudget::Reservation r)
      : fd_(fd), size_(size), reservation_(std::move(r)) {}
  // The buffer that owns the memfd: the pack for a view, else this one.
  const RegionBuffer& whole() const { return pack_ ? *pack_ : *this; }

  int fd_;
  int64_t size_;
  MemoryBudget::Reservation reservation_;
  uint8_t* data_ = nullptr;
  bool sealed_ = false;
  bool populated_ = false;  // every page of data_ mapped
  bool hollow_ = false;
  ino_t inode_ = 0;
  // A view's pack, and where in it the view's bytes start.
  std::shared_ptr<RegionBuffer> pack_;
  int64_t offset_ = 0;
  absl::Mutex memo_mu_;
  std::map<std::string, uint64_t> memo_ ABSL_GUARDED_BY(memo_mu_);
};

// The huge page of transparent huge pages: mappings at least this large
// are advised to use them.
inline constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// Regions smaller than this are copied in and out through their memfd
// (pwrite / pread) by ptc's client, larger ones through a mapping. Mapping
// costs per page: a region under 2 MiB gets no huge pages, and on a VM
// each 4 KiB page mapped costs about as much as copying it many times
// over. Measured by store_benchmark on the CI VM: 1 MiB saves at 1.2 GB/s
// through the descriptor vs 0.3 mapped, 4 MiB at 5.1 vs 2.3; from 16 MiB
// on the mapping was as fast or faster (huge pages: a few entries per
// region). The store populates fresh memory from kHugePageBytes up to this
// in huge pages itself (Store::BeginPut).
inline constexpr int64_t kCopyThroughDescriptorBelow = int64_t{8} << 20;

// Whether this host gives shared memory transparent huge pages where a
// mapping asks (/sys/kernel/mm/transparent_hugepage/shmem_enabled is not
// "never" or "deny"); read once.
bool SharedMemoryHugePages();

// madvise(MADV_HUGEPAGE) for mappings of at least kHugePageBytes: fewer
// page faults where the host enables transparent huge pages for shared
// memory.
void AdviseHugePages(void* addr, int64_t size);

// Maps every page of a mapping about to be written (or read) whole, after
// AdviseHugePages: where page faults are costly (a VM whose faults trap to
// the hypervisor: 16 us per 4 KiB page measured on the CI VM) this makes a
// save of a 1 MiB region 1.7 times as fast (store_benchmark). Best effort.
void PrefaultPages(void* addr, int64_t size, bool for_write);

// pwrite / pread of exactly `n` bytes at `offset` of `fd` (retrying short
// transfers and EINTR). Copying through the descriptor maps nothing in
// the caller: on the CI VM, 1.2 MiB into an allocated memfd ran at 6.4
// GB/s by pwrite against 0.56 GB/s by mmap + populate + memcpy (a scratch
// measurement), and 5.3 vs 1.4 GB/s out of one.
absl::Status WriteAt(int fd, int64_t offset, const void* src, int64_t n);
absl::Status ReadAt(int fd, int64_t offset, void* dst, int64_t n);

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_REGION_BUFFER_H_
