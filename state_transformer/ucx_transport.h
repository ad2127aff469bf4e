// The UCX piece transport. A piece (what this host needs of a tensor from
// one peer) is split by the staged buffers it lands in (FetchInto) and,
// through ExposePiece (epoch-checked), by the source's stored buffers:
// the source registers them and returns their addresses, remote keys and
// each part's checksum. Each part then moves one of two ways:
// - one-sided gets, when its contiguous runs are long: the destination
//   reads every run straight into the staged buffer and checksums what
//   landed, a few MiB at a time while it is still in cache;
// - a tagged send by the source (Pull; short runs, where one get per run
//   costs more than a copy): per 64 MiB the destination posts a tagged
//   receive and asks the source over gRPC (SendPart, epoch-checked) to
//   send; a part that is one span of the source's memory is sent from it
//   as it is (UCX's rendezvous has the receiver read it: RDMA on a
//   cluster, CMA on one machine), others are packed first. It lands in
//   place when it is one span of the staged buffer, else in a buffer that
//   is scattered while checksummed; the checksum comes on the reply.
// The run length that separates the two was chosen by measurement
// (kMinGetRunBytes, state_transformer:ucx_get_benchmark;
// docs/benchmarks.md). Fetch (no staged buffers) streams to the consumer.
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
#include "proto/transformer.grpc.pb.h"
#include "state_transformer/fragment_executor.h"
#include "state_transformer/ucx_worker.h"

namespace ptc {

// What SendPart answers (FAILED_PRECONDITION) when its ptcd has no worker.
inline constexpr char kNoUcxWorker[] = "this ptcd has no UCX worker";

// Parts whose contiguous runs average fewer bytes are sent by the source
// rather than read with one get per run.
inline constexpr int64_t kMinGetRunBytes = 4 << 10;

class UcxPieceTransport : public PieceTransport {
 public:
  // Parts whose runs average fewer bytes are sent by the source; for
  // measuring the crossover (tools: ucx_get_benchmark).
  void set_min_get_run_bytes(int64_t bytes) { min_get_run_bytes_ = bytes; }

  // Each pulling thread uses a worker of its own from a pool (created on
  // first use, kept for the transport's life).
  UcxPieceTransport(int64_t plan_epoch,
                    const std::map<int32_t, std::string>& peers,
                    std::map<int32_t, std::string> names = {});
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override;
  absl::Status FetchInto(int32_t host, const std::string& job, int64_t version,
                         const std::string& tensor, const Region& region,
                         int64_t element_size,
                         absl::Span<const PieceTarget> targets,
                         const StoreClient::Consumer& consume) override;
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override {
    return control_.FetchSmallObject(host, job, version, name, rank);
  }

 private:
  // Fetches `region`, all inside `target`'s staged buffer: the source
  // exposes the stored buffers that hold it (ExposePiece); each one's part
  // is read with gets when its runs are long, else sent (Pull).
  absl::Status FetchShare(int32_t host, const std::string& job, int64_t version,
                          const std::string& tensor, const Region& region,
                          int64_t element_size, const PieceTarget& target);
  // Asks the source to send `region` part by part (SendPart), checksums
  // every part and writes it into `into` (a staged buffer holding
  // `region`: received in place when the part is one span there, else
  // scattered), or, if `into` is null, hands it to `consume`.
  absl::Status Pull(int32_t host, const std::string& job, int64_t version,
                    const std::string& tensor, const Region& region,
                    int64_t element_size, const PieceTarget* into,
                    const StoreClient::Consumer& consume);
  std::string PeerLabel(int32_t host);
  // A worker for the calling thread alone, and its return to the pool.
  absl::StatusOr<std::unique_ptr<UcxWorker>> TakeWorker();
  void ReturnWorker(std::unique_ptr<UcxWorker> worker);

  absl::Mutex mu_;
  std::vector<std::unique_ptr<UcxWorker>> idle_ ABSL_GUARDED_BY(mu_);
  const int64_t epoch_;
  int64_t min_get_run_bytes_ = kMinGetRunBytes;
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
  absl::StatusOr<std::string> FetchSmallObject(int32_t host,
                                               const std::string& job,
                                               int64_t version,
                                               const std::string& name,
                                               int32_t rank) override {
    return grpc_->FetchSmallObject(host, job, version, name, rank);
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
