#include "common/parallel_for.h"

#include "absl/strings/cord.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ptc {

absl::Status ParallelFor(size_t n, int max_threads,
                         const std::function<absl::Status(size_t)>& fn,
                         const std::atomic<bool>* cancel) {
  absl::Mutex mu;
  absl::Status first;
  std::atomic<bool> stop{false};
  std::atomic<size_t> next{0};
  bool cancelled = false;
  auto worker = [&] {
    while (!stop.load()) {
      if (cancel != nullptr && cancel->load()) {
        absl::MutexLock lock(&mu);
        cancelled = true;
        stop = true;
        return;
      }
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = std::move(s);
        stop = true;
      }
    }
  };
  const size_t threads =
      std::min(n, static_cast<size_t>(std::max(1, max_threads)));
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (size_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  if (!first.ok()) return first;
  // Indices taken past n are no-ops, so min(next, n) were started.
  if (cancelled && std::min(next.load(), n) < n) {
    absl::Status cancelled_early =
        absl::CancelledError("cancelled before it finished");
    cancelled_early.SetPayload(kParallelForCancelledUrl, absl::Cord("1"));
    return cancelled_early;
  }
  return absl::OkStatus();
}

}  // namespace ptc
