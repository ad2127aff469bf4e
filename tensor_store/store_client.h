// A client of a ptcd's TensorStore service over gRPC, for peers, tools and
// tests. Puts are chunked and carry their checksum; reads verify theirs
// (DATA_LOSS on mismatch). Every call has a deadline that grows with the
// bytes it moves.
//
//   StoreClient c(grpc::CreateChannel("localhost:7070", creds));
//   PTC_RETURN_IF_ERROR(c.Declare("run7", {{"w", DType::kFloat32, {1024,
//   1024}}})); PTC_RETURN_IF_ERROR(c.Put("run7", 1, "w", region, data,
//   bytes).status()); PTC_RETURN_IF_ERROR(c.Read("run7", 1, "w", part, out,
//   out_bytes));
#ifndef PTC_TENSOR_STORE_STORE_CLIENT_H_
#define PTC_TENSOR_STORE_STORE_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/tensor_store.grpc.pb.h"
#include "ptc/tensor_decl.h"

namespace ptc {

class StoreClient {
 public:
  explicit StoreClient(std::shared_ptr<grpc::Channel> channel);
  // An insecure channel to `address` (host:port), with ptcd's message size.
  // With TLS the ptcd's certificate must name `expected_name` (its host
  // name), or the address's host when that is empty.
  static std::unique_ptr<StoreClient> Connect(
      const std::string& address, const std::string& expected_name = "");
  // As Connect, on the process's kept channel to `address` (HostChannel
  // in common/channel.h, shared with its Transformer calls to that host):
  // for a caller that asks the same peers again and again (the
  // coordinator's calls to its hosts), without a connection and
  // handshakes per call.
  static std::unique_ptr<StoreClient> ConnectKept(
      const std::string& address, const std::string& expected_name = "");
  // As Connect, on a connection of its own. A process's channels to one
  // address with the same arguments share their connection, and with it
  // its state: while the peer is unreachable, its failures and the backoff
  // between attempts (up to 5 s). A client kept to ask peers that may be
  // unreachable (the coordinator's probes) takes its own, so that the
  // clients made once the peer is back connect at once.
  static std::unique_ptr<StoreClient> ConnectApart(
      const std::string& address, const std::string& expected_name = "");

  absl::Status Declare(const std::string& job,
                       const std::vector<TensorDecl>& tensors);

  // Fills [offset, offset + n) of the region's row-major bytes into dst.
  using Producer = std::function<void(int64_t offset, char* dst, int64_t n)>;
  // Receives [offset, offset + n) of the region's row-major bytes.
  using Consumer =
      std::function<void(int64_t offset, const char* src, int64_t n)>;

  // Stores `bytes` bytes made by `produce`; returns the stored checksum.
  absl::StatusOr<uint64_t> PutWith(const std::string& job, int64_t version,
                                   const std::string& tensor,
                                   const Region& region, int64_t bytes,
                                   const Producer& produce,
                                   int64_t chunk_bytes = int64_t{1} << 20);
  absl::StatusOr<uint64_t> Put(const std::string& job, int64_t version,
                               const std::string& tensor, const Region& region,
                               const void* data, int64_t bytes);

  // Reads `region`, checks its size and checksum, hands bytes to `consume`.
  // Returns the number of bytes read. With `hollow` (a hollow store
  // reading from a hollow peer: the scale harness), a message that stands
  // for bytes it does not carry is consumed as consume(offset, nullptr, n);
  // without it such a message is refused (DATA_LOSS: the peer is a hollow
  // ptcd). The call gives up after `timeout`
  // (zero: DeadlineFor 64 GiB, the size being unknown up front).
  absl::StatusOr<int64_t> ReadWith(
      const std::string& job, int64_t version, const std::string& tensor,
      const Region& region, const Consumer& consume, int32_t chunk_bytes = 0,
      absl::Duration timeout = absl::ZeroDuration(), bool hollow = false);
  // Reads `region` into `out`, which holds exactly `bytes` bytes.
  absl::Status Read(const std::string& job, int64_t version,
                    const std::string& tensor, const Region& region, void* out,
                    int64_t bytes);

  absl::StatusOr<proto::ListResponse> List(const std::string& job = "");
  absl::StatusOr<proto::StatResponse> Stat(const std::string& job,
                                           int64_t version,
                                           const std::string& tensor);
  // `context`, if given, is the call's (a deadline is set there unless the
  // caller set one): a caller may end the call from another thread with
  // its TryCancel().
  absl::StatusOr<proto::FingerprintResponse> Fingerprint(
      const std::string& job, int64_t version, const std::string& tensor,
      const std::vector<Region>& regions = {},
      grpc::ClientContext* context = nullptr);
  // Several tensors' fingerprints in one call (at most
  // kMaxFingerprintsPerCall): (tensor, regions) each, answered in order.
  // UNIMPLEMENTED from a ptcd older than the call.
  absl::StatusOr<proto::FingerprintsResponse> Fingerprints(
      const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, std::vector<Region>>>& tensors,
      grpc::ClientContext* context = nullptr);
  absl::StatusOr<int64_t> Commit(const std::string& job, int64_t version);
  // A commit (or, with check_only, a check) with expectations.
  absl::StatusOr<proto::CommitVersionResponse> CommitChecked(
      const proto::CommitVersionRequest& req);
  // The call gives up after `timeout` (zero: the default deadline).
  absl::StatusOr<int64_t> DeleteVersion(
      const std::string& job, int64_t version,
      absl::Duration timeout = absl::ZeroDuration());
  // Forgets the job on this ptcd (every version): (versions, bytes).
  absl::StatusOr<proto::DeleteJobResponse> DeleteJob(const std::string& job);
  // The call gives up after `timeout` (zero: the default deadline).
  absl::StatusOr<proto::StatsResponse> Stats(
      absl::Duration timeout = absl::ZeroDuration());
  // Asks the daemon to prepare spare memory of `sizes` for versions of
  // `job` after `version` (a coming change of layout); it only queues
  // them, so a short `timeout` suits a caller that must not wait long.
  absl::StatusOr<proto::PrepareMemoryResponse> PrepareMemory(
      const std::string& job, int64_t version,
      const std::vector<int64_t>& sizes,
      absl::Duration timeout = absl::Seconds(30));
  absl::Status PutSmallObject(const std::string& job, int64_t version,
                              const std::string& name, int32_t rank,
                              const std::string& bytes);
  // The object's bytes, checked against the checksum the daemon stored.
  // The call gives up after `timeout` (zero: the default deadline).
  absl::StatusOr<std::string> GetSmallObject(
      const std::string& job, int64_t version, const std::string& name,
      int32_t rank, absl::Duration timeout = absl::ZeroDuration());
  // Several objects of one version (name, rank each), in their order, each
  // checked against its checksum: one GetSmallObjects call per up to
  // kMaxSmallObjectsPerCall objects and about 4 MiB of answer. `deadline`
  // bounds all the calls (InfiniteFuture: each its default deadline).
  absl::StatusOr<std::vector<std::string>> GetSmallObjects(
      const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, int32_t>>& objects,
      absl::Time deadline = absl::InfiniteFuture());

  proto::TensorStore::Stub* stub() { return stub_.get(); }

  // Deadline for a call that moves `bytes`: 30 s plus 1 s per 100 MB.
  static absl::Duration DeadlineFor(int64_t bytes);

 private:
  // One unary call, in `context` if given, with the deadline set there or
  // else one for `bytes`.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(
      grpc::Status (proto::TensorStore::Stub::*method)(grpc::ClientContext*,
                                                       const Request&,
                                                       Response*),
      const Request& req, int64_t bytes = 0,
      grpc::ClientContext* context = nullptr);

  std::unique_ptr<proto::TensorStore::Stub> stub_;
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_STORE_CLIENT_H_
