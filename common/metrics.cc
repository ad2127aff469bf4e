#include "common/metrics.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ptc {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Counter>> counters;
  uint64_t next_gauge = 1;
  std::map<uint64_t, std::pair<std::string, std::function<double()>>> gauges;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

std::string Family(const std::string& name) {
  return name.substr(0, name.find('{'));
}

}  // namespace

Counter& GetCounter(const std::string& name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::unique_ptr<Counter>& c = r.counters[name];
  if (!c) c = std::make_unique<Counter>();
  return *c;
}

std::vector<std::pair<std::string, int64_t>> CounterValues() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [name, c] : r.counters) out.push_back({name, c->value()});
  return out;
}

Gauge::Gauge(std::string name, std::function<double()> read) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  id_ = r.next_gauge++;
  r.gauges[id_] = {std::move(name), std::move(read)};
}

Gauge::~Gauge() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.gauges.erase(id_);
}

std::string PrometheusText() {
  Registry& r = GetRegistry();
  std::map<std::string, double> gauges;
  std::vector<std::pair<std::string, int64_t>> counters = CounterValues();
  {
    // Gauges are read under the lock so that none is unregistered (and its
    // owner destroyed) while it is read; their functions must not register
    // metrics.
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& [id, gauge] : r.gauges)
      gauges[gauge.first] += gauge.second();
  }
  // By family, so that each has one TYPE line even where one family's name
  // is a prefix of another's.
  std::map<std::string, std::string> families;
  for (const auto& [name, value] : counters)
    absl::StrAppend(&families[Family(name)], name, " ", value, "\n");
  std::string out;
  for (const auto& [family, lines] : families)
    absl::StrAppend(&out, "# TYPE ", family, " counter\n", lines);
  families.clear();
  for (const auto& [name, value] : gauges) {
    // Exact for whole numbers (byte counts), full precision otherwise.
    const std::string text =
        !std::isfinite(value) ? "NaN"
        : value == std::floor(value) && std::fabs(value) < 9e15
            ? absl::StrCat(static_cast<int64_t>(value))
            : absl::StrFormat("%.17g", value);
    absl::StrAppend(&families[Family(name)], name, " ", text, "\n");
  }
  for (const auto& [family, lines] : families)
    absl::StrAppend(&out, "# TYPE ", family, " gauge\n", lines);
  return out;
}

}  // namespace ptc
