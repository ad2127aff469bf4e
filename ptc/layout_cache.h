// Layouts built once and shared. A coordinator needs a job's layout at
// every save's commit, change, survival judgement and snapshot; at 16,384
// ranks each build takes about a quarter of a second and 380 MiB (a 405B
// model, 4.7 million shards), so it keeps the layouts it used last:
//
//   LayoutCache layouts;
//   PTC_ASSIGN_OR_RETURN(std::shared_ptr<const Layout> l,
//                        layouts.Get(job.spec, job.state.config()));
//
// Thread-safe. A layout stays valid for whoever holds it after it leaves
// the cache.
#ifndef PTC_PTC_LAYOUT_CACHE_H_
#define PTC_PTC_LAYOUT_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"

namespace ptc {

class LayoutCache {
 public:
  // Keeps the most recently used layouts while they hold at most
  // `max_shards` shards together (the newest is kept whatever its size).
  // The default holds two 16,384-rank layouts of a 405B model: a job's
  // committed layout and the target of its change.
  static constexpr int64_t kDefaultMaxShards = 10'000'000;
  explicit LayoutCache(int64_t max_shards = kDefaultMaxShards)
      : max_shards_(max_shards) {}

  // The layout of `spec` under `config` (as ModelSpec::ParseConfig reads
  // it; "tp=2,dp=4" and "dp=4,tp=2" are one entry), built on the first
  // ask. The entry holds `spec`, so a spec freed and another made at its
  // address never meets the old one's layouts. Errors are the parse's and
  // BuildLayout's.
  absl::StatusOr<std::shared_ptr<const Layout>> Get(
      const std::shared_ptr<const ModelSpec>& spec, const std::string& config);

  // Layouts built so far (misses), and those the cache holds now.
  int64_t builds() const;
  int64_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const ModelSpec> spec;
    std::string config;
    std::shared_ptr<const Layout> layout;
    int64_t shards = 0;
  };
  const int64_t max_shards_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // most recently used first
  int64_t shards_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t builds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ptc

#endif  // PTC_PTC_LAYOUT_CACHE_H_
