// A host's fragment of a reconfiguration plan as the state transformer
// runs it: what the host holds in the target version, every piece that
// fills it and where the piece comes from, the small objects of its target
// ranks. FragmentJobFromRequest (transformer_service.h) is the one place a
// request becomes a FragmentJob; ValidateFragment checks it before
// anything is staged.
#ifndef PTC_STATE_TRANSFORMER_FRAGMENT_H_
#define PTC_STATE_TRANSFORMER_FRAGMENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "plan/piece.h"
#include "ptc/region.h"
#include "ptc/tensor_decl.h"

namespace ptc {

// A piece as the host runs it: the plan's Transfer (its target host is
// the fragment's host; source host kFromSnapshot reads the job's
// snapshot) and the other hosts that hold all of it, tried in order when
// the source fails (it died or stalled mid-transfer).
struct FragmentPiece : Transfer {
  FragmentPiece() = default;
  // Not an aggregate, so that {tensor, region, source, {alternates}} can
  // never fill the Transfer's later fields by brace elision.
  FragmentPiece(int32_t tensor_id, Region piece, int32_t source,
                std::vector<int32_t> others = {})
      : Transfer{tensor_id, std::move(piece), source},
        alternates(std::move(others)) {}

  std::vector<int32_t> alternates;
};

struct FragmentJob {
  std::string job;
  int64_t source_version = 0;
  int64_t target_version = 0;
  // The plan epoch that staged target_version (Store::CreateStaged); every
  // write into it is made under this epoch.
  int64_t plan_epoch = 0;
  int32_t host = 0;
  std::vector<TensorDecl> tensors;
  // (tensor, region) the host holds afterwards; may overlap.
  std::vector<std::pair<int32_t, Region>> holds;
  std::vector<FragmentPiece> pieces;
  // Small objects of the target ranks on this host (target_host: `host`).
  std::vector<SmallObjectMove> small_objects;
  // In [1, kMaxParallelPulls].
  int parallel_pulls = 4;
};

struct FragmentProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int64_t remote_bytes_done = 0;
  int64_t pieces_done = 0;
  int64_t pieces_total = 0;
};

// Checks a fragment before anything is staged: tensor ids in range, every
// held region and piece of the tensor's rank and inside its shape, pieces
// not empty, every held region covered by the pieces of its tensor (a gap
// would be published as zeros), parallel_pulls in range. INVALID_ARGUMENT
// names the first problem.
absl::Status ValidateFragment(const FragmentJob& job);

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_FRAGMENT_H_
