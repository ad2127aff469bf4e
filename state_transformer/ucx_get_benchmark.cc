// Benchmark (not a test): one-sided gets of every contiguous run versus a
// tagged send by the source (from its memory as it is when the part is one
// span there, else packed), over a real ptcd's UCX transport, by the shape
// of the piece. On this machine UCX emulates the gets over shared memory
// (its CMA transport has no RMA lane) and the tagged sends use CMA; on a
// cluster with RDMA NICs both would be measured again. The crossover sets
// kMinGetRunBytes (ucx_transport.h).
//
//   bazel run -c opt //state_transformer:ucx_get_benchmark
//
// Each case reads a 32 MiB piece into a buffer that is already faulted in
// (so the transport is measured, not the allocator); min/median/max over 5
// reads.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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
  // Column slices of tensors whose rows are twice the run: short runs at
  // both ends. Then the two shapes of pieces a Megatron change moves most:
  // a whole stored region into a buffer of the same region (contiguous at
  // both ends) and a column shard into a buffer of the whole tensor
  // (contiguous at the source, 1 KiB runs at the destination).
  struct Case {
    std::string name;
    TensorDecl decl;
    std::vector<Region> stored;
    Region piece, target;
  };
  std::vector<Case> cases;
  for (int64_t run : {256, 1024, 2048, 4096, 8192, 16384, 65536}) {
    const int64_t rows = kPieceBytes / run, cols = 2 * run / 4;
    const Region all{{0, rows}, {0, cols}};
    cases.push_back({absl::StrCat("slice ", run, "B"),
                     {absl::StrCat("w", run), DType::kFloat32, {rows, cols}},
                     {all},
                     Region{{0, rows}, {0, cols / 2}},
                     Region{{0, rows}, {0, cols / 2}}});
  }
  {
    const Region all{{0, kPieceBytes / 4096}, {0, 1024}};
    cases.push_back({"whole region",
                     {"whole", DType::kFloat32, {kPieceBytes / 4096, 1024}},
                     {all},
                     all,
                     all});
  }
  {
    const int64_t rows = kPieceBytes / 1024;
    const Region left{{0, rows}, {0, 256}}, right{{0, rows}, {256, 512}};
    cases.push_back({"shard->1KiB",
                     {"shard", DType::kFloat32, {rows, 512}},
                     {left, right},
                     left,
                     Region{{0, rows}, {0, 512}}});
  }
  std::vector<TensorDecl> decls;
  for (const Case& c : cases) decls.push_back(c.decl);
  if (!client->Declare("bench", decls).ok()) return 1;
  for (const Case& c : cases) {
    for (const Region& r : c.stored) {
      std::vector<char> bytes(r.volume() * 4);
      testing::FillPattern(1, 0, bytes.data(), bytes.size());
      if (!client->Put("bench", 1, c.decl.key, r, bytes.data(), bytes.size())
               .ok())
        return 1;
    }
  }
  if (!client->Commit("bench", 1).ok()) return 1;

  UcxPieceTransport transport(1, {{0, address}});
  std::printf(
      "32 MiB pieces; GB/s min/median/max over %d reads\n"
      "%13s  %-22s  %-22s  %s\n",
      kReps, "piece", "gets", "sent by the source", "gets/sent");
  for (const Case& c : cases) {
    std::vector<uint8_t> target(c.target.volume() * 4);
    std::memset(target.data(), 0, target.size());  // faulted in
    const PieceTarget targets[] = {{c.target, target.data()}};
    auto consume = [&](int64_t, const char*, int64_t) {
      std::fprintf(stderr, "the piece was streamed, not placed\n");
      std::abort();
    };
    std::vector<double> gets, sent;
    for (int rep = 0; rep < kReps + 1; ++rep) {
      for (bool use_gets : {true, false}) {
        transport.set_min_get_run_bytes(use_gets ? 0 : INT64_MAX);
        transport.set_get_contiguous(use_gets);
        const absl::Time start = absl::Now();
        const absl::Status s = transport.FetchInto(
            0, "bench", 1, c.decl.key, c.piece, 4, targets, consume);
        const double secs = absl::ToDoubleSeconds(absl::Now() - start);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return 1;
        }
        if (rep == 0) continue;  // warm-up: endpoints, keys, workers
        (use_gets ? gets : sent).push_back(c.piece.volume() * 4 / secs / 1e9);
      }
    }
    const Result g = Summarize(gets), p = Summarize(sent);
    std::printf("%13s  %5.2f/%5.2f/%5.2f      %5.2f/%5.2f/%5.2f      %.2fx\n",
                c.name.c_str(), g.min, g.median, g.max, p.min, p.median, p.max,
                g.median / p.median);
  }
  return 0;
}

}  // namespace
}  // namespace ptc

int main() { return ptc::Main(); }
