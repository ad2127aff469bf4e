// Executes one host's fragment of a reconfiguration plan against its
// store: every region the host must hold is staged in the target version
// (a pending, invisible put), filled piece by piece — local pieces copied
// from the host's own source version, remote ones streamed from peers —
// and published only when all pieces have arrived. Pieces are written
// straight into the staged buffers (no whole-tensor copies). Remote
// pieces go in batches of up to kBatchBytes from one peer (FetchBatch); at
// most `parallel_pulls` batches are in flight, and the transport verifies
// every byte's checksum.
//
// On any error nothing of the target version stays on this host.
//
//   GrpcPieceTransport transport(peers);
//   PTC_RETURN_IF_ERROR(ExecuteFragment(&store, job, &transport, on_progress));
#ifndef PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_
#define PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/limits.h"
#include "tensor_store/store.h"
#include "tensor_store/store_client.h"

namespace ptc {

// A staged buffer a piece lands in: the dense row-major bytes of `region`.
struct PieceTarget {
  Region region;
  uint8_t* data = nullptr;
};

// Where remote pieces come from.
class PieceTransport {
 public:
  virtual ~PieceTransport() = default;
  // Streams the row-major bytes of `region` of `tensor` (elements of
  // `element_size` bytes) in `version` of `job` from host `host`, in chunks
  // of whole elements, verifying them.
  virtual absl::Status Fetch(int32_t host, const std::string& job,
                             int64_t version, const std::string& tensor,
                             const Region& region, int64_t element_size,
                             const StoreClient::Consumer& consume) = 0;
  // Like Fetch, for a transport that can place bytes itself: every element
  // of `region` lies in at least one of `targets` (staged buffers: dense
  // row-major bytes of their region), and the piece must end up in every
  // target it intersects. `consume` writes a streamed chunk into them, for
  // transports (or pieces) that stream. The default streams with Fetch.
  virtual absl::Status FetchInto(int32_t host, const std::string& job,
                                 int64_t version, const std::string& tensor,
                                 const Region& region, int64_t element_size,
                                 absl::Span<const PieceTarget> targets,
                                 const StoreClient::Consumer& consume) {
    return Fetch(host, job, version, tensor, region, element_size, consume);
  }
  // Several pieces from the same host in one go (FetchInto for each), so a
  // transport can pay its per-call costs once per batch. The default
  // fetches them one by one.
  struct BatchPiece {
    const std::string* tensor;
    Region region;
    int64_t element_size;
    absl::Span<const PieceTarget> targets;
    const StoreClient::Consumer* consume;
  };
  virtual absl::Status FetchBatch(int32_t host, const std::string& job,
                                  int64_t version,
                                  absl::Span<const BatchPiece> pieces) {
    for (const BatchPiece& p : pieces) {
      absl::Status s = FetchInto(host, job, version, *p.tensor, p.region,
                                 p.element_size, p.targets, *p.consume);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // The bytes of small object `name` of `rank` in `version` on `host`,
  // checked against the checksum the source stored. Small objects are tiny
  // and always travel over the control plane (gRPC).
  virtual absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                                       const std::string& job,
                                                       int64_t version,
                                                       const std::string& name,
                                                       int32_t rank) = 0;
};

// The transport that always works: the peers' TensorStore Read streams.
class GrpcPieceTransport : public PieceTransport {
 public:
  // host id -> "host:port", and host id -> name (for messages; optional).
  explicit GrpcPieceTransport(const std::map<int32_t, std::string>& peers,
                              std::map<int32_t, std::string> names = {});
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override;

 private:
  absl::StatusOr<StoreClient*> ClientFor(int32_t host);

  std::map<int32_t, std::unique_ptr<StoreClient>> clients_;
  std::map<int32_t, std::string> addresses_;
  std::map<int32_t, std::string> names_;
};

struct FragmentPiece {
  int32_t tensor = 0;  // index into FragmentJob::tensors
  Region region;
  int32_t source_host = 0;  // == FragmentJob::host for a local copy
  // Other hosts holding the whole piece, tried in order when source_host
  // fails (it died or stalled mid-transfer).
  std::vector<int32_t> alternates = {};
};

// A small object a rank of the new config takes from a rank of the old.
struct FragmentSmallObject {
  std::string name;
  int32_t target_rank = 0;
  int32_t source_rank = 0;
  int32_t source_host = 0;  // == FragmentJob::host for a local copy
  // Non-empty: no source; the value is DerivedSmallObject(name,
  // derive_from, target version) (a rank whose coordinates are new).
  std::string derive_from;
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
  // Small objects of the target ranks on this host.
  std::vector<FragmentSmallObject> small_objects;
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

// Remote pieces from one peer are fetched in batches of up to this many
// bytes (a larger piece is a batch of its own).
inline constexpr int64_t kBatchBytes = int64_t{64} << 20;

// Checks a fragment before anything is staged: tensor ids in range, every
// held region and piece of the tensor's rank and inside its shape, pieces
// not empty, every held region covered by the pieces of its tensor (a gap
// would be published as zeros), parallel_pulls in range. INVALID_ARGUMENT
// names the first problem.
absl::Status ValidateFragment(const FragmentJob& job);

// Runs `job` to completion (after ValidateFragment). `progress` is called after
// every batch, never concurrently with itself. Errors name the piece, tensor
// and peer.
absl::Status ExecuteFragment(
    Store* store, const FragmentJob& job, PieceTransport* transport,
    const std::function<void(const FragmentProgress&)>& progress);

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_
