// The plan's pieces, declared once for the planner and for the state
// transformer that carries a host's fragment out: a piece of a target
// region and where it comes from, a small object's move, and the source
// host that stands for the job's snapshot. A fragment's piece is a
// Transfer with the other hosts that hold it (state_transformer/fragment.h).
#ifndef PTC_PLAN_PIECE_H_
#define PTC_PLAN_PIECE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ptc/region.h"

namespace ptc {

// The source host of pieces and small objects read from a snapshot.
inline constexpr int32_t kFromSnapshot = -1;
// The source host of a small object whose every copy died with its host,
// taken from the copy the coordinator keeps (SmallObjectMove::kept_rank).
inline constexpr int32_t kFromCoordinator = -2;

// One piece of a target region and where it comes from. A piece whose
// source host is its target host is a copy inside the host's store.
struct Transfer {
  int32_t tensor = 0;
  Region region;
  int32_t source_host = 0;
  int32_t target_host = 0;
  // Set only in per-rank plans (the Tenplex-style baseline), where every
  // target rank fetches its own copy; -1 in host-level plans.
  int32_t target_rank = -1;
};

// A small object (RNG state, step counter, ...) a target rank takes from a
// source rank under the scope's rule (ptc/small_object.h).
struct SmallObjectMove {
  std::string name;
  int32_t target_rank = 0;
  int32_t source_rank = 0;
  int32_t source_host = 0;
  int32_t target_host = 0;
  // Non-empty: derive a fresh value from these coordinates instead of
  // copying (source_rank and source_host are -1).
  std::string derive_from;
  // Other copies on other live hosts (source rank and its host), in
  // preference order: taken when the source host fails during the change.
  struct Copy {
    int32_t rank = 0;
    int32_t host = 0;
  };
  std::vector<Copy> alternates;
  // Non-empty for an object a new rank may derive afresh (an RNG state):
  // the coordinates a fresh value derives from if every copy's host
  // failed, instead of aborting the change.
  std::string derive_fallback;
  // >= 0: the coordinator keeps a copy of this object as rank kept_rank
  // saved it (every copy was on one host): the source when source_host is
  // kFromCoordinator, else taken when every copy's host failed.
  int32_t kept_rank = -1;
  // That copy, attached by the coordinator to a fragment's request (never
  // in a plan).
  std::optional<std::string> kept;
};

// Most alternates a small object's move lists.
inline constexpr int kMaxSmallObjectAlternates = 3;

}  // namespace ptc

#endif  // PTC_PLAN_PIECE_H_
