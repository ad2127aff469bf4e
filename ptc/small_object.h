// Small objects: opaque bytes that are part of a job's state but are not
// tensors (RNG states, step counter, LR scheduler, data-loader cursor).
// Each has a scope, the mesh axes whose indices tell its copies apart
// (none: one global object; {pp}: one per stage; every axis: one per rank),
// and a rule for ranks whose coordinates did not exist before.
//
// The source of a target rank at coordinate t of config C' from config C:
//   pp in the scope:  the old stage holding the first layer of t's stage;
//   another scope axis a: t's index on a if C has it (same coordinates),
//     else the rule: kCopy takes index t_a mod C.a, kDerive gives the rank
//     a fresh value derived from its coordinates and the new version
//     (an RNG seed: new data-parallel ranks must not repeat old ranks'
//     dropout masks);
//   axes outside the scope: any index; candidates in rank order.
// The first candidate on a live host wins.
//
//   SmallObjectSource s = SmallObjectSources(spec.small_objects[0], from, to,
//                                            num_layers, to.CoordOf(r));
#ifndef PTC_PTC_SMALL_OBJECT_H_
#define PTC_PTC_SMALL_OBJECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ptc/parallel_config.h"

namespace ptc {

// Largest small object a store takes: they travel inline in one
// local-protocol packet.
inline constexpr int64_t kMaxSmallObjectBytes = 60 * 1024;
// Largest small object the coordinator keeps a copy of where every copy
// of it is on one host (BeginSaveResponse.keep_small_objects); a larger
// one stays with its host only.
inline constexpr int64_t kMaxKeptSmallObjectBytes = 16 * 1024;
// Longest small object name.
inline constexpr int64_t kMaxSmallObjectNameBytes = 256;

enum class NewRankRule { kCopy, kDerive };
absl::string_view NewRankRuleName(NewRankRule rule);

struct SmallObjectSpec {
  std::string name;
  // Mesh axes whose indices distinguish the copies; empty: global.
  std::vector<std::string> scope;
  // What a rank with coordinates the old config lacked receives.
  NewRankRule new_ranks = NewRankRule::kCopy;
  // Typical size, for plan accounting only; the bytes themselves are opaque.
  int64_t bytes = 0;
};

// "global", "stage" ({pp}), "tp_rank" ({pp, tp}) or "rank" (every axis of
// `mesh`), the scopes of the built-in families; INVALID_ARGUMENT otherwise.
absl::StatusOr<std::vector<std::string>> ScopeByName(
    absl::string_view name, const std::vector<std::string>& mesh);
// "global", "per stage", "per pp,tp" ...
std::string ScopeString(const std::vector<std::string>& scope);

struct SmallObjectSource {
  // Ranks of the old config that hold the right copy, preferred first.
  std::vector<int> candidates;
  // Set instead of candidates when the rule derives a fresh value: the
  // target's coordinates on the scope axes, e.g. "dp=2,tp=1".
  std::string derive_from;
};

// `coord`'s indices on the object's scope axes: "dp=2,tp=1" ("global" for
// a global object); what a derived value is derived from.
std::string ScopeCoordinates(const SmallObjectSpec& object,
                             const ParallelConfig& config,
                             const MeshCoord& coord);

SmallObjectSource SmallObjectSources(const SmallObjectSpec& object,
                                     const ParallelConfig& from,
                                     const ParallelConfig& to, int num_layers,
                                     const MeshCoord& target);

// A derived value: the 16 bytes "PTCSEED1" + a little-endian 64-bit seed
// mixed from the job's name, the object's name, `derive_from` and the new
// version: two jobs never derive the same seed for the same coordinates
// and version.
std::string DerivedSmallObject(absl::string_view job, absl::string_view name,
                               absl::string_view derive_from,
                               int64_t target_version);
// The seed of a derived value; nullopt for bytes a rank saved itself.
std::optional<uint64_t> DerivedSeed(absl::string_view bytes);

}  // namespace ptc

#endif  // PTC_PTC_SMALL_OBJECT_H_
