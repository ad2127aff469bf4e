// Benchmark (not a test): for non-contiguous pieces, one-sided gets of
// every contiguous run versus packing at the source and one tagged send,
// over a real ptcd's UCX transport, by run length. On this machine UCX
// emulates the gets over shared memory (its CMA transport has no RMA
// lane) and the tagged sends use CMA; on a cluster with RDMA NICs both
// would be measured again. The crossover sets kMinGetRunBytes
// (ucx_transport.h).
//
//   bazel run -c opt //state_transformer:ucx_get_benchmark
//
// Each case reads a column slice whose rows are `run` bytes from a tensor
// whose rows are twice that, 32 MiB per piece, into a buffer that is
// already faulted in (so the transport is measured, not the allocator);
// min/median/max over 5 reads.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "state_transformer/transformer_service.h"
#include "state_transformer/ucx_transport.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

constexpr int64_t kPieceBytes = int64_t{32} << 20;
constexpr int kReps = 5;

struct Result {
  double min, median, max;  // GB/s
};

Result Summarize(std::vector<double> rates) {
  std::sort(rates.begin(), rates.end());
  return {rates.front(), rates[rates.size() / 2], rates.back()};
}

int Main() {
  testing::TempDir dir;
  TensorStoreServerOptions options;
  options.socket_path = dir.path() + "/ptcd.sock";
  options.host_name = "host0";
  options.services.push_back(
      [](Store* s) { return std::make_unique<TransformerService>(s); });
  auto server = TensorStoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client = StoreClient::Connect(address);
  const std::vector<int64_t> runs = {256, 1024, 2048, 4096, 8192, 16384, 65536};
  std::vector<TensorDecl> decls;
  for (int64_t run : runs) {
    decls.push_back({absl::StrCat("w", run),
                     DType::kFloat32,
                     {kPieceBytes / run, 2 * run / 4}});
  }
  if (!client->Declare("bench", decls).ok()) return 1;
  for (const TensorDecl& d : decls) {
    const Region all{{0, d.shape[0]}, {0, d.shape[1]}};
    std::vector<char> bytes(all.volume() * 4);
    testing::FillPattern(1, 0, bytes.data(), bytes.size());
    if (!client->Put("bench", 1, d.key, all, bytes.data(), bytes.size()).ok())
      return 1;
  }
  if (!client->Commit("bench", 1).ok()) return 1;

  UcxPieceTransport transport(1, {{0, address}});
  std::printf(
      "piece: 32 MiB column slice; GB/s min/median/max over %d reads\n"
      "%8s  %-22s  %-22s  %s\n",
      kReps, "run", "gets", "packed at source", "gets/packed");
  for (size_t i = 0; i < runs.size(); ++i) {
    const TensorDecl& d = decls[i];
    const Region piece{{0, d.shape[0]}, {0, d.shape[1] / 2}};
    std::vector<uint8_t> target(piece.volume() * 4);
    std::memset(target.data(), 0, target.size());  // faulted in
    const PieceTarget targets[] = {{piece, target.data()}};
    auto consume = [&](int64_t off, const char* data, int64_t n) {
      std::memcpy(target.data() + off, data, n);
    };
    std::vector<double> gets, packed;
    for (int rep = 0; rep < kReps + 1; ++rep) {
      for (bool use_gets : {true, false}) {
        transport.set_min_get_run_bytes(use_gets ? 0 : INT64_MAX);
        const absl::Time start = absl::Now();
        const absl::Status s = transport.FetchInto(0, "bench", 1, d.key, piece,
                                                   4, targets, consume);
        const double secs = absl::ToDoubleSeconds(absl::Now() - start);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return 1;
        }
        if (rep == 0) continue;  // warm-up: endpoints, keys, workers
        (use_gets ? gets : packed).push_back(kPieceBytes / 2 / secs / 1e9);
      }
    }
    const Result g = Summarize(gets), p = Summarize(packed);
    std::printf("%7lldB  %5.2f/%5.2f/%5.2f      %5.2f/%5.2f/%5.2f      %.2fx\n",
                static_cast<long long>(runs[i]), g.min, g.median, g.max, p.min,
                p.median, p.max, g.median / p.median);
  }
  return 0;
}

}  // namespace
}  // namespace ptc

int main() { return ptc::Main(); }
