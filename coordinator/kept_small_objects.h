// The copies the coordinator keeps of small objects that have no copy on
// a second host. A rank saves its small objects in its host's store; an
// object the ranks of a whole class hold (those that agree on its scope's
// axes, plan/placement.h SmallObjectClasses) is lost with that host if the
// class is all on it: a per-rank step counter, a data loader's position
// per data-parallel rank whose replica is on one host. For such a class,
// BeginSave asks its first rank to send the object with its report too,
// and the coordinator keeps it with the version for as long as the job
// owns the version: in memory, and the committed version's in its records
// too, so that a coordinator that takes over has them. A change whose source
// host died takes it from there (plan source kFromCoordinator), or as the last
// resort when every copy's host fails during the change. Objects that derive a
// fresh value (an RNG state) need no copy; objects over
// kMaxKeptSmallObjectBytes, or beyond kMaxKeptBytesPerVersion, are not kept,
// and the job's survival line then counts them as lost with their host.
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
#include "proto/coordinator.pb.h"
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
      : plan_(std::move(plan)), stamp_(NewStamp()) {}
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
  // Differs from every other object's, and changes with each Add: the
  // coordinator writes the copies to its records when it changed.
  uint64_t stamp() const { return stamp_; }

  // The copies as the records "kept/JOB.VERSION.PART" hold them (parts of
  // about kKeptPartBytes), and back. A version loaded from its records has
  // a plan of its object count only (names empty: no rank is asked for a
  // committed version's objects).
  std::vector<proto::KeptCopies> ToRecords(const std::string& job,
                                           int64_t version) const;
  static std::shared_ptr<KeptSmallObjects> FromRecords(
      const std::vector<proto::KeptCopies>& parts);

 private:
  static uint64_t NewStamp();

  std::shared_ptr<const KeepPlan> plan_;
  absl::flat_hash_map<std::pair<std::string, int32_t>, std::string> copies_;
  int64_t bytes_ = 0;
  uint64_t stamp_;
};

// The size a record of kept copies grows to before the next begins (each
// copy is at most kMaxKeptSmallObjectBytes more).
inline constexpr int64_t kKeptPartBytes = 256 << 10;
// The most bytes of one version's copies written to the coordinator's
// records (at every save, under its lock): a version with more keeps them
// in memory only.
inline constexpr int64_t kMaxPersistedKeptBytes = 4 << 20;

}  // namespace ptc

#endif  // PTC_COORDINATOR_KEPT_SMALL_OBJECTS_H_
