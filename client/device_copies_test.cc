// GPU copies between CUDA memory and a real cluster's store (a coordinator
// and ptcd daemons in process). Where this host has no usable GPU (the
// development machine and CI), the test checks that DeviceCopies says why
// and that nothing else is attempted; where it has one, every region of a
// job round-trips GPU -> store -> GPU bit for bit, and misuse (host memory,
// a wrong size) is refused with a reason.
#include "client/device_copies.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "absl/strings/match.h"
#include "client/internal/testing.h"
#include "tools/internal/synthetic.h"

namespace ptc {
namespace {

using testing::ClientCluster;

constexpr char kModel[] =
    "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8";

int UsableGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

TEST_CASE("device copies: without a usable GPU, Create says why",
          "[device_copies]") {
  if (UsableGpus() > 0) return;  // the next test case runs instead
  auto copies = DeviceCopies::Create(0);
  REQUIRE_FALSE(copies.ok());
  CHECK(copies.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(copies.status().message(), "CUDA is not usable"));
}

TEST_CASE("device copies: a job's regions round-trip GPU -> store -> GPU",
          "[device_copies]") {
  const int gpus = UsableGpus();
  if (gpus == 0) return;  // the test case above runs instead
  CHECK(DeviceCopies::Create(-1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(DeviceCopies::Create(gpus).status().code() ==
        absl::StatusCode::kInvalidArgument);

  ClientCluster cluster(1, 2);
  cluster.RegisterJob("j", kModel, "tp=2", {"host0"});
  auto copies = DeviceCopies::Create(0);
  INFO(copies.status().ToString());
  REQUIRE(copies.ok());
  std::vector<std::unique_ptr<Client>> clients;
  int64_t version = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto c = Client::Connect(
        {cluster.daemons.daemons[0]->socket_path(), cluster.address, "j", rank});
    REQUIRE(c.ok());
    auto save = (*c)->BeginSave(7);
    REQUIRE(save.ok());
    version = (*save)->version();
    std::vector<void*> device;
    for (int i = 0; i < static_cast<int>((*c)->regions().size()); ++i) {
      const RankRegion& r = (*c)->regions()[i];
      const std::vector<char> bytes =
          tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
      void* d = nullptr;
      REQUIRE(cudaMalloc(&d, bytes.size()) == cudaSuccess);
      REQUIRE(cudaMemcpy(d, bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice) == cudaSuccess);
      device.push_back(d);
      if (i == 0) {
        // Host memory and a wrong size are refused before any copy.
        CHECK((*copies)
                  ->Save(**save, i, reinterpret_cast<uintptr_t>(bytes.data()),
                         bytes.size(), 0)
                  .code() == absl::StatusCode::kInvalidArgument);
        CHECK((*copies)
                  ->Save(**save, i, reinterpret_cast<uintptr_t>(d),
                         bytes.size() + 1, 0)
                  .code() == absl::StatusCode::kInvalidArgument);
      }
      REQUIRE((*copies)
                  ->Save(**save, i, reinterpret_cast<uintptr_t>(d),
                         bytes.size(), 0)
                  .ok());
    }
    auto stats = (*copies)->Finish();
    REQUIRE(stats.ok());
    CHECK(stats->regions == static_cast<int>((*c)->regions().size()));
    CHECK(stats->pageable_regions == 0);
    for (void* d : device) cudaFree(d);
    for (const SmallObjectSpec& o : (*c)->spec().small_objects)
      REQUIRE((*save)
                  ->PutSmallObject(o.name,
                                   tools::SyntheticSmallObject(o.name, rank))
                  .ok());
    REQUIRE((*save)->Commit().ok());
    clients.push_back(*std::move(c));
  }
  for (auto& c : clients) {
    REQUIRE(c->WaitCommitted(version, absl::Seconds(10)).ok());
    auto state = c->Load();
    REQUIRE(state.ok());
    for (int i = 0; i < static_cast<int>(c->regions().size()); ++i) {
      const RankRegion& r = c->regions()[i];
      const std::vector<char> want =
          tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
      void* d = nullptr;
      REQUIRE(cudaMalloc(&d, want.size()) == cudaSuccess);
      REQUIRE((*copies)
                  ->Load(**state, i, reinterpret_cast<uintptr_t>(d),
                         want.size(), 0)
                  .ok());
      REQUIRE((*copies)->Finish().ok());
      std::vector<char> got(want.size());
      REQUIRE(cudaMemcpy(got.data(), d, got.size(), cudaMemcpyDeviceToHost) ==
              cudaSuccess);
      cudaFree(d);
      INFO("rank " << c->rank() << " " << r.key);
      CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
    }
  }
}

}  // namespace
}  // namespace ptc
