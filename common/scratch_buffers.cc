#include "common/scratch_buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace ptc {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

char* Map(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();  // as a vector's resize would
  if (bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

// Whole huge pages, so that a buffer is its own pages.
size_t Rounded(size_t bytes) {
  return std::max(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
}

}  // namespace

ScratchBuffers::ScratchBuffers(int max_idle, absl::Duration idle_for)
    : max_idle_(std::max(0, max_idle)), idle_for_(idle_for) {}

ScratchBuffers::~ScratchBuffers() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (trim_thread_.joinable()) trim_thread_.join();
  absl::MutexLock lock(&mu_);
  Trim(/*all=*/true);
}

ScratchBuffers::Lease& ScratchBuffers::Lease::operator=(
    Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = other.pool_;
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void ScratchBuffers::Lease::Reserve(size_t bytes) {
  if (bytes <= size_ || bytes == 0) return;
  Release();
  {
    absl::MutexLock lock(&pool_->mu_);
    pool_->Trim(/*all=*/false);
    // The smallest idle buffer that is large enough.
    auto best = pool_->idle_.end();
    for (auto it = pool_->idle_.begin(); it != pool_->idle_.end(); ++it) {
      if (it->size >= bytes &&
          (best == pool_->idle_.end() || it->size < best->size))
        best = it;
    }
    if (best != pool_->idle_.end()) {
      data_ = best->data;
      size_ = best->size;
      pool_->idle_.erase(best);
      return;
    }
  }
  size_ = Rounded(bytes);
  data_ = Map(size_);
}

void ScratchBuffers::Lease::Discard() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ScratchBuffers::Lease::Release() {
  if (data_ == nullptr) return;
  pool_->Give(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ScratchBuffers::Give(char* data, size_t size) {
  absl::MutexLock lock(&mu_);
  Trim(/*all=*/false);
  if (stop_ || max_idle_ == 0) {
    munmap(data, size);
    return;
  }
  if (static_cast<int>(idle_.size()) >= max_idle_) {
    // Keep the larger buffers: a small one is cheaper to make again.
    auto smallest = std::min_element(
        idle_.begin(), idle_.end(),
        [](const Idle& a, const Idle& b) { return a.size < b.size; });
    if (smallest->size >= size) {
      munmap(data, size);
      return;
    }
    munmap(smallest->data, smallest->size);
    idle_.erase(smallest);
  }
  idle_.push_back({data, size, absl::Now()});
  // Started with the first idle buffer; it sleeps while none waits.
  if (!trim_thread_.joinable())
    trim_thread_ = std::thread([this] { TrimLoop(); });
}

void ScratchBuffers::Trim(bool all) {
  const absl::Time now = absl::Now();
  auto old = std::remove_if(idle_.begin(), idle_.end(), [&](const Idle& b) {
    if (!all && now - b.since < idle_for_) return false;
    munmap(b.data, b.size);
    return true;
  });
  idle_.erase(old, idle_.end());
}

void ScratchBuffers::TrimLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (idle_.empty()) {
      mu_.Await(absl::Condition(
          +[](ScratchBuffers* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return s->stop_ || !s->idle_.empty();
          },
          this));
      continue;
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), idle_for_ / 4);
    Trim(/*all=*/false);
  }
}

int ScratchBuffers::idle() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(idle_.size());
}

size_t ScratchBuffers::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const Idle& b : idle_) n += b.size;
  return n;
}

ScratchBuffers& TransferScratch() {
  static ScratchBuffers* const pool =
      new ScratchBuffers(/*max_idle=*/8, absl::Seconds(10));
  return *pool;
}

}  // namespace ptc
