#include "common/metrics.h"

#include <map>
#include <memory>
#include <mutex>

namespace ptc {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Counter>> counters;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
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

}  // namespace ptc
