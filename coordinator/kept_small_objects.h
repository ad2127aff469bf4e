// The copies the coordinator keeps of small objects that have no copy on
// a second host. A rank saves its small objects in its host's store; an
// object the ranks of a whole class hold (those that agree on its scope's
// axes, plan/placement.h SmallObjectClasses) is lost with that host if the
// class is all on it: a per-rank step counter, a data loader's position
// per data-parallel rank whose replica is on one host. For such a class,
// BeginSave asks its first rank to send the object with its report too,
// and the coordinator keeps it with the version, in memory, for as long as
// the job owns the version. A change whose source host died takes it from
// there (plan source kFromCoordinator), or as the last resort when every
// copy's host fails during the change. Objects that derive a fresh value
// (an RNG state) need no copy; objects over kMaxKeptSmallObjectBytes, or
// beyond kMaxKeptBytesPerVersion, are not kept, and the job's survival
// line then counts them as lost with their host.
//
//   std::shared_ptr<const KeepPlan> plan =
//       MakeKeepPlan(spec, config, rank_hosts);
//   resp->mutable_keep_small_objects()->Add(plan->names[rank].begin(), ...);
//   ...
//   KeptSmallObjects kept(plan);
//   kept.Add(name, rank, bytes);            // from the rank's report
//   const std::string* copy = kept.Find(name, rank);
#ifndef PTC_COORDINATOR_KEPT_SMALL_OBJECTS_H_
#define PTC_COORDINATOR_KEPT_SMALL_OBJECTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ptc/model_spec.h"

namespace ptc {

// Most bytes it keeps of one version of a job (16,384 ranks x 4 KiB).
inline constexpr int64_t kMaxKeptBytesPerVersion = 64 << 20;

// Which objects each rank of a layout sends the coordinator to keep.
struct KeepPlan {
  // The config and placement (each rank's host) it is for.
  std::string config;
  std::vector<std::string> rank_hosts;
  bool For(const std::string& c, const std::vector<std::string>& hosts) const {
    return c == config && hosts == rank_hosts;
  }
  // Per rank, the objects it sends (most ranks: none).
  std::vector<std::vector<std::string>> names;
  // Classes kept, in all.
  int64_t objects = 0;
};
// The plan for `config` of `spec` placed on `rank_hosts` (one host name
// per rank). INVALID_ARGUMENT if the config does not parse or the
// placement does not place every rank.
absl::StatusOr<KeepPlan> MakeKeepPlan(
    const ModelSpec& spec, const std::string& config,
    const std::vector<std::string>& rank_hosts);

// The copies kept of one version.
class KeptSmallObjects {
 public:
  explicit KeptSmallObjects(std::shared_ptr<const KeepPlan> plan)
      : plan_(std::move(plan)) {}
  // What the version's ranks were asked to send.
  const KeepPlan& plan() const { return *plan_; }
  // Keeps rank `rank`'s copy of `name`; false if the version's budget
  // (kMaxKeptBytesPerVersion) is spent.
  bool Add(const std::string& name, int32_t rank, std::string bytes);
  // The copy, or null.
  const std::string* Find(const std::string& name, int32_t rank) const;
  int64_t bytes() const { return bytes_; }
  int64_t size() const { return static_cast<int64_t>(copies_.size()); }
  // Every copy the plan asks for is kept: no host's loss loses a small
  // object of this version.
  bool Complete() const { return size() >= plan_->objects; }

 private:
  std::shared_ptr<const KeepPlan> plan_;
  absl::flat_hash_map<std::pair<std::string, int32_t>, std::string> copies_;
  int64_t bytes_ = 0;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_KEPT_SMALL_OBJECTS_H_
