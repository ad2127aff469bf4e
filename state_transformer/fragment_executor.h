// Executes one host's fragment of a reconfiguration plan against its
// store: every region the host must hold is staged in the target version
// (a pending, invisible put), filled piece by piece — local pieces copied
// from the host's own source version, remote ones pulled from peers, lost
// ones read from the job's snapshot — and published only when all pieces
// have arrived. What goes how is decided first, purely (part_plan.h); the
// executor only runs the parts. Pieces are written straight into the
// staged buffers (no whole-tensor copies). Remote pieces go in batches of
// up to kBatchBytes from one peer (FetchBatch); at most `parallel_pulls`
// batches are in flight, and the transport verifies every byte's checksum.
//
// On any error nothing of the target version stays on this host.
//
//   GrpcPieceTransport transport(peers);
//   PTC_RETURN_IF_ERROR(ExecuteFragment(&store, job, &transport, on_progress));
#ifndef PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_
#define PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/limits.h"
#include "state_transformer/fragment.h"
#include "tensor_store/store.h"
#include "tensor_store/store_client.h"

namespace ptc {

// How long a transfer of `bytes` from a peer may take: the fragment's peer
// timeout (which the coordinator derives from its host timeout) plus the
// bytes at 1 MB/s. It separates slowness from death: a peer that dies is
// noticed sooner and otherwise (its connection resets, or its channel's
// keepalive pings go unanswered for 4 s, and the transfer's call fails;
// the coordinator declares the host dead and moves the change on), so the
// deadline only catches a live peer that stopped sending. At 100 MB/s,
// then at 10 MB/s, a source starved of CPU (the benchmark at nice 19
// beside a test suite and a busy loop, a load of 10-14) missed it on a
// change that then aborted while every peer was alive.
inline absl::Duration TransferDeadline(absl::Duration peer_timeout,
                                       int64_t bytes) {
  return peer_timeout + absl::Seconds(static_cast<double>(bytes) / 1e6);
}

// What the writers of a staged buffer add up while they write it, so that
// the change's proof needs no second read of its bytes: the fingerprint
// (ptc/fingerprint.h) of the elements written and their count, computed
// from the written bytes while they are in cache. The pieces a host
// receives do not overlap, so where every write added itself and the
// count is the buffer's volume, the sum is the whole buffer's fingerprint
// (Whole). A write that cannot add itself (a streamed chunk) marks the
// buffer incomplete: it is then fingerprinted by reading it, as before.
// `checksum` is the buffer's xxh3 where one verified part filled all of it
// in order (the part's checksum is then the buffer's). Thread-safe.
struct StagedSums {
  std::atomic<uint64_t> fingerprint{0};  // mod 2^64, as fingerprints add
  std::atomic<int64_t> elements{0};
  std::atomic<bool> incomplete{false};
  std::atomic<bool> has_checksum{false};
  std::atomic<uint64_t> checksum{0};

  void Add(uint64_t f, int64_t n) {
    fingerprint.fetch_add(f, std::memory_order_relaxed);
    elements.fetch_add(n, std::memory_order_relaxed);
  }
  // The buffer's fingerprint if its writes added up to exactly `volume`.
  std::optional<uint64_t> Whole(int64_t volume) const {
    if (incomplete.load() || elements.load() != volume) return std::nullopt;
    return fingerprint.load();
  }
  // Its xxh3 if one part filled it whole (and nothing else wrote it).
  std::optional<uint64_t> WholeChecksum(int64_t volume) const {
    if (!has_checksum.load() || !Whole(volume)) return std::nullopt;
    return checksum.load();
  }
};

// A staged buffer a piece lands in: the dense row-major bytes of `region`
// of a tensor of `shape`; a transport that writes into `data` adds what it
// wrote to `sums` (null: nothing is added up).
struct PieceTarget {
  Region region;
  uint8_t* data = nullptr;
  StagedSums* sums = nullptr;
  absl::Span<const int64_t> shape;
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
  // Several small objects of `version` on `host` ((name, rank) each), in
  // their order, each checked: all or an error. By default one
  // FetchSmallObject each; over gRPC one call for them all.
  using SmallObjectKeys = std::vector<std::pair<std::string, int32_t>>;
  virtual absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string& job, int64_t version,
      const SmallObjectKeys& keys) {
    std::vector<std::string> got;
    for (const auto& [name, rank] : keys) {
      absl::StatusOr<std::string> one =
          FetchSmallObject(host, job, version, name, rank);
      if (!one.ok()) return one.status();
      got.push_back(*std::move(one));
    }
    return got;
  }
};

// The transport that always works: the peers' TensorStore Read streams.
class GrpcPieceTransport : public PieceTransport {
 public:
  // host id -> "host:port", and host id -> name (for messages; optional).
  // A read gives up after TransferDeadline(`peer_timeout`, its bytes).
  // With `hollow`, reads from hollow peers are taken (StoreClient::
  // ReadWith): the transport of a hollow store. `cancelled`, when given,
  // says that the change was cancelled: a read refused for load is not
  // asked again then.
  explicit GrpcPieceTransport(const std::map<int32_t, std::string>& peers,
                              std::map<int32_t, std::string> names = {},
                              absl::Duration peer_timeout = absl::Seconds(60),
                              bool hollow = false,
                              std::function<bool()> cancelled = nullptr);
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override;
  absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string& job, int64_t version,
      const SmallObjectKeys& keys) override;

 private:
  absl::StatusOr<StoreClient*> ClientFor(int32_t host);
  // "NAME (ADDRESS)" of a peer ClientFor knows, for errors.
  std::string PeerName(int32_t host) const;

  std::map<int32_t, std::unique_ptr<StoreClient>> clients_;
  std::map<int32_t, std::string> addresses_;
  std::map<int32_t, std::string> names_;
  const absl::Duration peer_timeout_;
  const bool hollow_;
  const std::function<bool()> cancelled_;
};

// Runs `job` to completion (ValidateFragment first): plans its parts
// (PlanFragmentParts), stages a buffer for every region it does not keep
// in place, runs the parts on up to job.parallel_pulls threads, then
// publishes the buffers, the kept regions and the small objects. On any
// error, or when `cancel` reads true before every part ran, nothing of the
// target version stays on this host. `progress` is called after every
// part, never concurrently with itself. Errors name the piece, tensor and
// peer.
absl::Status ExecuteFragment(
    Store* store, const FragmentJob& job, PieceTransport* transport,
    const std::function<void(const FragmentProgress&)>& progress,
    const std::atomic<bool>* cancel = nullptr);

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_FRAGMENT_EXECUTOR_H_
