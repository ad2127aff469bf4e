#include "tensor_store/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace ptc {

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(
    Reservation&& o) noexcept {
  if (this != &o) {
    Release();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.budget_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void MemoryBudget::Reservation::Release() {
  if (budget_ != nullptr && bytes_ > 0) {
    budget_->used_.fetch_sub(bytes_, std::memory_order_relaxed);
    budget_->released_.fetch_add(bytes_, std::memory_order_relaxed);
  }
  budget_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(
    int64_t bytes, const std::string& what) {
  int64_t used = used_.load(std::memory_order_relaxed);
  while (true) {
    if (bytes > limit_ - used) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes but the store holds ",
                       used, " of its ", limit_,
                       "-byte memory limit; delete old versions or raise "
                       "--memory-limit"));
    }
    if (used_.compare_exchange_weak(used, used + bytes,
                                    std::memory_order_relaxed)) {
      return Reservation(this, bytes);
    }
  }
}

}  // namespace ptc
