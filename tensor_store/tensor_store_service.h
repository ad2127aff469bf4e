// The gRPC face of a Store (proto/tensor_store.proto).
//
// Uses gRPC's synchronous API: every handler only copies memory between
// the store's buffers and gRPC messages (no disk, no UCX, no planning), so
// a handler thread is never blocked on anything slower than memcpy, and
// the streaming handlers stay straight-line code with gRPC's flow control.
//
//   TensorStoreService service(&store, [&] { return local.num_clients(); });
//   builder.RegisterService(&service);
#ifndef PTC_TENSOR_STORE_TENSOR_STORE_SERVICE_H_
#define PTC_TENSOR_STORE_TENSOR_STORE_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tensor_store.grpc.pb.h"
#include "tensor_store/internal/client_calls.h"
#include "tensor_store/peer_admissions.h"
#include "tensor_store/store.h"

namespace ptc {

class TensorStoreService final : public proto::TensorStore::Service {
 public:
  // `store` must outlive the service; `local_clients` reports how many
  // Unix-socket clients are connected (for Stats). A Put stream that has not
  // ended `put_timeout` after its header is cancelled, and the memory it
  // reserved freed (a client that stalls must not hold it for good). With
  // TLS, a host reads (Read, GetSmallObject[s]) only a job whose current plan
  // admitted it (`admissions`, shared with the transformer); null: hosts
  // read nothing.
  TensorStoreService(Store* store, std::function<int()> local_clients,
                     absl::Duration put_timeout = absl::Minutes(10),
                     std::shared_ptr<PeerAdmissions> admissions = nullptr);
  ~TensorStoreService() override;

  grpc::Status DeclareTensors(grpc::ServerContext* ctx,
                              const proto::DeclareTensorsRequest* req,
                              proto::DeclareTensorsResponse* resp) override;
  grpc::Status Put(grpc::ServerContext* ctx,
                   grpc::ServerReader<proto::PutRequest>* reader,
                   proto::PutResponse* resp) override;
  grpc::Status Read(grpc::ServerContext* ctx, const proto::ReadRequest* req,
                    grpc::ServerWriter<proto::ReadResponse>* writer) override;
  grpc::Status List(grpc::ServerContext* ctx, const proto::ListRequest* req,
                    proto::ListResponse* resp) override;
  grpc::Status Stat(grpc::ServerContext* ctx, const proto::StatRequest* req,
                    proto::StatResponse* resp) override;
  grpc::Status Fingerprint(grpc::ServerContext* ctx,
                           const proto::FingerprintRequest* req,
                           proto::FingerprintResponse* resp) override;
  grpc::Status Fingerprints(grpc::ServerContext* ctx,
                            const proto::FingerprintsRequest* req,
                            proto::FingerprintsResponse* resp) override;
  grpc::Status CommitVersion(grpc::ServerContext* ctx,
                             const proto::CommitVersionRequest* req,
                             proto::CommitVersionResponse* resp) override;
  grpc::Status DeleteVersion(grpc::ServerContext* ctx,
                             const proto::DeleteVersionRequest* req,
                             proto::DeleteVersionResponse* resp) override;
  grpc::Status DeleteJob(grpc::ServerContext* ctx,
                         const proto::DeleteJobRequest* req,
                         proto::DeleteJobResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const proto::StatsRequest* req,
                     proto::StatsResponse* resp) override;
  grpc::Status PrepareMemory(grpc::ServerContext* ctx,
                             const proto::PrepareMemoryRequest* req,
                             proto::PrepareMemoryResponse* resp) override;
  grpc::Status PutSmallObject(grpc::ServerContext* ctx,
                              const proto::PutSmallObjectRequest* req,
                              proto::PutSmallObjectResponse* resp) override;
  grpc::Status GetSmallObject(grpc::ServerContext* ctx,
                              const proto::GetSmallObjectRequest* req,
                              proto::GetSmallObjectResponse* resp) override;
  grpc::Status GetSmallObjects(grpc::ServerContext* ctx,
                               const proto::GetSmallObjectsRequest* req,
                               proto::GetSmallObjectsResponse* resp) override;

 private:
  // Counts the call in active_calls_ and the request counters while alive;
  // Done() records the outcome.
  class Call;

  absl::Status DoPut(grpc::ServerContext* ctx,
                     grpc::ServerReader<proto::PutRequest>* reader,
                     proto::PutResponse* resp);
  absl::Status DoRead(grpc::ServerContext* ctx, const proto::ReadRequest& req,
                      grpc::ServerWriter<proto::ReadResponse>* writer);

  // Cancels Put streams past their deadline (one thread for all).
  void WatchPuts();

  // After AuthorizeCall: a host caller must be a peer of `job`'s current
  // plan here (with TLS).
  absl::Status CheckHostAdmitted(const grpc::ServerContext& ctx,
                                 const char* rpc, const std::string& job);

  // A slot in client_calls_ for a call of a job's client (with TLS: a
  // client certificate; without: any caller of an RPC that `writes`); an
  // empty slot for the coordinator's, admins' and peers' calls.
  absl::StatusOr<ClientCalls::Slot> EnterClientCall(
      const grpc::ServerContext& ctx, const char* rpc, bool writes);

  Store* store_;
  std::function<int()> local_clients_;
  ClientCalls client_calls_;
  const absl::Duration put_timeout_;
  const std::shared_ptr<PeerAdmissions> admissions_;
  std::atomic<int> active_calls_{0};
  const absl::Time started_ = absl::Now();

  absl::Mutex watch_mu_;
  // Put streams in progress: their call and deadline; a stream the
  // watchdog cancelled moves to expired_.
  std::map<grpc::ServerContext*, absl::Time> puts_ ABSL_GUARDED_BY(watch_mu_);
  std::set<grpc::ServerContext*> expired_ ABSL_GUARDED_BY(watch_mu_);
  bool stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watchdog_;

  // Per job: the expectations its commits last sent with an id (kept for
  // later commits that name it; CommitVersionRequest.expectations_id).
  struct KeptExpectations {
    uint64_t id = 0;
    std::shared_ptr<const VersionExpectation> expect;
  };
  absl::Mutex kept_mu_;
  std::map<std::string, KeptExpectations> kept_ ABSL_GUARDED_BY(kept_mu_);
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_TENSOR_STORE_SERVICE_H_
