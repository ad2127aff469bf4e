// The store's memory limit. Bytes are reserved before a region is
// allocated and given back when the last reference to it goes away, so the
// daemon never holds more than its limit, whatever its clients do.
//
//   PTC_ASSIGN_OR_RETURN(MemoryBudget::Reservation r, budget.Reserve(n, "put
//   ..."));
//   ... r is released when destroyed (or moved into the buffer it pays for).
#ifndef PTC_TENSOR_STORE_MEMORY_BUDGET_H_
#define PTC_TENSOR_STORE_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ptc {

class MemoryBudget {
 public:
  // Bytes the holder may use; released on destruction. Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : budget_(o.budget_), bytes_(o.bytes_) {
      o.budget_ = nullptr;
      o.bytes_ = 0;
    }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { Release(); }
    int64_t bytes() const { return bytes_; }
    void Release();

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* b, int64_t bytes) : budget_(b), bytes_(bytes) {}
    MemoryBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  explicit MemoryBudget(int64_t limit) : limit_(limit) {}

  // RESOURCE_EXHAUSTED, saying how much is used, if `bytes` do not fit;
  // `what` names the request in the message.
  absl::StatusOr<Reservation> Reserve(int64_t bytes, const std::string& what);

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  // Bytes given back so far, ever (a count that only grows): memory just
  // freed is what the spare pool refills from (SparePool).
  int64_t released() const { return released_.load(std::memory_order_relaxed); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> released_{0};
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_MEMORY_BUDGET_H_
