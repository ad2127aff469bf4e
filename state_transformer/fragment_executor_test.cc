#include "state_transformer/fragment_executor.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "ptc/fingerprint.h"

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

int64_t FingerprintedBytes() {
  return GetCounter("ptc_store_fingerprinted_bytes_total").value();
}

TEST_CASE(
    "fragment executor: local copies add up the staged version's "
    "fingerprints as they copy; proving it reads none of its bytes again",
    "[transformer]") {
  // Version 1 holds two column halves of a 2-D tensor; version 2 holds its
  // two row halves: every copy is strided. Small staged buffers are
  // written through their memfds, those of 2 MiB and more are mapped.
  const int64_t rows = GENERATE(64, 1024);
  const int64_t cols = rows == 64 ? 48 : 1024;
  Store store({int64_t{64} << 20});
  const TensorDecl decl{"m", DType::kInt32, {rows, cols}};
  REQUIRE(store.DeclareTensors("job", {decl}).ok());
  std::vector<int32_t> values(rows * cols);
  std::iota(values.begin(), values.end(), 7);
  const Region all{{0, rows}, {0, cols}};
  for (const Region& half : {Region{{0, rows}, {0, cols / 2}},
                             Region{{0, rows}, {cols / 2, cols}}}) {
    auto put = store.BeginPut("job", 1, "m", half);
    REQUIRE(put.ok());
    CopyRegion(values.data(), all, (*put)->buffer->mutable_data(), half, half,
               4);
    REQUIRE(store.FinishPut(std::move(*put)).ok());
  }
  FragmentJob job;
  job.job = "job";
  job.source_version = 1;
  job.target_version = 2;
  job.host = 0;
  job.tensors = {decl};
  const Region top{{0, rows / 2}, {0, cols}},
      bottom{{rows / 2, rows}, {0, cols}};
  job.holds = {{0, top}, {0, bottom}};
  job.pieces = {{0, top, 0}, {0, bottom, 0}};
  NoPeers transport;
  REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
  for (const Region& half : {top, bottom}) {
    auto view = store.OpenRead("job", 2, "m", half);
    REQUIRE(view.ok());
    REQUIRE(view->exact);
    std::vector<int32_t> want(half.volume());
    CopyRegion(values.data(), all, want.data(), half, half, 4);
    CHECK(std::memcmp(view->sources[0].buffer->data(), want.data(),
                      want.size() * 4) == 0);
  }

  const int64_t before = FingerprintedBytes();
  auto staged = store.Fingerprint("job", 2, "m", {});
  REQUIRE(staged.ok());
  CHECK(FingerprintedBytes() == before);  // remembered from the copies
  CHECK(staged->first ==
        FingerprintRegion(values.data(), all, all, decl.shape, 4));
  CHECK(staged->second == all.volume());
  // The same values as the source version's, which are read to prove it.
  auto source = store.Fingerprint("job", 1, "m", {});
  REQUIRE(source.ok());
  CHECK(FingerprintedBytes() > before);
  CHECK(source->first == staged->first);
}

// Host 0 stages version 2 of tensor 'w' (8 int32s) whole, from version
// 1's pieces that the test names, one pull at a time.
FragmentJob WholeTensorOnHost0() {
  FragmentJob job;
  job.job = "job";
  job.source_version = 1;
  job.target_version = 2;
  job.host = 0;
  job.tensors = {{"w", DType::kInt32, {8}}};
  job.holds = {{0, Region{{0, 8}}}};
  job.parallel_pulls = 1;
  return job;
}

// Peers 1 and 2 hold the source version in stores of their own; peer 1
// dies midway through its first batch (after streaming part of a piece).
class Replicas : public PieceTransport {
 public:
  Replicas() {
    for (Store* s : {&one, &two}) {
      REQUIRE(s->DeclareTensors("job", {{"w", DType::kInt32, {8}}}).ok());
      Put(*s, 1, Region{{0, 8}});
    }
  }
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override {
    asked.push_back(host);
    if (host == 1 && one_dead)
      return absl::UnavailableError("connection refused");
    Store& store = host == 1 ? one : two;
    const std::vector<int32_t> v = Read(store, version, region);
    const char* bytes = reinterpret_cast<const char*>(v.data());
    if (host == 1) {
      consume(0, bytes, element_size);  // one element, then it dies
      one_dead = true;
      return absl::UnavailableError("the peer closed the connection");
    }
    consume(0, bytes, static_cast<int64_t>(v.size()) * element_size);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t, const std::string&,
                                               int64_t, const std::string&,
                                               int32_t) override {
    return absl::InternalError("no small objects here");
  }

  Store one{{1 << 20}}, two{{1 << 20}};
  bool one_dead = false;
  std::vector<int32_t> asked;
};

TEST_CASE(
    "fragment executor: a source that dies midway is replaced by another "
    "holder of its pieces; with none left the error names the piece",
    "[transformer]") {
  Store store({1 << 20});
  FragmentJob job = WholeTensorOnHost0();

  SECTION("another replica holds them") {
    job.pieces = {{0, Region{{0, 4}}, 1, {2}}, {0, Region{{4, 8}}, 1, {2}}};
    Replicas transport;
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(Read(store, 2, Region{{0, 8}}) ==
          std::vector<int32_t>{100, 101, 102, 103, 104, 105, 106, 107});
    // Host 1 once (it died), then every piece from host 2.
    CHECK(transport.asked == std::vector<int32_t>{1, 2, 2});
    // Streamed pieces are not added up: the staged version's fingerprint
    // is read from its bytes, and is the source's.
    const int64_t before = FingerprintedBytes();
    auto staged = store.Fingerprint("job", 2, "w", {});
    REQUIRE(staged.ok());
    CHECK(FingerprintedBytes() == before + 8 * 4);
    auto source = transport.two.Fingerprint("job", 1, "w", {});
    REQUIRE(source.ok());
    CHECK(staged->first == source->first);
  }
  SECTION("no other holder: the change fails naming the piece") {
    job.pieces = {{0, Region{{0, 4}}, 1, {}}, {0, Region{{4, 8}}, 1, {2}}};
    Replicas transport;
    const absl::Status s = ExecuteFragment(&store, job, &transport, nullptr);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("no live source left for piece [0:4] of "
                               "tensor 'w' (host 1: the peer closed"));
    // Nothing of version 2 stays.
    CHECK(!store.OpenRead("job", 2, "w", Region{{0, 8}}).ok());
  }
}

// Host 1 holds every piece and misses its first `misses` deadlines (or
// is refused, with `dead`); host 2 holds them too where a test names it.
class SlowHolder : public PieceTransport {
 public:
  SlowHolder() {
    REQUIRE(one.DeclareTensors("job", {{"w", DType::kInt32, {8}}}).ok());
    Put(one, 1, Region{{0, 8}});
  }
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override {
    asked.push_back(host);
    if (host != 1) return absl::UnavailableError("connection refused");
    if (dead) return absl::UnavailableError("keepalive watchdog timeout");
    if (misses > 0) {
      --misses;
      return absl::DeadlineExceededError("Deadline Exceeded");
    }
    const std::vector<int32_t> v = Read(one, version, region);
    consume(0, reinterpret_cast<const char*>(v.data()),
            static_cast<int64_t>(v.size()) * element_size);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t host, const std::string&,
                                               int64_t, const std::string& name,
                                               int32_t rank) override {
    asked_small.push_back(host);
    if (host != 1) return absl::UnavailableError("connection refused");
    if (small_misses > 0) {
      --small_misses;
      return absl::DeadlineExceededError("Deadline Exceeded");
    }
    return absl::StrCat(name, " of rank ", rank);
  }

  Store one{{1 << 20}};
  int misses = 0, small_misses = 0;
  bool dead = false;
  std::vector<int32_t> asked, asked_small;
};

TEST_CASE(
    "fragment executor: a holder that missed a deadline (alive, slow) is "
    "asked once more for a piece no other holder gives; slow twice or "
    "refused, it is not",
    "[transformer]") {
  Store store({1 << 20});
  FragmentJob job = WholeTensorOnHost0();
  // Host 1 the only holder of [0:4]; host 2 (refusing) also named for
  // [4:8], so both ways through the alternates are taken.
  job.pieces = {{0, Region{{0, 4}}, 1, {}}, {0, Region{{4, 8}}, 1, {2}}};
  SlowHolder transport;
  const std::vector<int32_t> all = {100, 101, 102, 103, 104, 105, 106, 107};

  SECTION("slow once: every piece comes from it, each after one retry") {
    transport.misses = 1;
    const Counter& retries =
        GetCounter("ptc_transformer_pieces_from_slow_sources_total");
    const int64_t before = retries.value();
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(Read(store, 2, Region{{0, 8}}) == all);
    // The part's batch missed; [0:4] again from host 1; [4:8] from host 2
    // (refused), then again from host 1.
    CHECK(transport.asked == std::vector<int32_t>{1, 1, 2, 1});
    CHECK(retries.value() == before + 2);
  }
  SECTION("slow twice: the change fails naming both tries") {
    transport.misses = 2;
    const absl::Status s = ExecuteFragment(&store, job, &transport, nullptr);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("no live source left for piece [0:4] of tensor "
                               "'w' (host 1: Deadline Exceeded; host 1 again: "
                               "Deadline Exceeded)"));
    CHECK(transport.asked == std::vector<int32_t>{1, 1});
    CHECK(!store.OpenRead("job", 2, "w", Region{{0, 8}}).ok());
  }
  SECTION("a small object's copy slow once: taken on a second try") {
    // Rank 0's step counter from host 1, another copy named on host 2.
    SmallObjectMove o;
    o.name = "iteration";
    o.source_host = 1;
    o.alternates = {{0, 2}};
    job.small_objects = {o};
    transport.small_misses = 1;
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(transport.asked_small == std::vector<int32_t>{1, 2, 1});
    auto got = store.GetSmallObject("job", 2, "iteration", 0);
    REQUIRE(got.ok());
    CHECK(*got->bytes == "iteration of rank 0");
    SECTION("slow twice, with no copy kept and no fresh value: it fails") {
      transport.small_misses = 2;
      transport.asked_small.clear();
      job.target_version = 3;
      const absl::Status s = ExecuteFragment(&store, job, &transport, nullptr);
      CHECK(s.code() == absl::StatusCode::kUnavailable);
      CHECK_THAT(std::string(s.message()),
                 Catch::Contains("host 1: Deadline Exceeded; host 2: "
                                 "connection refused; host 1 again: Deadline "
                                 "Exceeded"));
      CHECK(transport.asked_small == std::vector<int32_t>{1, 2, 1});
    }
  }
  SECTION("refused (dead): no second try") {
    transport.dead = true;
    const absl::Status s = ExecuteFragment(&store, job, &transport, nullptr);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("(host 1: keepalive watchdog timeout)"));
    CHECK(transport.asked == std::vector<int32_t>{1});
  }
}

// Small objects from peers: host 1 answers those it holds in one call
// (FetchSmallObjects), unless `batch_fails` (a host that died); host 2
// answers one at a time.
class SmallObjectPeers : public SlowHolder {
 public:
  absl::StatusOr<std::vector<std::string>> FetchSmallObjects(
      int32_t host, const std::string&, int64_t,
      const SmallObjectKeys& keys) override {
    batches.emplace_back(host, keys.size());
    if (batch_fails)
      return absl::UnavailableError("keepalive watchdog timeout");
    if (old_peer) return absl::UnimplementedError("unknown method");
    std::vector<std::string> got;
    for (const auto& [name, rank] : keys)
      got.push_back(absl::StrCat(name, " of rank ", rank, " from host ", host));
    return got;
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t host, const std::string&,
                                               int64_t, const std::string& name,
                                               int32_t rank) override {
    asked_small.push_back(host);
    if (host != 2 && !old_peer)
      return absl::UnavailableError("connection refused");
    return absl::StrCat(name, " of rank ", rank, " from host ", host);
  }

  std::vector<std::pair<int32_t, size_t>> batches;
  bool batch_fails = false;
  bool old_peer = false;  // host 1 knows no GetSmallObjects: one at a time
};

TEST_CASE(
    "fragment executor: a source host's small objects come in one call; "
    "where it fails, each comes from its other copies",
    "[transformer]") {
  Store store({1 << 20});
  FragmentJob job = WholeTensorOnHost0();
  job.pieces = {{0, Region{{0, 8}}, 1, {}}};
  // Ranks 0-2's RNG state planned from host 1 (copies on host 2 too), rank
  // 3's from host 2 alone: one object, asked as before.
  for (int32_t rank = 0; rank < 4; ++rank) {
    SmallObjectMove o;
    o.name = "rng";
    o.target_rank = rank;
    o.source_rank = rank;
    o.source_host = rank < 3 ? 1 : 2;
    if (rank < 3) o.alternates = {{rank, 2}};
    job.small_objects.push_back(o);
  }
  SmallObjectPeers transport;
  auto rng_of = [&](int32_t rank) {
    auto got = store.GetSmallObject("job", 2, "rng", rank);
    REQUIRE(got.ok());
    return *got->bytes;
  };

  SECTION("one call for host 1's three, one for host 2's") {
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(transport.batches == std::vector<std::pair<int32_t, size_t>>{{1, 3}});
    CHECK(transport.asked_small == std::vector<int32_t>{2});
    CHECK(rng_of(0) == "rng of rank 0 from host 1");
    CHECK(rng_of(2) == "rng of rank 2 from host 1");
    CHECK(rng_of(3) == "rng of rank 3 from host 2");
  }
  SECTION(
      "host 1's call fails: its objects come from host 2, host 1 is not "
      "asked again") {
    transport.batch_fails = true;
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(transport.batches == std::vector<std::pair<int32_t, size_t>>{{1, 3}});
    CHECK(transport.asked_small == std::vector<int32_t>{2, 2, 2, 2});
    CHECK(rng_of(0) == "rng of rank 0 from host 2");
    CHECK(rng_of(3) == "rng of rank 3 from host 2");
  }
  SECTION(
      "host 1 knows no such call (an older ptcd): asked one at a time, "
      "not taken for dead") {
    transport.old_peer = true;
    REQUIRE(ExecuteFragment(&store, job, &transport, nullptr).ok());
    CHECK(transport.asked_small == std::vector<int32_t>{1, 1, 1, 2});
    CHECK(rng_of(1) == "rng of rank 1 from host 1");
  }
}

}  // namespace
}  // namespace ptc
