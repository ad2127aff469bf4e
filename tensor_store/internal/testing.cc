#include "tensor_store/internal/testing.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mix.h"

namespace ptc::testing {
TempDir::TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/ptc-XXXXXX");
  // Unix socket paths are limited to 108 bytes; fall back to /tmp.
  if (tmpl.size() > 80) tmpl = "/tmp/ptc-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::cerr << "mkdtemp failed\n";
    std::abort();
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

SilentStore::SilentStore() {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    std::cerr << "SilentStore: the server did not start\n";
    std::abort();
  }
}

SilentStore::~SilentStore() { server_->Shutdown(); }

std::string SilentStore::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

grpc::Status SilentStore::Hold(grpc::ServerContext* ctx) {
  ++calls_;
  while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
  return grpc::Status::CANCELLED;
}

grpc::Status SilentStore::Fingerprint(grpc::ServerContext* ctx,
                                      const proto::FingerprintRequest*,
                                      proto::FingerprintResponse*) {
  return Hold(ctx);
}

grpc::Status SilentStore::DeleteVersion(grpc::ServerContext* ctx,
                                        const proto::DeleteVersionRequest*,
                                        proto::DeleteVersionResponse*) {
  return Hold(ctx);
}

grpc::Status SilentStore::Stats(grpc::ServerContext* ctx,
                                const proto::StatsRequest*,
                                proto::StatsResponse*) {
  return Hold(ctx);
}

std::string Daemon::address() const {
  return absl::StrCat("127.0.0.1:", server->port());
}

std::unique_ptr<Daemon> StartDaemon(int64_t memory_limit, int64_t spare_pool) {
  auto d = std::make_unique<Daemon>();
  TensorStoreServerOptions options;
  options.socket_path = d->socket_path();
  options.memory_limit_bytes = memory_limit;
  options.spare_pool_bytes = spare_pool;
  auto server = TensorStoreServer::Start(options);
  if (!server.ok()) {
    std::cerr << "starting the daemon: " << server.status() << "\n";
    std::abort();
  }
  d->server = std::move(*server);
  d->client = StoreClient::Connect(d->address());
  return d;
}

void FillPattern(uint64_t seed, int64_t offset, char* dst, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    const int64_t o = offset + i;
    const uint64_t word =
        SplitMix64(seed * 0x100000001b3ULL ^ static_cast<uint64_t>(o / 8));
    const int64_t skip = o % 8;
    const int64_t take = std::min<int64_t>(8 - skip, n - i);
    std::memcpy(dst + i, reinterpret_cast<const char*>(&word) + skip, take);
    i += take;
  }
}

bool CheckPattern(uint64_t seed, int64_t offset, const char* src, int64_t n) {
  char buf[4096];
  for (int64_t i = 0; i < n; i += sizeof(buf)) {
    const int64_t m = std::min<int64_t>(sizeof(buf), n - i);
    FillPattern(seed, offset + i, buf, m);
    if (std::memcmp(buf, src + i, m) != 0) return false;
  }
  return true;
}

}  // namespace ptc::testing
