// Large scratch buffers that calls lease and give back instead of
// allocating their own: the state transformer's pack buffers (a source
// gathering a part's runs into one message) and bounce buffers (a target
// receiving a part it scatters). A fresh 64 MiB buffer costs a page fault
// and the kernel's zeroing of every page at its first touch; when each
// call allocated its own (thread-local buffers of gRPC threads that come
// and go), that was about a second of a source's CPU for a 5 GB change
// (20% of its samples in a profile, beside 27% for the gather itself).
//
// Buffers are anonymous private mappings advised to use transparent huge
// pages. At most `max_idle` wait in the pool; one idle for `idle_for` is
// unmapped (checked at every lease and return, and by a thread that wakes
// only while buffers wait), so an idle daemon keeps none. Thread-safe.
//
//   ScratchBuffers::Lease pack = TransferScratch().Take(bytes);
//   std::memcpy(pack.data(), src, bytes);
//   ...
//   // back in the pool when `pack` goes; pack.Discard() unmaps it instead
#ifndef PTC_COMMON_SCRATCH_BUFFERS_H_
#define PTC_COMMON_SCRATCH_BUFFERS_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ptc {

class ScratchBuffers {
 public:
  ScratchBuffers(int max_idle, absl::Duration idle_for);
  ~ScratchBuffers();
  ScratchBuffers(const ScratchBuffers&) = delete;
  ScratchBuffers& operator=(const ScratchBuffers&) = delete;

  // A buffer of at least the size asked for, until the lease goes.
  // Move-only; an empty lease (default, or moved from) holds nothing.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }
    char* data() const { return data_; }
    size_t size() const { return size_; }
    // At least `bytes` from now on (another buffer if this one is smaller;
    // its contents are not kept).
    void Reserve(size_t bytes);
    // Unmaps the buffer instead of returning it (after a failed transfer
    // whose peer may still use it).
    void Discard();

   private:
    friend class ScratchBuffers;
    void Release();
    ScratchBuffers* pool_ = nullptr;
    char* data_ = nullptr;
    size_t size_ = 0;
  };

  // An empty lease that Reserve fills from this pool.
  Lease Empty() {
    Lease l;
    l.pool_ = this;
    return l;
  }
  Lease Take(size_t bytes) {
    Lease l = Empty();
    l.Reserve(bytes);
    return l;
  }

  // Buffers waiting in the pool, and their bytes (for tests and metrics).
  int idle() const;
  size_t idle_bytes() const;

 private:
  struct Idle {
    char* data;
    size_t size;
    absl::Time since;
  };
  void Give(char* data, size_t size);
  // Unmaps the idle buffers older than idle_for_ (all with `all`).
  void Trim(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimLoop();

  const int max_idle_;
  const absl::Duration idle_for_;
  mutable absl::Mutex mu_;
  std::vector<Idle> idle_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread trim_thread_;
};

// The daemon's pool for the state transformer's pack and bounce buffers:
// up to 8 idle (parallel pulls and concurrent sends of one change), each
// unmapped after 10 s unused.
ScratchBuffers& TransferScratch();

}  // namespace ptc

#endif  // PTC_COMMON_SCRATCH_BUFFERS_H_
