// Process-wide metrics with Prometheus names, declared at the top of the
// file that updates them. Counters only grow; a label set is part of the
// name. Gauges are read when the metrics are rendered, from a function
// their owner registers for as long as it lives:
//
//   Counter& bytes_in = GetCounter("ptc_store_bytes_in_total");
//   bytes_in.Add(n);
//   GetCounter(R"(ptc_store_errors_total{code="NOT_FOUND"})").Add();
//   Gauge used = Gauge("ptc_store_memory_used_bytes", [&] { return used; });
//   std::string page = PrometheusText();  // text exposition format 0.0.4
#ifndef PTC_COMMON_METRICS_H_
#define PTC_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
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

// The counter with `name` (labels included), created on first use; never
// destroyed.
Counter& GetCounter(const std::string& name);

// Every counter's name and value, sorted by name.
std::vector<std::pair<std::string, int64_t>> CounterValues();

// A gauge registered while this object lives. Several with one name (a
// test process with several daemons) are rendered as their sum.
class Gauge {
 public:
  Gauge(std::string name, std::function<double()> read);
  ~Gauge();
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

 private:
  uint64_t id_;
};

// Every counter and gauge in Prometheus's text exposition format, one
// "# TYPE" line per metric family.
std::string PrometheusText();

}  // namespace ptc

#endif  // PTC_COMMON_METRICS_H_
