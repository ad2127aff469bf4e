#include "tensor_store/spare_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "tensor_store/region_buffer.h"

namespace ptc {
namespace {

Counter& spares_used_total = GetCounter("ptc_store_spares_used_total");
Counter& spares_missed_total = GetCounter("ptc_store_spares_missed_total");
Counter& spares_refilled_total = GetCounter("ptc_store_spares_refilled_total");
Counter& spares_refill_cold_total =
    GetCounter("ptc_store_spares_refill_cold_total");

// How long after its release memory is taken for warm: free page reporting
// hands free memory back to the hypervisor after about 2 s.
constexpr absl::Duration kWarmFor = absl::Seconds(1);
// How often the refill thread looks for released memory.
constexpr absl::Duration kRefillPoll = absl::Milliseconds(10);

absl::Duration ThreadCpuTime() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return absl::DurationFromTimespec(t);
}

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
  if (capacity_ > 0) {
    thread_ = std::thread([this] { Loop(); });
    // Releases count from now, not from when the thread first runs (a
    // busy machine may start it late).
    refill_thread_ = std::thread(
        [this, released = budget_->released()] { RefillLoop(released); });
  }
}

SparePool::~SparePool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (refill_thread_.joinable()) refill_thread_.join();
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
  std::vector<Spare> stale;  // closed after the lock is released
  {
    absl::MutexLock lock(&mu_);
    // Spares ready or queued for changes, and deleted jobs', by size; not
    // those saves asked for: they are a job's next save's (or its change
    // drops them: ForgetSaves).
    std::map<int64_t, int64_t> have;
    for (const auto& [size, spares] : ready_) {
      for (const Ready& r : spares)
        if (!r.for_save) ++have[size];
    }
    for (const Queued& q : queue_)
      if (!q.for_save) ++have[q.size];
    const std::set<int64_t> wanted(sizes.begin(), sizes.end());
    // Frees a deleted job's ready spare of a size not wanted, if any.
    auto evict_orphan = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (auto& [size, spares] : ready_) {
        if (wanted.count(size)) continue;
        for (size_t i = spares.size(); i-- > 0;) {
          if (!spares[i].orphan) continue;
          stale.push_back(std::move(spares[i].spare));
          spares.erase(spares.begin() + i);
          ready_bytes_ -= size;
          return true;
        }
      }
      return false;
    };
    for (int64_t size : sizes) {
      if (size <= 0 || size > capacity_) continue;
      if (have[size] > 0) {
        --have[size];
        covered += size;
        continue;
      }
      while (ready_bytes_ + queued_bytes_ + size > capacity_ &&
             evict_orphan()) {
      }
      if (ready_bytes_ + queued_bytes_ + size <= capacity_) {
        queue_.push_back({size, wave, /*for_save=*/false});
        queued_bytes_ += size;
        covered += size;
      }
    }
  }
  for (Spare& s : stale) close(s.fd);
  return covered;
}

int64_t SparePool::Orphan(const std::string& job) {
  int64_t kept = 0;
  absl::MutexLock lock(&mu_);
  for (auto& [size, spares] : ready_) {
    for (Ready& r : spares) {
      if (!r.for_save || r.wave.job != job) continue;
      r.for_save = false;
      r.orphan = true;
      r.wave = Wave{};  // no job's: any put of its size may take it
      kept += size;
    }
  }
  DropQueuedSaves(job);
  return kept;
}

void SparePool::DropQueuedSaves(const std::string& job) {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->for_save && it->wave.job == job) {
      queued_bytes_ -= it->size;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  // A spare a thread is preparing for one of the job's saves is freed
  // when it is done.
  for (InFlight& f : in_flight_)
    if (f.q.for_save && f.q.wave.job == job) f.dropped = true;
}

int64_t SparePool::ForgetSaves(const std::string& job) {
  std::vector<Spare> gone;  // closed after the lock is released
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [size, spares] : ready_) {
      for (size_t i = spares.size(); i-- > 0;) {
        if (!spares[i].for_save || spares[i].wave.job != job) continue;
        gone.push_back(std::move(spares[i].spare));
        spares.erase(spares.begin() + i);
        ready_bytes_ -= size;
        bytes += size;
      }
    }
    DropQueuedSaves(job);
  }
  for (Spare& s : gone) close(s.fd);
  return bytes;
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
        return p->queue_.empty() && p->in_flight_.empty();
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

bool SparePool::Next(InFlightList::iterator* f) {
  if (stop_ || queue_.empty()) return false;
  // Its bytes stay in queued_bytes_ until it is ready.
  *f = in_flight_.insert(in_flight_.end(), {std::move(queue_.front())});
  queue_.pop_front();
  return true;
}

void SparePool::Loop() {
  // Idle priority: touching pages is the slow part, and it must not take
  // the CPU from a save or from training.
  const sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  while (true) {
    InFlightList::iterator next;
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
    if (refill_holds_.load() > 0) continue;  // a change stages here
    {
      absl::MutexLock lock(&mu_);
      if (!Next(&next)) continue;
    }
    Prepare(*next, /*refill=*/false);
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= next->q.size;
    in_flight_.erase(next);
  }
}

void SparePool::RefillLoop(int64_t seen) {
  int64_t credit = 0;  // bytes released within kWarmFor, not refilled yet
  absl::Time warm_until = absl::InfinitePast();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](SparePool* p) ABSL_SHARED_LOCKS_REQUIRED(
                                    p->mu_) { return p->stop_; },
                               this),
                           kRefillPoll);
      if (stop_) return;
    }
    const int64_t released = budget_->released();
    if (refill_holds_.load() > 0) {  // a change stages: what it gives back
      seen = released;               // is for the change's buffers
      credit = 0;
      continue;
    }
    if (released > seen) {
      const absl::Time now = absl::Now();
      if (now >= warm_until) credit = 0;  // what was freed before is cold
      credit = std::min(capacity_, credit + (released - seen));
      warm_until = now + kWarmFor;
    }
    seen = released;
    while (credit > 0 && absl::Now() < warm_until &&
           refill_holds_.load() == 0) {
      InFlightList::iterator next;
      {
        absl::MutexLock lock(&mu_);
        if (!Next(&next)) break;
      }
      const Prepared got = Prepare(*next, /*refill=*/true);
      absl::MutexLock lock(&mu_);
      const Queued q = next->q;
      const bool dropped = next->dropped;
      in_flight_.erase(next);
      if (got == Prepared::kCold) {
        // Back to the idle thread, first in line (unless ForgetSaves
        // dropped it meanwhile); what this freed (the spare it gave up)
        // earns no credit.
        if (dropped) {
          queued_bytes_ -= q.size;
        } else {
          queue_.push_front(q);
        }
        credit = 0;
        seen = budget_->released();
        break;
      }
      queued_bytes_ -= q.size;
      credit -= q.size;
    }
  }
}

SparePool::Prepared SparePool::Prepare(const InFlight& f, bool refill) {
  const Queued& q = f.q;
  const int64_t size = q.size;
  // Twice the floor to start one, so that spares given back under memory
  // pressure are not prepared again at once (and again given back). A
  // refill takes back memory the store itself has just given back, which
  // leaves the machine as much available as before the release: the floor
  // itself is the bound.
  const int64_t floor = memory_floor_;
  if (!MemoryFits(size, refill ? floor : std::min(floor, INT64_MAX / 2) * 2))
    return Prepared::kNone;
  auto reservation = budget_->Reserve(size, "a spare save buffer");
  if (!reservation.ok()) return Prepared::kNone;  // the store is full
  const int fd = memfd_create("ptc-spare", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Prepared::kNone;
  if (ftruncate(fd, size) != 0) {
    close(fd);
    return Prepared::kNone;
  }
  // Allocate every page now (huge pages where allowed) by touching it.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return Prepared::kNone;
  }
  AdviseHugePages(p, size);
  // A huge page at a time, each after waiting (a little) for a free CPU:
  // idle priority alone does not keep this thread off a busy CPU, because
  // the kernel zeroes a whole huge page (milliseconds on a VM that backs
  // fresh memory slowly) without being preempted. A refill does not wait,
  // but stops once its pages have been slow (see cold_step).
  constexpr int64_t kStep = 2 << 20;
  constexpr absl::Duration kMaxWait = absl::Milliseconds(50);
  const absl::Duration cold_step = absl::Nanoseconds(cold_step_ns_.load());
  char* const bytes = static_cast<char*>(p);
  bool stopped = false;
  bool cold = false;
  absl::Duration spent;  // populating, in this thread's CPU time
  int64_t steps = 0;
  for (int64_t off = 0; off < size && !stopped && !cold; off += kStep) {
    const absl::Time give_up = absl::Now() + kMaxWait;
    while (!refill && CpusBusy() && absl::Now() < give_up)
      absl::SleepFor(absl::Milliseconds(2));
    const bool short_of_memory = !MemoryFits(0, memory_floor_);
    {
      absl::MutexLock lock(&mu_);
      stopped = stop_ || short_of_memory || f.dropped;
    }
    if (stopped) break;
    // The refill: one call per step where the kernel can (5.14+). The idle
    // thread touches every page instead: madvise holds the process's
    // memory map while it faults pages in, and this thread, starved of CPU
    // by design while every core is busy, can be preempted there for
    // seconds, stalling every thread of the daemon that maps or unmaps
    // memory (a refill, a staging buffer, a client's region); a fault
    // holds only its own mapping's lock (kernels 6.7+).
    const int64_t len = std::min(kStep, size - off);
    const absl::Duration began = ThreadCpuTime();
    if (!refill || madvise(bytes + off, len, MADV_POPULATE_WRITE) != 0) {
      for (int64_t page = 0; page < len; page += 4096)
        static_cast<volatile char*>(bytes)[off + page] = 0;
    }
    // Cold on average, with two pages' grace: the pages freed are not all
    // handed out again (one cold page among warm ones is no reason to stop).
    spent += ThreadCpuTime() - began;
    ++steps;
    cold = refill && spent > cold_step * (steps + 2);
  }
  munmap(p, size);
  if (cold) {
    close(fd);
    spares_refill_cold_total.Add();
    Log("tensor_store")
        ->debug(
            "a spare save buffer of {} bytes was not refilled from freed "
            "memory: it faulted in slowly (cold); left to the idle thread",
            size);
    return Prepared::kCold;
  }
  absl::MutexLock lock(&mu_);
  if (stopped || stop_ || f.dropped || ready_bytes_ + size > capacity_) {
    close(fd);
    return Prepared::kNone;
  }
  ready_[size].push_back(
      {Spare{fd, std::move(*reservation)}, q.wave, q.for_save});
  ready_bytes_ += size;
  if (refill) spares_refilled_total.Add();
  Log("tensor_store")
      ->trace("spare save buffer of {} bytes ready{}", size,
              refill ? " (refilled from freed memory)" : "");
  return Prepared::kReady;
}

}  // namespace ptc
