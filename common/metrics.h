// Process-wide counters with hierarchical names, declared at the top of the
// file that updates them:
//
//   Counter& bytes_in = GetCounter("ptc_store_bytes_in_total");
//   bytes_in.Add(n);
//   for (auto& [name, value] : CounterValues()) ...
#ifndef PTC_COMMON_METRICS_H_
#define PTC_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptc {

class Counter {
 public:
  void Add(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// The counter with `name`, created on first use; never destroyed.
Counter& GetCounter(const std::string& name);

// Every counter's name and value, sorted by name.
std::vector<std::pair<std::string, int64_t>> CounterValues();

}  // namespace ptc

#endif  // PTC_COMMON_METRICS_H_
