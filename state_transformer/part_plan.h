// The pure middle of a host's fragment: which of its regions are kept in
// place, which are staged, and how every piece reaches the staged buffers
// (a part: its method, its source and where it lands). No store, no
// transport, no threads: tests build a FragmentJob by hand and check the
// parts; ExecuteFragment (fragment_executor.h) only runs them.
//
//   std::vector<bool> stored = ...;  // which holds the source stores as is
//   FragmentPartPlan plan = PlanFragmentParts(job, stored);
//   for (const FragmentPart& part : plan.parts) { ... run part ... }
#ifndef PTC_STATE_TRANSFORMER_PART_PLAN_H_
#define PTC_STATE_TRANSFORMER_PART_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ptc/region.h"
#include "state_transformer/fragment.h"

namespace ptc {

// How a fragment's piece reaches this host's staged buffers.
enum class PartMethod {
  // The held region is stored unchanged in the source version on this
  // host: the target version shares its buffer (no bytes move).
  kLink,
  // From this host's own source version, by a strided copy.
  kCopy,
  // From a peer, over the fragment's transport (UCX tagged sends by the
  // source, or a gRPC stream).
  kPull,
  // From the job's snapshot on disk (source host kFromSnapshot).
  kSnapshot,
};

const char* PartMethodName(PartMethod m);

// One unit of work: pieces of one source that run together.
struct FragmentPart {
  PartMethod method = PartMethod::kCopy;
  int32_t source_host = 0;
  // Indexes into FragmentJob::pieces, in plan order; a copy has one piece,
  // a pull or a snapshot read up to kBatchBytes of one source (a larger
  // piece alone), at most kMaxBatchPieces.
  std::vector<int32_t> pieces;
  int64_t bytes = 0;
};

struct FragmentPartPlan {
  // Indexes into FragmentJob::holds. Every hold is either linked (kept in
  // place: shares the source version's buffer) or staged (a new buffer
  // that the parts fill).
  std::vector<int32_t> linked;
  std::vector<int32_t> staged;
  // For every piece (index into FragmentJob::pieces): the staged holds
  // (indexes into `staged`) it lands in. A piece lands in every staged
  // region of its tensor that it intersects.
  std::vector<std::vector<int32_t>> lands_in;
  // Pieces that need no bytes moved: kept in place and landing in no
  // staged region.
  std::vector<int32_t> in_place;
  // The work, ordered round-robin over the sources (starting at one
  // chosen by the host id), so that the parts in flight keep every sender
  // busy and target hosts start on different senders.
  std::vector<FragmentPart> parts;
  int64_t bytes_total = 0;     // every piece
  int64_t bytes_in_place = 0;  // of `in_place`
};

// Remote pieces from one peer run in batches of up to this many bytes (a
// larger piece is a batch of its own) and this many pieces.
inline constexpr int64_t kBatchBytes = int64_t{64} << 20;
inline constexpr size_t kMaxBatchPieces = 256;

// Plans `job` (after ValidateFragment). `stored_exactly[h]` says whether
// this host's source version stores holds[h] as one stored region of
// exactly that region; such a hold that the fragment also keeps in place
// (a piece with this host as source and the same region) is linked.
FragmentPartPlan PlanFragmentParts(const FragmentJob& job,
                                   const std::vector<bool>& stored_exactly);

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_PART_PLAN_H_
