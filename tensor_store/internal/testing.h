// Test support for the tensor store: an in-process daemon on localhost:0
// with a socket in a fresh temporary directory, and a deterministic byte
// pattern that can be produced and checked in chunks of any size.
#ifndef PTC_TENSOR_STORE_INTERNAL_TESTING_H_
#define PTC_TENSOR_STORE_INTERNAL_TESTING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "tensor_store/store_client.h"
#include "tensor_store/tensor_store_server.h"

namespace ptc::testing {

// A fresh directory under $TEST_TMPDIR (or /tmp), removed with its files
// when destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Daemon {
  TempDir dir;
  std::unique_ptr<TensorStoreServer> server;
  std::unique_ptr<StoreClient> client;

  std::string socket_path() const { return dir.path() + "/ptcd.sock"; }
  std::string address() const;
};

// Starts a daemon with `memory_limit` bytes (and `spare_pool` bytes of
// ready memory for local saves); aborts the test on failure.
std::unique_ptr<Daemon> StartDaemon(int64_t memory_limit = int64_t{8} << 30,
                                    int64_t spare_pool = 0);

// A host that accepts connections and calls but answers no Fingerprint,
// DeleteVersion or Stats until the call is cancelled or its deadline
// passes, as a stopped ptcd (SIGSTOP) or one behind a cut link does; on
// localhost:0.
class SilentStore final : public proto::TensorStore::Service {
 public:
  SilentStore();
  ~SilentStore() override;
  std::string address() const;
  // Calls it has taken.
  int calls() const { return calls_.load(); }

  grpc::Status Fingerprint(grpc::ServerContext* ctx,
                           const proto::FingerprintRequest*,
                           proto::FingerprintResponse*) override;
  grpc::Status DeleteVersion(grpc::ServerContext* ctx,
                             const proto::DeleteVersionRequest*,
                             proto::DeleteVersionResponse*) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const proto::StatsRequest*,
                     proto::StatsResponse*) override;

 private:
  grpc::Status Hold(grpc::ServerContext* ctx);

  int port_ = 0;
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

// Byte `offset` of stream `seed`: the same whatever the chunking.
// Memory a store's data uses: memory_used_bytes less what the tensor
// declarations are charged.
inline int64_t DataBytesUsed(const proto::StatsResponse& stats) {
  return stats.memory_used_bytes() - stats.metadata_bytes();
}

void FillPattern(uint64_t seed, int64_t offset, char* dst, int64_t n);
// Whether [offset, offset+n) of stream `seed` equals `src`.
bool CheckPattern(uint64_t seed, int64_t offset, const char* src, int64_t n);

}  // namespace ptc::testing

#endif  // PTC_TENSOR_STORE_INTERNAL_TESTING_H_
