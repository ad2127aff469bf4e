// Pre-allocated shared memory for saves. Checkpoints repeat the same
// region sizes every save; allocating and faulting in fresh pages is what
// makes a save slow (on VMs especially). After a save of S bytes asks for
// memory, a background thread prepares a memfd of S bytes with its pages
// allocated (huge pages where the host allows), so that the next save of S
// bytes writes into ready memory. Each spare is used once and then sealed
// with its region as usual: no memory is ever written after its checksum.
//
// Spares count against the store's memory budget; a put that would not fit
// evicts them first (EvictAll). Thread-safe.
//
//   SparePool pool(&budget, 1 << 30);
//   std::optional<SparePool::Spare> s = pool.Take(bytes);   // or nullopt
#ifndef PTC_TENSOR_STORE_SPARE_POOL_H_
#define PTC_TENSOR_STORE_SPARE_POOL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tensor_store/memory_budget.h"

namespace ptc {

class SparePool {
 public:
  struct Spare {
    int fd = -1;  // memfd of exactly the size asked for; the taker owns it
    MemoryBudget::Reservation reservation;
  };

  // `capacity` bytes at most are kept ready; 0 disables the pool.
  SparePool(MemoryBudget* budget, int64_t capacity);
  ~SparePool();
  SparePool(const SparePool&) = delete;
  SparePool& operator=(const SparePool&) = delete;

  // A ready spare of exactly `size` bytes, if there is one. Either way, a
  // spare of `size` is queued for the next taker; ready spares of other
  // sizes are dropped if the capacity is needed for it.
  std::optional<Spare> Take(int64_t size);
  // Frees every ready spare (their memory returns to the budget).
  void EvictAll();
  // Blocks until no spare is being prepared or queued; for benchmarks.
  void WaitIdle();
  int64_t ready_bytes() const;

 private:
  void Loop();
  void Prepare(int64_t size);

  MemoryBudget* budget_;
  const int64_t capacity_;
  mutable absl::Mutex mu_;
  std::map<int64_t, std::vector<Spare>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<int64_t> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_SPARE_POOL_H_
