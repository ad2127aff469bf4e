// The UCX piece transport. It takes the pieces a host needs from one peer
// in batches (FetchBatch), so that the control calls are per batch, not
// per piece. Each piece is split by the staged buffers it lands in; the
// destination posts a tagged receive for every part of a batch at once
// and asks the source with one gRPC call per 64 MiB (SendParts,
// epoch-checked, from an admitted host) to send them all. The source
// sends a part that is one span of its memory as it is (UCX's rendezvous
// has the receiver read it with no copy at the source: RDMA on a cluster,
// CMA on one machine) and packs the others; a part lands in place when it
// is one span of the staged buffer, else in a buffer that is scattered
// while checksummed; the checksums come on the reply. No part is read
// with one-sided gets: ptcd serves none (ucx_worker.h, docs/security.md).
// Fetch (no staged buffers) streams to the consumer.
//
// AutoTransport uses UCX and falls back to the gRPC-stream transport for a
// peer whose ptcd has no UCX worker (or if this one has none).
#ifndef PTC_STATE_TRANSFORMER_UCX_TRANSPORT_H_
#define PTC_STATE_TRANSFORMER_UCX_TRANSPORT_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/scratch_buffers.h"
#include "proto/transformer.grpc.pb.h"
#include "state_transformer/fragment_executor.h"
#include "state_transformer/ucx_worker.h"

namespace ptc {

// What SendParts answers when its ptcd has no worker: FAILED_PRECONDITION
// with the payload that IsNoUcxWorker finds (it crosses gRPC).
absl::Status NoUcxWorkerError();
bool IsNoUcxWorker(const absl::Status& s);

// What one SendParts call may ask for: parts, and bytes to send (the
// source may pack them all).
inline constexpr int kMaxPartsPerCall = 4096;
inline constexpr int64_t kMaxSendPartsBytes = int64_t{64} << 20;
// How many idle pulling workers a process keeps between transfers: two
// fragments' pulling threads at the default 4 each. An idle worker holds
// about 4 MiB (its UCX context's shared-memory queues; measured), so at
// most about 34 MiB a ptcd.
inline constexpr int kMaxIdlePullingWorkers = 8;

class UcxPieceTransport : public PieceTransport {
 public:
  // Each pulling thread uses a worker of its own from the process's pool
  // (created on first use; up to kMaxIdlePullingWorkers are kept for the
  // next transfers, of this transport or a later one).
  // A call or a wait on a peer gives up after TransferDeadline(
  // `peer_timeout`, its bytes).
  UcxPieceTransport(int64_t plan_epoch,
                    const std::map<int32_t, std::string>& peers,
                    std::map<int32_t, std::string> names = {},
                    absl::Duration peer_timeout = absl::Seconds(60));
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::Status FetchInto(int32_t host, const std::string& job, int64_t version,
                         const std::string& tensor, const Region& region,
                         int64_t element_size,
                         absl::Span<const PieceTarget> targets,
                         const StoreClient::Consumer& consume) override;
  absl::Status FetchBatch(int32_t host, const std::string& job, int64_t version,
                          absl::Span<const BatchPiece> pieces) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override {
    return control_.FetchSmallObject(host, job, version, name, rank);
  }
  absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string& job, int64_t version,
      const SmallObjectKeys& keys) override {
    return control_.FetchSmallObjects(host, job, version, keys);
  }

 private:
  // Elements [first, first + count) of `region` of `tensor` (at most
  // kMaxSendPartsBytes), for the source to send: written into `into` (a
  // staged buffer holding `region`), or handed to `consume` at byte
  // `offset` if `into` is null.
  struct Transfer {
    const std::string* tensor;
    Region region;
    int64_t first, count, element_size;
    const PieceTarget* into;
    const StoreClient::Consumer* consume;
    int64_t offset;
  };
  // Appends the transfers that move `region` (split into messages of at
  // most kMaxSendPartsBytes).
  static void AddTransfers(const std::string& tensor, const Region& region,
                           int64_t element_size, const PieceTarget* into,
                           const StoreClient::Consumer* consume,
                           std::vector<Transfer>* out);
  // Has the source send every transfer (SendParts calls of at most
  // kMaxSendPartsBytes each), verifies each one's checksum and places it.
  // Parts that cannot land in place are received into `bounce` (grown as
  // needed) and scattered from there.
  absl::Status SendAll(int32_t host, const std::string& job, int64_t version,
                       UcxWorker* worker, ScratchBuffers::Lease* bounce,
                       absl::Span<const Transfer> transfers);
  // One SendParts call for `transfers`.
  absl::Status SendOnce(int32_t host, const std::string& job, int64_t version,
                        UcxWorker* worker, ScratchBuffers::Lease* bounce,
                        absl::Span<const Transfer> transfers);
  std::string PeerLabel(int32_t host);
  // A worker for the calling thread alone, and its return to the pool.
  absl::StatusOr<std::unique_ptr<UcxWorker>> TakeWorker();
  void ReturnWorker(std::unique_ptr<UcxWorker> worker);

  const int64_t epoch_;
  const absl::Duration peer_timeout_;
  std::map<int32_t, std::unique_ptr<proto::Transformer::Stub>> stubs_;
  std::map<int32_t, std::string> addresses_, names_;
  GrpcPieceTransport control_;  // small objects
};

// UCX for every peer that can, the gRPC transport for the others: a peer
// without a UCX worker is served over gRPC from the start, and a piece
// whose UCX transfer fails (connection refused or lost, a damaged part) is
// fetched again over gRPC, which is then used for that peer from then on.
// Only a stale plan epoch or a cancellation is final.

class AutoTransport : public PieceTransport {
 public:
  // `ucx` may be null (no UCX here): then gRPC is used for every peer.
  AutoTransport(std::unique_ptr<PieceTransport> ucx,
                std::unique_ptr<PieceTransport> grpc)
      : ucx_(std::move(ucx)), grpc_(std::move(grpc)) {}
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::Status FetchInto(int32_t host, const std::string& job, int64_t version,
                         const std::string& tensor, const Region& region,
                         int64_t element_size,
                         absl::Span<const PieceTarget> targets,
                         const StoreClient::Consumer& consume) override;
  absl::Status FetchBatch(int32_t host, const std::string& job, int64_t version,
                          absl::Span<const BatchPiece> pieces) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override {
    return grpc_->FetchSmallObject(host, job, version, name, rank);
  }
  absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string& job, int64_t version,
      const SmallObjectKeys& keys) override {
    return grpc_->FetchSmallObjects(host, job, version, keys);
  }

 private:
  // Runs `ucx` unless the host is on gRPC already; on a UCX failure other
  // than a stale epoch or a cancellation, switches the host to gRPC and
  // runs `grpc`.
  absl::Status WithFallback(int32_t host,
                            const std::function<absl::Status()>& ucx,
                            const std::function<absl::Status()>& grpc);

  std::unique_ptr<PieceTransport> ucx_, grpc_;
  absl::Mutex mu_;
  std::set<int32_t> grpc_only_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_UCX_TRANSPORT_H_
