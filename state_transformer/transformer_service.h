// ptcd's Transformer service (proto/transformer.proto): executes this
// host's fragment of a plan into a staged version, and commits or aborts
// it when the coordinator decides. Every call carries the plan epoch; a
// call older than the newest epoch the host has seen for the job is
// refused with ABORTED, so a superseded plan can never touch the store.
#ifndef PTC_STATE_TRANSFORMER_TRANSFORMER_SERVICE_H_
#define PTC_STATE_TRANSFORMER_TRANSFORMER_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/transformer.grpc.pb.h"
#include "state_transformer/fragment_executor.h"
#include "state_transformer/ucx_worker.h"
#include "tensor_store/peer_admissions.h"
#include "tensor_store/store.h"

namespace ptc {

struct TransformerOptions {
  // Create this daemon's UCX worker (if UCX cannot start here, peers and
  // this host fall back to gRPC).
  bool use_ucx = true;
  // Snapshots are written and read only under this directory (empty: any
  // absolute path).
  std::string snapshot_root;
};

// The fragment an ExecuteFragment request asks this host to stage, checked
// (ValidateFragment) before anything is staged; INVALID_ARGUMENT names the
// first problem.
absl::StatusOr<FragmentJob> FragmentJobFromRequest(
    const proto::ExecuteFragmentRequest& req);

class TransformerService final : public proto::Transformer::Service {
 public:
  // `admissions` is shared with the host's tensor store service (its reads
  // by hosts check it too); null: one of its own.
  explicit TransformerService(
      Store* store, TransformerOptions options = {},
      std::shared_ptr<PeerAdmissions> admissions = nullptr);
  ~TransformerService() override;

  grpc::Status ExecuteFragment(
      grpc::ServerContext* ctx, const proto::ExecuteFragmentRequest* req,
      grpc::ServerWriter<proto::FragmentProgress>* writer) override;
  grpc::Status AbortStaged(grpc::ServerContext* ctx,
                           const proto::AbortStagedRequest* req,
                           proto::AbortStagedResponse* resp) override;
  grpc::Status CommitStaged(grpc::ServerContext* ctx,
                            const proto::CommitStagedRequest* req,
                            proto::CommitStagedResponse* resp) override;
  grpc::Status SendParts(grpc::ServerContext* ctx,
                         const proto::SendPartsRequest* req,
                         proto::SendPartsResponse* resp) override;
  grpc::Status ExposePieces(grpc::ServerContext* ctx,
                            const proto::ExposePiecesRequest* req,
                            proto::ExposePiecesResponse* resp) override;
  grpc::Status AdmitPeers(grpc::ServerContext* ctx,
                          const proto::AdmitPeersRequest* req,
                          proto::AdmitPeersResponse* resp) override;
  // Snapshots (snapshot_rpc.cc).
  grpc::Status WriteSnapshot(
      grpc::ServerContext* ctx, const proto::WriteSnapshotRequest* req,
      grpc::ServerWriter<proto::SnapshotProgress>* writer) override;
  grpc::Status FinishSnapshot(grpc::ServerContext* ctx,
                              const proto::FinishSnapshotRequest* req,
                              proto::FinishSnapshotResponse* resp) override;
  grpc::Status ReadSnapshot(grpc::ServerContext* ctx,
                            const proto::ReadSnapshotRequest* req,
                            proto::ReadSnapshotResponse* resp) override;

  bool has_ucx() const { return ucx_ != nullptr; }

 private:
  // How a call's plan epoch is checked against the newest the coordinator
  // has sent for the job (ExecuteFragment): a fragment may move it forward
  // (and is refused for an epoch that was aborted); a commit must name it;
  // a peer's call must not be older, and moves nothing.
  enum class EpochUse { kFragment, kCommit, kPeer };
  absl::Status CheckEpoch(const std::string& job, int64_t epoch, EpochUse use);
  absl::Status DoExecute(grpc::ServerContext* ctx,
                         const proto::ExecuteFragmentRequest& req,
                         grpc::ServerWriter<proto::FragmentProgress>* writer);

  // Gives up when `ctx` is cancelled (the caller left, or the server
  // drains) and never waits past its deadline.
  absl::Status DoSendParts(grpc::ServerContext* ctx,
                           const proto::SendPartsRequest& req,
                           proto::SendPartsResponse* resp);
  // What both UCX calls check first: this ptcd has a worker, the call asks
  // for at most kMaxPartsPerCall `what`s, the plan epoch is current, and
  // (with TLS) the caller is a host the coordinator admitted for it.
  absl::Status CheckPeerCall(const grpc::ServerContext* ctx,
                             const std::string& job, int64_t plan_epoch,
                             int parts, const char* what);
  // The stored regions that hold `region` of `tensor`, for a peer to read.
  absl::StatusOr<ReadView> OpenForPeer(const std::string& job, int64_t version,
                                       const std::string& tensor,
                                       const proto::Region& region);
  Store* store_;
  const TransformerOptions options_;
  // AdmitPeers: the hosts that may read from this host, per job and epoch.
  const std::shared_ptr<PeerAdmissions> admissions_;
  std::unique_ptr<UcxWorker> ucx_;
  absl::Mutex mu_;
  // Per job: the newest epoch a fragment came with, and the epochs the
  // coordinator aborted (at most kAbortedEpochsKept, the newest), each
  // fenced on its own: an abort does not move the newest epoch, so an
  // abort for an epoch far ahead cannot fence the job's next plans.
  struct Epochs {
    int64_t newest = 0;
    std::set<int64_t> aborted;
  };
  static constexpr size_t kAbortedEpochsKept = 64;
  std::map<std::string, Epochs> epochs_ ABSL_GUARDED_BY(mu_);
  // Fragments executing now: snapshot writes wait while there are any, so
  // that a change does not share the host with them.
  std::atomic<int> fragments_running_{0};
};

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_TRANSFORMER_SERVICE_H_
