#include "state_transformer/fragment_executor.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

namespace ptc {
namespace {

// A transport for fragments whose pieces are all local.
class NoPeers : public PieceTransport {
 public:
  absl::Status Fetch(int32_t, const std::string&, int64_t, const std::string&,
                     const Region&, int64_t,
                     const StoreClient::Consumer&) override {
    return absl::InternalError("no peer should be asked");
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t, const std::string&,
                                               int64_t, const std::string&,
                                               int32_t) override {
    return absl::InternalError("no peer should be asked");
  }
};

void Put(Store& store, int64_t version, const Region& r) {
  auto put = store.BeginPut("job", version, "w", r);
  REQUIRE(put.ok());
  int32_t* v = reinterpret_cast<int32_t*>((*put)->buffer->mutable_data());
  for (int64_t i = r.dim(0).begin; i < r.dim(0).end; ++i)
    v[i - r.dim(0).begin] = 100 + i;
  REQUIRE(store.FinishPut(std::move(*put)).ok());
}

std::vector<int32_t> Read(Store& store, int64_t version, const Region& r) {
  auto view = store.OpenRead("job", version, "w", r);
  REQUIRE(view.ok());
  std::vector<int32_t> out(r.volume());
  REQUIRE(ForEachCoveringPiece(
              r, view->sources,
              [&](const Region& piece, const StoredRegionRef& s) {
                CopyRegion(s.buffer->data(), s.region, out.data(), r, piece, 4);
              })
              .ok());
  return out;
}

TEST_CASE(
    "fragment executor: a region kept in place still fills the staged regions "
    "that overlap it",
    "[transformer]") {
  // Version 1 holds [0:4] and [4:6]. Version 2 must hold [0:4] (unchanged:
  // linked) and [2:6], which overlaps it (as ZeRO-1 shards of one tensor
  // from two tp ranks of a host can). As the planner emits it: [0:4] kept in
  // place (which also covers [2:4] of the other region), [4:6] copied.
  Store store({1 << 20});
  REQUIRE(store.DeclareTensors("job", {{"w", DType::kInt32, {6}}}).ok());
  Put(store, 1, Region{{0, 4}});
  Put(store, 1, Region{{4, 6}});
  FragmentJob job;
  job.job = "job";
  job.source_version = 1;
  job.target_version = 2;
  job.host = 0;
  job.tensors = {{"w", DType::kInt32, {6}}};
  job.holds = {{0, Region{{0, 4}}}, {0, Region{{2, 6}}}};
  job.pieces = {{0, Region{{0, 4}}, 0}, {0, Region{{4, 6}}, 0}};
  NoPeers transport;
  REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
  CHECK(Read(store, 2, Region{{0, 4}}) ==
        std::vector<int32_t>{100, 101, 102, 103});
  auto view = store.OpenRead("job", 2, "w", Region{{2, 6}});
  REQUIRE(view.ok());
  REQUIRE(view->exact);
  std::vector<int32_t> got(4);
  std::memcpy(got.data(), view->sources[0].buffer->data(), 16);
  CHECK(got == std::vector<int32_t>{102, 103, 104, 105});
}

}  // namespace
}  // namespace ptc
