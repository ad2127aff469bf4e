// AskFingerprints against real in-process ptcds, and against a "stopped"
// host: a TensorStore server that accepts calls and never answers them.
#include "coordinator/internal/fingerprint_calls.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "ptc/fingerprint.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/testing.h"

namespace ptc::coordinator_internal {
namespace {

using testing::SilentStore;

constexpr int64_t kElements = 4096;

// Version 1 of tensor "w" (fp32, kElements) on a daemon; returns its bytes.
std::vector<float> StoreVersion(testing::Daemon& d) {
  std::vector<float> w(kElements);
  std::mt19937 rng(3);
  for (float& v : w) v = static_cast<float>(rng()) / 1024.0f;
  const Shape shape = {kElements};
  REQUIRE(d.client->Declare("j", {{"w", DType::kFloat32, shape}}).ok());
  REQUIRE(d.client
              ->Put("j", 1, "w", Region::Full(shape), w.data(),
                    w.size() * sizeof(float))
              .ok());
  REQUIRE(d.client->Commit("j", 1).ok());
  return w;
}

TEST_CASE(
    "fingerprint calls: the hosts' shares add up to each tensor's "
    "fingerprint",
    "[coordinator][fingerprint]") {
  auto a = testing::StartDaemon(int64_t{64} << 20);
  auto b = testing::StartDaemon(int64_t{64} << 20);
  const std::vector<float> w = StoreVersion(*a);
  REQUIRE(StoreVersion(*b) == w);  // replicas
  const Shape shape = {kElements};
  const std::vector<std::string> keys = {"w"};
  const std::map<int32_t, std::string> addresses = {{0, a->address()},
                                                    {1, b->address()}};
  // Host 0 the first 1000 elements in two calls, host 1 the rest in one.
  std::map<int32_t, std::vector<FingerprintAsk>> asks;
  asks[0] = {{0, {Region{{0, 600}}}}, {0, {Region{{600, 1000}}}}};
  asks[1] = {{0, {Region{{1000, kElements}}}}};
  FingerprintCalls calls;
  calls.job = "j";
  calls.version = 1;
  calls.tensor_keys = &keys;
  calls.addresses = &addresses;
  int32_t failed = 7;
  auto sums = AskFingerprints(asks, calls, &failed);
  REQUIRE(sums.ok());
  CHECK(failed == -1);
  const Region full = Region::Full(shape);
  CHECK((*sums)[0].first == FingerprintRegion(w.data(), full, full, shape, 4));
  CHECK((*sums)[0].second == kElements);

  SECTION("an ask that names no tensor, or a host without an address") {
    asks[1] = {{1, {Region{{1000, kElements}}}}};
    CHECK(AskFingerprints(asks, calls, &failed).status().code() ==
          absl::StatusCode::kInvalidArgument);
    asks[1] = {{0, {Region{{1000, kElements}}}}};
    asks[2] = {{0, {Region{{0, 1}}}}};
    CHECK(AskFingerprints(asks, calls, &failed).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

// A ptcd from before the Fingerprints call: it answers a call per tensor
// only (from a real daemon behind it), and counts them.
class OlderStore final : public proto::TensorStore::Service {
 public:
  explicit OlderStore(StoreClient* real) : real_(real) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~OlderStore() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status Fingerprint(grpc::ServerContext*,
                           const proto::FingerprintRequest* req,
                           proto::FingerprintResponse* resp) override {
    ++calls;
    std::vector<Region> regions;
    for (const proto::Region& r : req->regions())
      regions.push_back(*RegionFromProto(r));
    auto fp =
        real_->Fingerprint(req->job(), req->version(), req->tensor(), regions);
    if (!fp.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "failed");
    *resp = *fp;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};

 private:
  StoreClient* real_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_CASE(
    "fingerprint calls: a host's asks go in few calls; a ptcd from before "
    "the batched call is asked tensor by tensor",
    "[coordinator][fingerprint]") {
  auto a = testing::StartDaemon(int64_t{64} << 20);
  const std::vector<float> w = StoreVersion(*a);
  const Shape shape = {kElements};
  const Region full = Region::Full(shape);
  const uint64_t want = FingerprintRegion(w.data(), full, full, shape, 4);
  const std::vector<std::string> keys = {"w"};
  // 600 asks of one tensor: the first 600 elements, one each, and the
  // rest in one more.
  std::map<int32_t, std::vector<FingerprintAsk>> asks;
  for (int64_t i = 0; i < 600; ++i)
    asks[0].push_back({0, {Region{{i, i + 1}}}});
  asks[0].push_back({0, {Region{{600, kElements}}}});
  FingerprintCalls calls;
  calls.job = "j";
  calls.version = 1;
  calls.tensor_keys = &keys;
  int32_t failed = 7;

  SECTION("a ptcd of today: in batches") {
    Counter& single =
        GetCounter("ptc_rpc_calls_total{method=\"TensorStore.Fingerprint\"}");
    Counter& batched =
        GetCounter("ptc_rpc_calls_total{method=\"TensorStore.Fingerprints\"}");
    const int64_t single_before = single.value();
    const int64_t batched_before = batched.value();
    const std::map<int32_t, std::string> addresses = {{0, a->address()}};
    calls.addresses = &addresses;
    auto sums = AskFingerprints(asks, calls, &failed);
    REQUIRE(sums.ok());
    CHECK((*sums)[0] == std::make_pair(want, kElements));
    CHECK(single.value() == single_before);  // no call per tensor
    // 601 asks in 4 lanes (calls_per_host), up to 256 asks a call: 151,
    // 150, 150 and 150 asks, a call each.
    CHECK(batched.value() - batched_before == 4);
  }
  SECTION("an older ptcd: one call per ask, the same sums") {
    OlderStore older(a->client.get());
    const std::map<int32_t, std::string> addresses = {{0, older.address()}};
    calls.addresses = &addresses;
    auto sums = AskFingerprints(asks, calls, &failed);
    REQUIRE(sums.ok());
    CHECK((*sums)[0] == std::make_pair(want, kElements));
    CHECK(older.calls == 601);
  }
}

TEST_CASE(
    "fingerprint calls: a call to a host that goes silent ends UNAVAILABLE "
    "naming it, not at its deadline",
    "[coordinator][fingerprint]") {
  auto a = testing::StartDaemon(int64_t{64} << 20);
  StoreVersion(*a);
  SilentStore silent;
  const std::vector<std::string> keys = {"w"};
  const std::map<int32_t, std::string> addresses = {{0, a->address()},
                                                    {1, silent.address()}};
  std::map<int32_t, std::vector<FingerprintAsk>> asks;
  asks[0] = {{0, {Region{{0, 1000}}}}};
  asks[1] = {{0, {Region{{1000, kElements}}}}};
  FingerprintCalls calls;
  calls.job = "j";
  calls.version = 1;
  calls.tensor_keys = &keys;
  calls.addresses = &addresses;
  calls.label = [](int32_t host) { return "host" + std::to_string(host); };
  // Host 1 misses its heartbeats from 300 ms after its call arrived (on a
  // busy machine the call can take longer than that to reach it).
  absl::Mutex mu;
  std::optional<absl::Time> arrived;
  calls.is_alive = [&](int32_t host) {
    if (host != 1) return true;
    absl::MutexLock lock(&mu);
    if (!arrived && silent.calls() > 0) arrived = absl::Now();
    return !arrived || absl::Now() - *arrived < absl::Milliseconds(300);
  };
  calls.liveness_poll = absl::Milliseconds(50);
  int32_t failed = -1;
  auto sums = AskFingerprints(asks, calls, &failed);
  const absl::Time ended = absl::Now();
  REQUIRE_FALSE(sums.ok());
  CHECK(sums.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(sums.status().message()),
             Catch::Contains("on host1") && Catch::Contains("went silent"));
  CHECK(failed == 1);
  CHECK(silent.calls() == 1);
  // The call's own deadline is 30 s and more.
  absl::MutexLock lock(&mu);
  REQUIRE(arrived.has_value());
  CHECK(ended - *arrived < absl::Seconds(5));
}

TEST_CASE(
    "fingerprint calls: a stop or a cancel ends every call at once, naming "
    "no host",
    "[coordinator][fingerprint]") {
  SilentStore x, y;
  const std::vector<std::string> keys = {"w"};
  const std::map<int32_t, std::string> addresses = {{0, x.address()},
                                                    {1, y.address()}};
  std::map<int32_t, std::vector<FingerprintAsk>> asks;
  asks[0] = {{0, {Region{{0, 1000}}}}, {0, {Region{{1000, 2000}}}}};
  asks[1] = {{0, {Region{{2000, kElements}}}}};
  std::atomic<bool> stop{false}, cancel{false};
  FingerprintCalls calls;
  calls.job = "j";
  calls.version = 1;
  calls.tensor_keys = &keys;
  calls.addresses = &addresses;
  calls.stop = &stop;
  calls.cancel = &cancel;
  const bool by_cancel = GENERATE(false, true);
  // Set once every lane's call reached its host (a fixed wait could end
  // before they do on a busy machine).
  absl::Time set_at = absl::InfiniteFuture();
  std::thread trigger([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (x.calls() + y.calls() < 3 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    set_at = absl::Now();
    (by_cancel ? cancel : stop) = true;
  });
  int32_t failed = 7;
  auto sums = AskFingerprints(asks, calls, &failed);
  const absl::Time ended = absl::Now();
  trigger.join();
  const absl::Duration took = ended - set_at;
  REQUIRE_FALSE(sums.ok());
  CHECK(sums.status().code() == absl::StatusCode::kCancelled);
  CHECK_THAT(std::string(sums.status().message()),
             Catch::Contains(by_cancel ? "aborted by request" : "stopped"));
  CHECK(failed == -1);
  CHECK(x.calls() + y.calls() == 3);  // every lane had a call in flight
  CHECK(took < absl::Seconds(5));
}

}  // namespace
}  // namespace ptc::coordinator_internal
