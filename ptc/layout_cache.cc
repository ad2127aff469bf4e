#include "ptc/layout_cache.h"

#include <utility>

#include "common/status_macros.h"

namespace ptc {

absl::StatusOr<std::shared_ptr<const Layout>> LayoutCache::Get(
    const std::shared_ptr<const ModelSpec>& spec, const std::string& config) {
  if (spec == nullptr) return absl::InvalidArgumentError("no model spec");
  PTC_ASSIGN_OR_RETURN(const ParallelConfig parsed, spec->ParseConfig(config));
  const std::string key = parsed.ToString();
  // Built under the lock: two callers that want the same layout at once
  // build it once (and hold one copy), and a build is short next to the
  // work that asked for it.
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->spec == spec && it->config == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().layout;
    }
  }
  PTC_ASSIGN_OR_RETURN(Layout built, BuildLayout(*spec, parsed));
  ++builds_;
  Entry e{spec, key, std::make_shared<const Layout>(std::move(built)), 0};
  for (int t = 0; t < e.layout->num_tensors(); ++t)
    e.shards += static_cast<int64_t>(e.layout->shards(t).size());
  shards_ += e.shards;
  entries_.push_front(std::move(e));
  while (entries_.size() > 1 && shards_ > max_shards_) {
    shards_ -= entries_.back().shards;
    entries_.pop_back();
  }
  return entries_.front().layout;
}

int64_t LayoutCache::builds() const {
  absl::MutexLock lock(&mu_);
  return builds_;
}

int64_t LayoutCache::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace ptc
