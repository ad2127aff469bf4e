// One bounded fan-out: runs fn(0) .. fn(n-1) on at most `max_threads`
// threads and returns the first error. After an error, or once `cancel`
// reads true, no further index is started; the calls already running
// finish (they see `cancel` themselves if they can stop early). Every
// thread is joined before ParallelFor returns, so fn may capture by
// reference.
//
//   PTC_RETURN_IF_ERROR(ParallelFor(hosts.size(), 8, [&](size_t i) {
//     return Ping(hosts[i]);
//   }));
//
// Threads: min(n, max_threads) new threads, none when n is 0; a
// `max_threads` below 1 counts as 1. The indices are taken in order, so
// with one thread fn runs 0, 1, 2, ... on that thread.
#ifndef PTC_COMMON_PARALLEL_FOR_H_
#define PTC_COMMON_PARALLEL_FOR_H_

#include <atomic>
#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace ptc {

// The error returned when `cancel` stopped the loop before every index ran
// and no call failed: CANCELLED with this payload (CancelledByParallelFor
// tells it from a call's own CANCELLED).
inline constexpr char kParallelForCancelledUrl[] = "ptc/parallel-for-cancelled";
inline bool CancelledByParallelFor(const absl::Status& s) {
  return s.code() == absl::StatusCode::kCancelled &&
         s.GetPayload(kParallelForCancelledUrl).has_value();
}

absl::Status ParallelFor(size_t n, int max_threads,
                         const std::function<absl::Status(size_t)>& fn,
                         const std::atomic<bool>* cancel = nullptr);

}  // namespace ptc

#endif  // PTC_COMMON_PARALLEL_FOR_H_
