#include "tensor_store/spare_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "tensor_store/region_buffer.h"

namespace ptc {
namespace {

Counter& spares_used_total = GetCounter("ptc_store_spares_used_total");
Counter& spares_missed_total = GetCounter("ptc_store_spares_missed_total");

// True while every CPU has a runnable thread besides the caller. The fourth
// field of /proc/loadavg ("3/456") counts the runnable threads now, the
// caller included.
bool CpusBusy() {
  static const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  long running = 0;
  if (std::sscanf(buf, "%*f %*f %*f %ld/", &running) != 1) return false;
  return running - 1 >= cpus;
}

// A field of /proc/meminfo in bytes ("MemAvailable:  123456 kB"), or -1.
int64_t MemInfoBytes(const char* field) {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return -1;
  char line[256];
  int64_t out = -1;
  const size_t len = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      long long kb = 0;
      if (std::sscanf(line + len + 1, "%lld", &kb) == 1) out = kb * 1024;
      break;
    }
  }
  std::fclose(f);
  return out;
}

// Spares are given back when the machine's available memory falls below
// this, and none is prepared that would take it below: training processes
// must never run out of memory because ptcd keeps some ready.
int64_t MemoryFloor() {
  const int64_t total = MemInfoBytes("MemTotal");
  return std::max<int64_t>(int64_t{1} << 30, total / 8);
}

// Whether `more` bytes can be taken while leaving the floor available (true
// where /proc/meminfo cannot be read).
bool MemoryFits(int64_t more, int64_t floor) {
  const int64_t available = MemInfoBytes("MemAvailable");
  return available < 0 || available - more >= floor;
}

}  // namespace

SparePool::SparePool(MemoryBudget* budget, int64_t capacity)
    : budget_(budget), capacity_(capacity), memory_floor_(MemoryFloor()) {
  if (capacity_ > 0) thread_ = std::thread([this] { Loop(); });
}

SparePool::~SparePool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  EvictAll();
}

std::optional<SparePool::Spare> SparePool::Take(int64_t size,
                                                const Wave& wave) {
  if (capacity_ <= 0 || size > capacity_) return std::nullopt;
  std::vector<Spare> stale;  // closed after the lock is released
  std::optional<Spare> taken;
  {
    absl::MutexLock lock(&mu_);
    auto it = ready_.find(size);
    if (it != ready_.end()) {
      std::vector<Ready>& spares = it->second;
      for (size_t i = spares.size(); i-- > 0;) {
        const Wave& w = spares[i].wave;
        if (w.job == wave.job && w.version >= wave.version) continue;
        taken = std::move(spares[i].spare);
        spares.erase(spares.begin() + i);
        ready_bytes_ -= size;
        break;
      }
    }
    // Queue the replacement (or the first one). Spares of other sizes give
    // way: the job's current layout is what the next save will use.
    for (auto other = ready_.begin();
         ready_bytes_ + queued_bytes_ + size > capacity_ &&
         other != ready_.end();
         ++other) {
      while (other->first != size && !other->second.empty() &&
             ready_bytes_ + queued_bytes_ + size > capacity_) {
        ready_bytes_ -= other->first;
        stale.push_back(std::move(other->second.back().spare));
        other->second.pop_back();
      }
    }
    if (ready_bytes_ + queued_bytes_ + size <= capacity_) {
      queue_.push_back({size, wave});
      queued_bytes_ += size;
    }
  }
  for (Spare& s : stale) close(s.fd);
  (taken ? spares_used_total : spares_missed_total).Add();
  return taken;
}

int64_t SparePool::Queue(const std::vector<int64_t>& sizes, const Wave& wave) {
  if (capacity_ <= 0) return 0;
  int64_t covered = 0;
  absl::MutexLock lock(&mu_);
  std::map<int64_t, int64_t> have;  // size -> spares ready or queued
  for (const auto& [size, spares] : ready_) have[size] += spares.size();
  for (const Queued& q : queue_) ++have[q.size];
  for (int64_t size : sizes) {
    if (size <= 0 || size > capacity_) continue;
    if (have[size] > 0) {
      --have[size];
      covered += size;
    } else if (ready_bytes_ + queued_bytes_ + size <= capacity_) {
      queue_.push_back({size, wave});
      queued_bytes_ += size;
      covered += size;
    }
  }
  return covered;
}

void SparePool::EvictAll() {
  std::map<int64_t, std::vector<Ready>> gone;
  {
    absl::MutexLock lock(&mu_);
    gone.swap(ready_);
    ready_bytes_ = 0;
  }
  for (auto& [size, spares] : gone) {
    for (Ready& r : spares) close(r.spare.fd);
  }
}

void SparePool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](SparePool* p) ABSL_SHARED_LOCKS_REQUIRED(p->mu_) {
        return p->queue_.empty() && !p->busy_;
      },
      this));
}

int64_t SparePool::ready_bytes() const {
  absl::MutexLock lock(&mu_);
  return ready_bytes_;
}

int64_t SparePool::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

void SparePool::Loop() {
  // Idle priority: touching pages is the slow part, and it must not take
  // the CPU from a save or from training.
  const sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  while (true) {
    Queued next;
    int64_t ready;
    {
      absl::MutexLock lock(&mu_);
      // Wakes for work, and every 100 ms to check that the machine's memory
      // is not short.
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](SparePool* p) ABSL_SHARED_LOCKS_REQUIRED(p->mu_) {
                return p->stop_ || !p->queue_.empty();
              },
              this),
          absl::Milliseconds(100));
      if (stop_) return;
      ready = ready_bytes_;
    }
    if (ready > 0 && !MemoryFits(0, memory_floor_)) {
      EvictAll();
      Log("tensor_store")
          ->info(
              "memory is short (less than {} bytes available): gave back {} "
              "bytes of spare save buffers",
              memory_floor_.load(), ready);
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (queue_.empty()) continue;
      next = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;  // its bytes stay in queued_bytes_ until it is ready
    }
    Prepare(next);
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= next.size;
    busy_ = false;
  }
}

void SparePool::Prepare(const Queued& q) {
  const int64_t size = q.size;
  // Twice the floor to start one, so that spares given back under memory
  // pressure are not prepared again at once (and again given back).
  const int64_t floor = memory_floor_;
  if (!MemoryFits(size, std::min(floor, INT64_MAX / 2) * 2)) return;
  auto reservation = budget_->Reserve(size, "a spare save buffer");
  if (!reservation.ok()) return;  // the store is full: no spare
  const int fd = memfd_create("ptc-spare", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return;
  if (ftruncate(fd, size) != 0) {
    close(fd);
    return;
  }
  // Allocate every page now (huge pages where allowed) by touching it.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return;
  }
  AdviseHugePages(p, size);
  // A huge page at a time, each after waiting (a little) for a free CPU:
  // idle priority alone does not keep this thread off a busy CPU, because
  // the kernel zeroes a whole huge page (milliseconds on a VM that backs
  // fresh memory slowly) without being preempted.
  constexpr int64_t kStep = 2 << 20;
  constexpr absl::Duration kMaxWait = absl::Milliseconds(50);
  char* const bytes = static_cast<char*>(p);
  bool stopped = false;
  for (int64_t off = 0; off < size && !stopped; off += kStep) {
    const absl::Time give_up = absl::Now() + kMaxWait;
    while (CpusBusy() && absl::Now() < give_up)
      absl::SleepFor(absl::Milliseconds(2));
    const bool short_of_memory = !MemoryFits(0, memory_floor_);
    {
      absl::MutexLock lock(&mu_);
      stopped = stop_ || short_of_memory;
    }
    if (stopped) break;
    // One call per step where the kernel can (5.14+), a touch per page
    // where it cannot.
    const int64_t len = std::min(kStep, size - off);
    if (madvise(bytes + off, len, MADV_POPULATE_WRITE) != 0) {
      for (int64_t page = 0; page < len; page += 4096)
        static_cast<volatile char*>(bytes)[off + page] = 0;
    }
  }
  munmap(p, size);
  absl::MutexLock lock(&mu_);
  if (stopped || stop_ || ready_bytes_ + size > capacity_) {
    close(fd);
    return;
  }
  ready_[size].push_back({Spare{fd, std::move(*reservation)}, q.wave});
  ready_bytes_ += size;
  Log("tensor_store")->trace("spare save buffer of {} bytes ready", size);
}

}  // namespace ptc
