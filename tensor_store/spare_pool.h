// Pre-allocated shared memory for saves. Checkpoints repeat the same
// region sizes every save; allocating and faulting in fresh pages is what
// makes a save slow (on VMs especially). After a save of S bytes asks for
// memory, a background thread prepares a memfd of S bytes with its pages
// allocated (huge pages where the host allows), so that the next save of S
// bytes writes into ready memory. Each spare is used once and then sealed
// with its region as usual: no memory is ever written after its checksum.
//
// A spare is for a later save than the one that asked for it (the same job
// and an older version may not take it): otherwise a save's later puts of a
// repeated size (every layer's) would use up the spares its earlier puts
// queued, and the next save would find only part of its memory ready.
// Spares are prepared by a thread at idle priority (SCHED_IDLE) that also
// waits up to 50 ms before each huge page while every CPU is busy, so that
// preparing them hardly slows a save, a reconfiguration or training.
//
// Memory the store has just given back (a version deleted after a newer
// one committed) is refilled at once instead: a second thread, at normal
// priority and without waiting, prepares queued spares of up to as many
// bytes within a second of their release. Pages freed a moment ago are
// the machine's to reuse at memset speed, while memory left free longer
// may have gone back to the hypervisor (virtio-balloon free page
// reporting, after about 2 s) and then faults in 25 times slower on first
// touch: on such a VM a job that saves every step would otherwise write
// every save into cold memory, since an idle thread gets no CPU while
// training keeps every core busy. The refill stops (and leaves the rest
// to the idle thread) as soon as its huge pages take longer than
// cold_step each, on average, of the thread's CPU time: the memory it got
// was cold after all.
//
// Spares count against the store's memory budget; a put that would not fit
// evicts them first (EvictAll). They also give way to the machine's other
// processes: when the available memory (MemAvailable) falls below an eighth
// of the machine's (at least 1 GiB), every ready spare is freed within
// 100 ms, and a spare is prepared only if twice that would stay available
// (once, for a refill: it takes back what the store has just given back).
// Thread-safe.
//
//   SparePool pool(&budget, 1 << 30);
//   std::optional<SparePool::Spare> s = pool.Take(bytes, {"run7", 1200});
#ifndef PTC_TENSOR_STORE_SPARE_POOL_H_
#define PTC_TENSOR_STORE_SPARE_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tensor_store/memory_budget.h"

namespace ptc {

class SparePool {
 public:
  struct Spare {
    int fd = -1;  // memfd of exactly the size asked for; the taker owns it
    MemoryBudget::Reservation reservation;
  };
  // The save a spare was asked for by: a put into `version` of `job`.
  struct Wave {
    std::string job;
    int64_t version = 0;
  };

  // `capacity` bytes at most are kept ready; 0 disables the pool.
  SparePool(MemoryBudget* budget, int64_t capacity);
  ~SparePool();
  SparePool(const SparePool&) = delete;
  SparePool& operator=(const SparePool&) = delete;

  // A ready spare of exactly `size` bytes for a put into `wave`, if there
  // is one (one that a put of another job, or of an older version of the
  // same job, asked for). Either way, a spare of `size` is queued for the
  // next save; ready spares of other sizes are dropped if the capacity is
  // needed for it.
  std::optional<Spare> Take(int64_t size, const Wave& wave);
  // Makes spares of `sizes` ready for puts after `wave` (a change of
  // layout about to stage buffers of these sizes): a spare of a size that
  // an earlier Queue made ready or queued already counts, and so does a
  // deleted job's (Orphan); not one a save asked for: that is for the
  // job's next save, or a change of its layout drops it (ForgetSaves).
  // Others are queued as far as the free capacity allows, where a deleted
  // job's ready spares of sizes not in `sizes` give theirs; other ready
  // spares are not given up for them. Returns the bytes of `sizes`
  // covered (ready, or queued now or before).
  int64_t Queue(const std::vector<int64_t>& sizes, const Wave& wave);
  // A change of `job`'s layout begins: the spares its saves asked for (of
  // the old layout's sizes) are dropped, and the ready ones give their
  // memory back now, while it is warm, for the change's own buffers; spares
  // Queue'd for the change stay. Returns the bytes given back.
  int64_t ForgetSaves(const std::string& job);
  // `job` was deleted: its next save will not come. The spares its saves
  // asked for that are ready stay, as anyone's (a put of their size takes
  // them, and a Queue counts them), until a Queue needs their capacity for
  // sizes they are not: a job of the same sizes registered next finds
  // them ready, another job's registration is not kept from preparing its
  // own. The ones not ready yet are dropped. Returns the bytes kept.
  int64_t Orphan(const std::string& job);
  // Frees every ready spare (their memory returns to the budget).
  void EvictAll();
  // Blocks until no spare is being prepared or queued; for benchmarks.
  void WaitIdle();
  int64_t ready_bytes() const;
  int64_t queued_bytes() const;
  int64_t capacity() const { return capacity_; }
  // While a hold lives, no spare is prepared, and memory the store gives
  // back earns no refill: a change staging on this host takes that memory
  // for its own buffers, and preparing spares took CPU from it (their page
  // zeroing was 0.49 of a target ptcd's 3.1 CPU-seconds in a 5 GB change
  // on two cores; a source's idle thread was zeroing pages around it too).
  // Held by a fragment for its life (from before it creates its version).
  class RefillHold {
   public:
    explicit RefillHold(SparePool* pool) : pool_(pool) {
      pool_->refill_holds_.fetch_add(1);
    }
    RefillHold(RefillHold&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)) {}
    RefillHold& operator=(RefillHold&&) = delete;
    ~RefillHold() {
      if (pool_ != nullptr) pool_->refill_holds_.fetch_sub(1);
    }

   private:
    SparePool* pool_;
  };
  RefillHold HoldRefill() { return RefillHold(this); }
  // The available memory (bytes) the pool leaves to others; by default an
  // eighth of the machine's, at least 1 GiB.
  void SetMemoryFloor(int64_t bytes) { memory_floor_ = bytes; }
  // CPU time per huge page (2 MiB, on average) beyond which the refill
  // takes the memory it gets for cold and stops; by default 2 ms (1 GB/s: warm
  // memory faults in at 5-20 GB/s, memory the hypervisor must back again
  // at 0.3-0.5 GB/s on the VMs measured).
  void SetColdStep(absl::Duration d) {
    cold_step_ns_ = d / absl::Nanoseconds(1);
  }

 private:
  struct Ready {
    Spare spare;
    Wave wave;             // asked for by
    bool for_save = true;  // asked for by a save (Take), not Queue
    bool orphan = false;   // its job was deleted (Orphan)
  };
  struct Queued {
    int64_t size = 0;
    Wave wave;
    bool for_save = true;
  };
  // A spare a thread is preparing; `dropped` once ForgetSaves dropped what
  // it is for (it is then freed, not made ready).
  struct InFlight {
    Queued q;
    bool dropped = false;
  };
  using InFlightList = std::list<InFlight>;

  enum class Prepared { kReady, kCold, kNone };

  void Loop();
  // `seen`: the budget's released bytes when the pool started.
  void RefillLoop(int64_t seen);
  // Prepares the spare `f` asks for; `refill`: without waiting for idle
  // CPUs, giving up (kCold) once its pages take longer than cold_step each.
  Prepared Prepare(const InFlight& f, bool refill);
  // Drops the spares `job`'s saves asked for that are not ready yet
  // (queued, or being prepared: freed when done).
  void DropQueuedSaves(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the next queued spare to in_flight_ (false if none).
  bool Next(InFlightList::iterator* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MemoryBudget* budget_;
  const int64_t capacity_;
  // Available memory (bytes) the pool leaves to others: spares are given
  // back when less is available, and prepared only while twice this stays.
  std::atomic<int64_t> memory_floor_;
  std::atomic<int64_t> cold_step_ns_{2'000'000};
  std::atomic<int> refill_holds_{0};
  mutable absl::Mutex mu_;
  std::map<int64_t, std::vector<Ready>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  InFlightList in_flight_ ABSL_GUARDED_BY(mu_);  // spares being prepared
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;         // at idle priority
  std::thread refill_thread_;  // at normal priority, after releases
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_SPARE_POOL_H_
