// Unit tests of Store itself, without gRPC.
#include "tensor_store/store.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/metrics.h"
#include "ptc/fingerprint.h"
#include "tensor_store/region_buffer.h"

namespace ptc {
namespace {

std::unique_ptr<PendingPut> Begin(Store& s, int64_t version, const Region& r) {
  auto put = s.BeginPut("job", version, "w", r);
  REQUIRE(put.ok());
  if (!s.hollow())
    std::memset((*put)->buffer->mutable_data(), 7, (*put)->bytes);
  return std::move(*put);
}

// The tests that run GENERATE(false, true) hold for a real store and for a
// hollow one (metadata, no bytes: the scale harness's hosts), except where
// they look at bytes: a hollow region's checksum is its hollow fingerprint.
StoreOptions Options(int64_t limit, bool hollow) {
  StoreOptions o;
  o.memory_limit_bytes = limit;
  o.hollow = hollow;
  return o;
}

// The checksum a put of `r` of the 8x8 float32 "w" filled with `byte`
// stores.
uint64_t FilledChecksum(const Store& s, const Region& r, char byte) {
  if (s.hollow()) return HollowFingerprint(r, {8, 8}, 4);
  std::vector<char> bytes(r.volume() * 4, byte);
  return Checksum(bytes.data(), bytes.size());
}

TEST_CASE(
    "store: declarations are charged against the memory limit, a flood of "
    "them is refused, and a deleted job gives them back",
    "[tensor_store]") {
  Store s(Options(64 << 10, GENERATE(false, true)));
  const TensorDecl w{"w", DType::kFloat32, {8, 8}};
  REQUIRE(s.DeclareTensors("job", {w, w}).ok());  // the same one twice
  CHECK(s.metadata_bytes() == TensorDeclMetadataBytes(w));
  CHECK(s.memory_used() == TensorDeclMetadataBytes(w));
  REQUIRE(s.DeclareTensors("job", {w}).ok());  // known: not charged again
  CHECK(s.metadata_bytes() == TensorDeclMetadataBytes(w));
  // Ten thousand tensors with 1 KiB names: 12 MiB of bookkeeping for a
  // store of 64 KiB. Refused as a whole, nothing declared.
  std::vector<TensorDecl> flood;
  for (int i = 0; i < 10000; ++i) {
    flood.push_back({absl::StrCat(std::string(1024, 'k'), i),
                     DType::kFloat32, {1}});
  }
  const absl::Status refused = s.DeclareTensors("job", flood).status();
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("declaring 10000 tensors of job 'job'"));
  CHECK(s.metadata_bytes() == TensorDeclMetadataBytes(w));
  REQUIRE(s.DeleteJob("job").ok());
  CHECK(s.metadata_bytes() == 0);
  CHECK(s.memory_used() == 0);
}

TEST_CASE("store: a put is invisible until finished and gone if dropped",
          "[tensor_store]") {
  Store s(Options(1 << 20, GENERATE(false, true)));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region r{{0, 4}, {0, 8}};
  {
    auto put = Begin(s, 1, r);
    CHECK(s.data_bytes_used() == 128);
    CHECK(s.List("job").jobs(0).versions_size() == 0);  // not visible yet
  }  // dropped: nothing stays
  CHECK(s.data_bytes_used() == 0);
  CHECK(s.List("job").jobs(0).versions_size() == 0);
  auto sum = s.FinishPut(Begin(s, 1, r));
  REQUIRE(sum.ok());
  CHECK(*sum == FilledChecksum(s, r, 7));
  CHECK(s.List("job").jobs(0).versions(0).tensors(0).regions(0).checksum() ==
        *sum);
}

TEST_CASE(
    "store: fresh memory a local client fills through the descriptor is "
    "populated at BeginPut from a huge page on; less, or what the client "
    "maps itself, is not",
    "[tensor_store]") {
  Store s(Options(64 << 20, false));
  // 4 MiB, 1 MiB and 16 MiB of float32.
  REQUIRE(s.DeclareTensors("job", {{"big", DType::kFloat32, {1024, 1024}},
                                   {"small", DType::kFloat32, {256, 1024}},
                                   {"large", DType::kFloat32, {4096, 1024}}})
              .ok());
  static_assert(4 << 20 >= kHugePageBytes &&
                4 << 20 < kCopyThroughDescriptorBelow &&
                16 << 20 >= kCopyThroughDescriptorBelow);
  // The memory a memfd holds now (shared memory allocates on first write).
  auto held = [](const PendingPut& put) {
    struct stat st {};
    REQUIRE(fstat(put.buffer->fd(), &st) == 0);
    return int64_t{st.st_blocks} * 512;
  };
  auto begin = [&](const char* tensor, int64_t rows) {
    auto put = s.BeginPut("job", 1, tensor, Region{{0, rows}, {0, 1024}},
                          std::nullopt, /*map=*/false);
    REQUIRE(put.ok());
    return std::move(*put);
  };
  auto big = begin("big", 1024);
  // Written through its descriptor, it would take 4 KiB pages one by one
  // (and give back, once deleted, memory no huge page can take).
  CHECK(held(*big) == big->bytes);
  CHECK(big->buffer->data() != nullptr);
  auto small = begin("small", 256);
  CHECK(held(*small) == 0);  // mapping it page by page costs more
  CHECK(small->buffer->data() == nullptr);
  auto large = begin("large", 4096);
  CHECK(held(*large) == 0);  // the client maps it, in huge pages
  CHECK(large->buffer->data() == nullptr);
  // Each is written through the descriptor and stores those bytes.
  for (auto* put : {&big, &small, &large}) {
    std::vector<char> bytes((*put)->bytes, 5);
    REQUIRE(WriteAt((*put)->buffer->fd(), 0, bytes.data(),
                    static_cast<int64_t>(bytes.size()))
                .ok());
    auto sum = s.FinishPut(std::move(*put));
    REQUIRE(sum.ok());
    CHECK(*sum == Checksum(bytes.data(), bytes.size()));
  }
}

TEST_CASE(
    "store: a pack holds several regions in one memfd, sealed whole, and its "
    "memory returns with the last region that holds it",
    "[tensor_store]") {
  const bool hollow = GENERATE(false, true);
  Store s(Options(1 << 20, hollow));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}},
                                   {"b", DType::kUInt8, {3}}})
              .ok());
  const Region top{{0, 4}, {0, 8}}, bottom{{4, 8}, {0, 8}}, b{{0, 3}};
  auto puts = s.BeginPuts("job", 1, {{"w", top}, {"b", b}, {"w", bottom}});
  REQUIRE(puts.ok());
  REQUIRE(puts->size() == 3);
  // Each region from a page boundary, in one memfd of three pages; a
  // hollow store keeps each region alone, as it keeps any put.
  CHECK(s.data_bytes_used() == (hollow ? 128 + 3 + 128 : 3 * 4096));
  if (!hollow) {
    for (size_t i = 0; i < 3; ++i) {
      RegionBuffer& buf = *(*puts)[i]->buffer;
      CHECK(buf.offset() == static_cast<int64_t>(i) * 4096);
      CHECK(buf.inode() == (*puts)[0]->buffer->inode());
      CHECK(buf.memfd_size() == 3 * 4096);
      REQUIRE(
          buf.WriteFrom(0, std::string(buf.size(), '0' + i).data(), buf.size())
              .ok());
    }
    CHECK((*puts)[1]->buffer->WriteFrom(1, "xyz", 3).code() ==
          absl::StatusCode::kOutOfRange);  // past the region, inside the pack
  }
  const std::vector<uint64_t> sums = {
      FilledChecksum(s, top, '0'),
      hollow ? HollowFingerprint(b, {3}, 1) : Checksum("111", 3),
      FilledChecksum(s, bottom, '2')};
  // The first region sealed seals them all.
  REQUIRE((*puts)[0]->buffer->Seal().ok());
  if (!hollow) {
    CHECK((*puts)[2]->buffer->sealed());
    CHECK((*puts)[2]->buffer->WriteFrom(0, "x", 1).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  const auto outcomes = s.FinishPuts(std::move(*puts), sums);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(outcomes[i].status.ok());
    CHECK(outcomes[i].checksum == sums[i]);
  }
  if (!hollow) {
    auto view = s.OpenRead("job", 1, "b", b);
    REQUIRE(view.ok());
    CHECK(std::string(
              reinterpret_cast<const char*>(view->sources[0].buffer->data()),
              3) == "111");
  }
  // Version 2 keeps one region of the pack: the pack's memory stays, all of
  // it, until that region goes too.
  auto kept = s.OpenRead("job", 1, "b", b);
  REQUIRE(kept.ok());
  REQUIRE(s.Link("job", 2, "b", kept->sources[0]).ok());
  kept = absl::NotFoundError("dropped");
  REQUIRE(s.DeleteVersion("job", 1).ok());
  s.WaitReleased();
  CHECK(s.data_bytes_used() == (hollow ? 3 : 3 * 4096));
  REQUIRE(s.DeleteVersion("job", 2).ok());
  s.WaitReleased();
  CHECK(s.data_bytes_used() == 0);
}

TEST_CASE("store: a pack is checked whole before any memory is taken",
          "[tensor_store]") {
  Store s(Options(1 << 20, false));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region r{{0, 4}, {0, 8}};
  auto code = [&](const std::vector<std::pair<std::string, Region>>& items,
                  int64_t version = 1) {
    auto puts = s.BeginPuts("job", version, items);
    CHECK(s.data_bytes_used() == 0);
    return puts.status();
  };
  CHECK(code({}).code() == absl::StatusCode::kInvalidArgument);
  const absl::Status undeclared = code({{"w", r}, {"v", r}});
  CHECK(undeclared.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(undeclared.message(), "item 1"));
  CHECK(code({{"w", r}, {"w", Region{{4, 9}, {0, 8}}}}).code() ==
        absl::StatusCode::kInvalidArgument);  // out of the tensor
  CHECK(code({{"w", r}}, -1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(code(std::vector<std::pair<std::string, Region>>(kMaxPackRegions + 1,
                                                         {"w", r}))
            .code() == absl::StatusCode::kInvalidArgument);
  // Past a pack's bytes: refused before any memory is asked for.
  REQUIRE(s.DeclareTensors("job", {{"huge", DType::kUInt8, {80 << 20}}}).ok());
  const absl::Status past = code({{"huge", Region{{0, 40 << 20}}},
                                  {"huge", Region{{40 << 20, 80 << 20}}}});
  CHECK(past.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(past.message(), "item 1"));
  // More than the memory limit: refused as a put would be.
  REQUIRE(s.DeclareTensors("job", {{"big", DType::kUInt8, {1200 << 10}}}).ok());
  const Region half{{0, 600 << 10}}, other{{600 << 10, 1200 << 10}};
  CHECK(code({{"big", half}, {"big", other}, {"w", r}}).code() ==
        absl::StatusCode::kResourceExhausted);
}

TEST_CASE("store: a version deleted while a put runs aborts the put",
          "[tensor_store]") {
  Store s(Options(1 << 20, GENERATE(false, true)));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  REQUIRE(s.FinishPut(Begin(s, 1, Region{{0, 4}, {0, 8}})).ok());
  auto put = Begin(s, 1, Region{{4, 8}, {0, 8}});
  REQUIRE(s.DeleteVersion("job", 1).ok());
  CHECK(s.FinishPut(std::move(put)).status().code() ==
        absl::StatusCode::kAborted);
  s.WaitReleased();
  CHECK(s.data_bytes_used() == 0);
}

TEST_CASE("store: a committed version cannot change", "[tensor_store]") {
  Store s(Options(1 << 20, GENERATE(false, true)));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  REQUIRE(s.FinishPut(Begin(s, 1, Region{{0, 4}, {0, 8}})).ok());
  auto pending = Begin(s, 1, Region{{4, 8}, {0, 8}});
  REQUIRE(s.Commit("job", 1).ok());
  CHECK(s.FinishPut(std::move(pending)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  auto late = s.BeginPut("job", 1, "w", Region{{4, 8}, {0, 8}});
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(late.status().message().find("committed") != std::string::npos);
}

TEST_CASE("store: the union's fingerprint counts overlapping regions once",
          "[tensor_store]") {
  Store s({1 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kInt32, {6}}}).ok());
  // [0:4] and [2:6] overlap on [2:4]; values are the global indices.
  for (Region r : {Region{{0, 4}}, Region{{2, 6}}}) {
    auto put = s.BeginPut("job", 1, "w", r);
    REQUIRE(put.ok());
    int32_t* v = reinterpret_cast<int32_t*>((*put)->buffer->mutable_data());
    for (int64_t i = r.dim(0).begin; i < r.dim(0).end; ++i)
      v[i - r.dim(0).begin] = i;
    REQUIRE(s.FinishPut(std::move(*put)).ok());
  }
  auto all = s.Fingerprint("job", 1, "w", {});
  REQUIRE(all.ok());
  CHECK(all->second == 6);
  auto whole = s.Fingerprint("job", 1, "w", {Region{{0, 6}}});
  REQUIRE(whole.ok());
  CHECK(whole->first == all->first);
  auto parts = s.Fingerprint("job", 1, "w", {Region{{0, 1}}, Region{{1, 6}}});
  CHECK(parts->first == all->first);
}

TEST_CASE(
    "store: a whole sealed region's fingerprint is computed once and equals "
    "the one computed piecewise",
    "[tensor_store]") {
  Store s({1 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region r{{0, 4}, {0, 8}};
  auto put = Begin(s, 1, r);
  std::shared_ptr<RegionBuffer> buffer = put->buffer;
  REQUIRE(s.FinishPut(std::move(put)).ok());
  auto first = s.Fingerprint("job", 1, "w", {r});
  REQUIRE(first.ok());
  // Two pieces are never memoized: computed from the bytes each time.
  auto halves = s.Fingerprint("job", 1, "w",
                              {Region{{0, 4}, {0, 3}}, Region{{0, 4}, {3, 8}}});
  REQUIRE(halves.ok());
  CHECK(halves->first == first->first);
  int computed = 0;
  const uint64_t memo = buffer->Memoize(
      absl::StrCat("fingerprint 8x8 ", r.ToString(), " 4"), [&] {
        ++computed;
        return uint64_t{0};
      });
  CHECK(computed == 0);  // the first Fingerprint stored it
  CHECK(memo == first->first);
  auto again = s.Fingerprint("job", 1, "w", {r});
  CHECK(again->first == first->first);
}

TEST_CASE(
    "store: a committed version's regions are fingerprinted in the "
    "background, once",
    "[tensor_store]") {
  Counter& computed = GetCounter("ptc_store_fingerprinted_bytes_total");
  Store s({1 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region top{{0, 4}, {0, 8}}, bottom{{4, 8}, {0, 8}};
  std::vector<std::shared_ptr<RegionBuffer>> buffers;
  for (const Region& r : {top, bottom}) {
    auto put = Begin(s, 1, r);
    buffers.push_back(put->buffer);
    REQUIRE(s.FinishPut(std::move(put)).ok());
  }
  const int64_t before = computed.value();
  REQUIRE(s.Commit("job", 1).ok());
  s.WaitFingerprinted();
  CHECK(computed.value() - before == 64 * 4);
  // What the background stored is what the regions' bytes give, and a
  // fingerprint of the version now computes nothing.
  auto all = s.Fingerprint("job", 1, "w", {});
  REQUIRE(all.ok());
  CHECK(computed.value() - before == 64 * 4);
  std::vector<char> bytes(64 * 4, 7);
  CHECK(all->first == FingerprintRegion(bytes.data(), Region{{0, 8}, {0, 8}},
                                        Region{{0, 8}, {0, 8}}, {8, 8}, 4));

  SECTION("off when the store is told so") {
    Store off({1 << 20, 0, /*fingerprint_committed=*/false});
    REQUIRE(off.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
    REQUIRE(off.FinishPut(Begin(off, 1, top)).ok());
    const int64_t start = computed.value();
    REQUIRE(off.Commit("job", 1).ok());
    off.WaitFingerprinted();
    CHECK(computed.value() == start);
  }
}

TEST_CASE(
    "store: a deleted job is gone with all its versions, and a put that was "
    "running for it is not published into a job of the same name",
    "[tensor_store]") {
  Store s({1 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region top{{0, 4}, {0, 8}}, bottom{{4, 8}, {0, 8}};
  REQUIRE(s.FinishPut(Begin(s, 1, top)).ok());
  REQUIRE(s.Commit("job", 1).ok());
  REQUIRE(s.FinishPut(Begin(s, 2, top)).ok());  // staged, not committed
  auto running = Begin(s, 3, bottom);

  auto deleted = s.DeleteJob("job");
  REQUIRE(deleted.ok());
  CHECK(deleted->first == 2);
  CHECK(deleted->second == 2 * top.volume() * 4);
  CHECK(s.List("job").jobs_size() == 0);
  CHECK(s.OpenRead("job", 1, "w", top).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(s.DeleteJob("job").status().code() == absl::StatusCode::kNotFound);

  // A new job of the same name, with the version the old put writes.
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  REQUIRE(s.FinishPut(Begin(s, 3, top)).ok());
  const absl::Status late = s.FinishPut(std::move(running)).status();
  CHECK(late.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(late.message()), Catch::Contains("deleted"));
  CHECK(s.OpenRead("job", 3, "w", bottom).status().code() ==
        absl::StatusCode::kNotFound);
  // (A region being fingerprinted in the background as it was deleted is
  // freed when its fingerprint ends.)
  s.WaitFingerprinted();
  s.WaitReleased();
  CHECK(s.data_bytes_used() == top.volume() * 4);  // the new job's one region
}

TEST_CASE("store: concurrent puts to one job all land", "[tensor_store]") {
  Store s({64 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kUInt8, {64, 4096}}}).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 4; ++k) {
        const int64_t row = t * 4 + k;
        auto put = s.BeginPut("job", 1, "w", Region{{row, row + 1}, {0, 4096}});
        if (put.ok()) s.FinishPut(std::move(*put)).IgnoreError();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto list = s.List("job");
  CHECK(list.jobs(0).versions(0).tensors(0).regions_size() == 64);
  CHECK(list.jobs(0).versions(0).bytes() == 64 * 4096);
}

TEST_CASE(
    "store: local saves of a repeated size get ready memory, which gives way "
    "to real data",
    "[tensor_store]") {
  Store s({/*memory_limit_bytes=*/16 << 20, /*spare_pool_bytes=*/4 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kUInt8, {8, 1 << 20}}}).ok());
  const Region row0{{0, 1}, {0, 1 << 20}};
  const Region row1{{1, 2}, {0, 1 << 20}};
  auto first = s.BeginPut("job", 1, "w", row0, std::nullopt, /*map=*/false);
  REQUIRE(first.ok());
  s.spares().WaitIdle();
  CHECK(s.spares().ready_bytes() == (1 << 20));  // prepared for the next save
  // The spare is for the next save: the same save's next put of that size
  // does not take it (and queues one more).
  auto first_row1 =
      s.BeginPut("job", 1, "w", row1, std::nullopt, /*map=*/false);
  REQUIRE(first_row1.ok());
  s.spares().WaitIdle();
  CHECK(s.spares().ready_bytes() == (2 << 20));
  first->reset();
  first_row1->reset();
  // The next save finds both ready; each take queues a replacement.
  auto second = s.BeginPut("job", 2, "w", row0, std::nullopt, /*map=*/false);
  REQUIRE(second.ok());
  auto second_row1 =
      s.BeginPut("job", 2, "w", row1, std::nullopt, /*map=*/false);
  REQUIRE(second_row1.ok());
  CHECK(s.spares().ready_bytes() == 0);
  s.spares().WaitIdle();
  CHECK(s.spares().ready_bytes() == (2 << 20));
  CHECK(s.data_bytes_used() == (4 << 20));
  second_row1->reset();
  // A save of another size pushes out the spares of the old size.
  auto other = s.BeginPut("job", 3, "w", Region{{0, 4}, {0, 1 << 20}},
                          std::nullopt, false);
  REQUIRE(other.ok());
  s.spares().WaitIdle();
  CHECK(s.spares().ready_bytes() == (4 << 20));
  other->reset();
  second->reset();
  // Real data that needs the spare's room gets it.
  CHECK(s.data_bytes_used() == (4 << 20));  // just the spare
  REQUIRE(s.DeclareTensors("job", {{"big", DType::kUInt8, {13 << 20}}}).ok());
  auto big = s.BeginPut("job", 4, "big", Region{{0, 13 << 20}});
  REQUIRE(big.ok());
  CHECK(s.spares().ready_bytes() == 0);
}

TEST_CASE(
    "store: a small object gets the room of ready spares as a region does",
    "[tensor_store]") {
  // A save's puts queue spares for the next save, prepared while the save
  // runs; its small objects come after its regions, and found the memory
  // they needed taken by spares (seen in reconfigure_benchmark: a save of
  // 4.75 GiB failed on its first small object with "needs 265 bytes but
  // the store holds 8589934344 of its 8589934592-byte memory limit").
  Store s({/*memory_limit_bytes=*/16 << 20, /*spare_pool_bytes=*/4 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kUInt8, {1 << 20}}}).ok());
  auto put = s.BeginPut("job", 1, "w", Region{{0, 1 << 20}}, std::nullopt,
                        /*map=*/false);
  REQUIRE(put.ok());
  s.spares().WaitIdle();
  REQUIRE(s.spares().ready_bytes() == (1 << 20));
  REQUIRE(s.FinishPut(std::move(*put)).ok());
  // 253 objects of 60,000 bytes: more than the room the spare leaves (14
  // MiB), less than the room without it (15 MiB).
  for (int rank = 0; rank < 253; ++rank) {
    INFO("rank " << rank);
    REQUIRE(s.PutSmallObject("job", 1, "state", rank, std::string(60000, 's'))
                .ok());
  }
  CHECK(s.spares().ready_bytes() == 0);
  CHECK(s.GetSmallObject("job", 1, "state", 252).ok());
}

TEST_CASE(
    "spare pool: memory prepared for a coming change counts what is ready, "
    "fits the capacity, and serves the change's later version",
    "[tensor_store]") {
  MemoryBudget budget(64 << 20);
  SparePool pool(&budget, 8 << 20);
  pool.SetMemoryFloor(0);
  // A change that will stage 3 + 2 x 2 MiB: all queued.
  CHECK(pool.Queue({3 << 20, 2 << 20, 2 << 20}, {"job", 5}) == (7 << 20));
  pool.WaitIdle();
  CHECK(pool.ready_bytes() == (7 << 20));
  CHECK(pool.queued_bytes() == 0);
  // Asked again: what is ready counts, and the 1 MiB left is all the
  // capacity there is (nothing ready is given up for a 4 MiB buffer).
  CHECK(pool.Queue({3 << 20, 2 << 20, 1 << 20, 4 << 20}, {"job", 5}) ==
        (6 << 20));
  pool.WaitIdle();
  CHECK(pool.ready_bytes() == (8 << 20));
  // The change's version (after 5) takes them.
  CHECK(pool.Take(3 << 20, {"job", 6}));
  CHECK(pool.Take(2 << 20, {"job", 6}));
  CHECK(pool.Take(2 << 20, {"job", 6}));
  // Bad sizes are skipped.
  CHECK(pool.Queue({0, -1, INT64_MAX}, {"job", 5}) == 0);
}

namespace {

// Threads that keep every CPU busy (at normal priority) while alive.
class BusyCpus {
 public:
  BusyCpus() {
    const long n = 2 * std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (long i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
        }
      });
    }
  }
  ~BusyCpus() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// `bytes` of the store's memory, touched (in huge pages, as the store's
// regions), then given back (a version that was deleted): its pages are
// free and warm.
void UseAndFree(MemoryBudget* budget, int64_t bytes) {
  auto r = budget->Reserve(bytes, "a region");
  REQUIRE(r.ok());
  const int fd = memfd_create("test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, bytes) == 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  AdviseHugePages(p, bytes);
  std::memset(p, 1, bytes);
  munmap(p, bytes);
  close(fd);
}

// Waits until `pool` has `bytes` ready and `counter` reads `at_least`.
int64_t WaitReady(SparePool* pool, int64_t bytes, const Counter& counter,
                  int64_t at_least, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while ((pool->ready_bytes() < bytes || counter.value() < at_least) &&
         absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  return pool->ready_bytes();
}

}  // namespace

TEST_CASE(
    "spare pool: memory the store just gave back is refilled at normal "
    "priority while every CPU is busy and the idle thread waits",
    "[tensor_store]") {
  MemoryBudget budget(256 << 20);
  SparePool pool(&budget, 64 << 20);
  pool.SetMemoryFloor(0);
  // Whatever memory the kernel hands out (warm, or cold where tests running
  // beside this one took the pages freed): the next test covers cold.
  pool.SetColdStep(absl::Seconds(1));
  Counter& refilled = GetCounter("ptc_store_spares_refilled_total");
  const int64_t refilled_before = refilled.value();
  BusyCpus busy;
  // A save of three 16 MiB regions queues three spares for the next save.
  for (int i = 0; i < 3; ++i) CHECK(!pool.Take(16 << 20, {"job", 1}));
  // The idle thread waits for a free CPU (50 ms per huge page at least):
  // nothing is ready a while later.
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(pool.ready_bytes() == 0);
  // The previous version is deleted: the refill thread prepares the queued
  // spares from it at once. It refills for a second after a release only
  // (memory freed longer ago may be cold): on a loaded machine (tests
  // running beside this one) its first spare may take that long, and the
  // idle thread then prepares the rest, as it did in 1 of about 10 runs of
  // the whole test suite. Under outside load (two suites at once) beside
  // the busy CPUs here, the idle thread may get no CPU at all: what is
  // asked is one spare from the refill thread, which runs at normal
  // priority (16 MiB; the idle thread alone never gets one here).
  UseAndFree(&budget, 48 << 20);
  const int64_t ready = WaitReady(&pool, 16 << 20, refilled,
                                  refilled_before + 1, absl::Seconds(60));
  INFO("refills that met cold memory: "
       << GetCounter("ptc_store_spares_refill_cold_total").value()
       << "; refilled " << refilled.value() - refilled_before << ", queued "
       << pool.queued_bytes() << " bytes, budget used " << budget.used());
  CHECK(ready >= (16 << 20));
  CHECK(refilled.value() - refilled_before >= 1);
}

TEST_CASE(
    "spare pool: what the store gives back while a change stages is not "
    "refilled; what it gives back after is",
    "[tensor_store]") {
  MemoryBudget budget(256 << 20);
  SparePool pool(&budget, 64 << 20);
  pool.SetMemoryFloor(0);
  pool.SetColdStep(absl::Seconds(1));
  Counter& refilled = GetCounter("ptc_store_spares_refilled_total");
  const int64_t refilled_before = refilled.value();
  BusyCpus busy;  // the idle thread waits (50 ms per huge page at least)
  for (int i = 0; i < 3; ++i) CHECK(!pool.Take(16 << 20, {"job", 1}));
  {
    const SparePool::RefillHold staging = pool.HoldRefill();
    UseAndFree(&budget, 48 << 20);
    // Many of the refill thread's polls (every 10 ms) see the release.
    absl::SleepFor(absl::Milliseconds(300));
    CHECK(refilled.value() == refilled_before);
  }
  // The change is done; the old version is deleted.
  UseAndFree(&budget, 48 << 20);
  WaitReady(&pool, 16 << 20, refilled, refilled_before + 1, absl::Seconds(10));
  CHECK(refilled.value() - refilled_before >= 1);
}

TEST_CASE(
    "spare pool: a refill that meets cold memory stops and leaves the spare "
    "to the idle thread",
    "[tensor_store]") {
  MemoryBudget budget(256 << 20);
  SparePool pool(&budget, 64 << 20);
  pool.SetMemoryFloor(0);
  pool.SetColdStep(absl::ZeroDuration());  // every page counts as cold
  Counter& cold = GetCounter("ptc_store_spares_refill_cold_total");
  const int64_t cold_before = cold.value();
  {
    BusyCpus busy;
    for (int i = 0; i < 3; ++i) CHECK(!pool.Take(16 << 20, {"job", 1}));
    UseAndFree(&budget, 48 << 20);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (cold.value() == cold_before && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(200));
    INFO("refilled " << GetCounter("ptc_store_spares_refilled_total").value()
                     << ", ready " << pool.ready_bytes() << ", queued "
                     << pool.queued_bytes() << ", budget used "
                     << budget.used() << ", released " << budget.released());
    CHECK(cold.value() - cold_before == 1);  // and it stopped there
  }
  // Nothing was lost: the idle thread prepares all three.
  pool.WaitIdle();
  CHECK(pool.ready_bytes() == (48 << 20));
  CHECK(pool.queued_bytes() == 0);
  CHECK(budget.used() == (48 << 20));
}

TEST_CASE(
    "spare pool: the idle thread, starved of CPU, does not stall the "
    "daemon's other threads that map memory",
    "[tensor_store]") {
  // Faults under the mapping's own lock, not the process's memory map:
  // shared memory since Linux 6.7. Before, the idle thread's faults hold
  // the map, a fault at a time.
  utsname u{};
  REQUIRE(uname(&u) == 0);
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2 ||
      std::make_pair(major, minor) < std::make_pair(6, 7)) {
    WARN("kernel " << u.release << ": no per-mapping fault locks; skipped");
    return;
  }
  MemoryBudget budget(256 << 20);
  SparePool pool(&budget, 128 << 20);
  pool.SetMemoryFloor(0);
  BusyCpus busy;
  // The idle thread prepares 64 MiB a huge page at a time, at idle
  // priority on busy CPUs: seconds.
  CHECK(!pool.Take(64 << 20, {"job", 1}));
  absl::Duration total, worst;
  int n = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(1);
       absl::Now() < end; ++n) {
    const absl::Time t = absl::Now();
    void* p = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) FAIL("mmap: " << std::strerror(errno));
    munmap(p, 2 << 20);
    const absl::Duration d = absl::Now() - t;
    total += d;
    worst = std::max(worst, d);
    absl::SleepFor(absl::Milliseconds(1));
  }
  INFO(n << " mmap + munmap, worst " << absl::FormatDuration(worst)
         << ", mean " << absl::FormatDuration(total / n) << ", ready "
         << pool.ready_bytes());
  // Holding the map while it populated, the idle thread stalled one of
  // them for 1.8-3.2 s in every such second on the CI VM; now at most a
  // few milliseconds.
  CHECK(worst < absl::Milliseconds(500));
}

TEST_CASE(
    "spare pool: a save spare being prepared when its job's change begins is "
    "freed, not made ready",
    "[tensor_store]") {
  MemoryBudget budget(256 << 20);
  SparePool pool(&budget, 128 << 20);
  pool.SetMemoryFloor(0);
  {
    // The idle thread takes the spare and prepares it a huge page at a
    // time, waiting for a free CPU before each (up to 50 ms): it is still
    // at it when the change begins.
    BusyCpus busy;
    CHECK(!pool.Take(64 << 20, {"job", 1}));
    absl::SleepFor(absl::Milliseconds(200));
    CHECK(pool.ForgetSaves("job") == 0);  // nothing was ready yet
  }
  pool.WaitIdle();
  CHECK(pool.ready_bytes() == 0);
  CHECK(pool.queued_bytes() == 0);
  CHECK(budget.used() == 0);
}

TEST_CASE(
    "spare pool: a change of a job's layout gives back the spares its saves "
    "asked for, and keeps those prepared for the change",
    "[tensor_store]") {
  Store s({/*memory_limit_bytes=*/64 << 20, /*spare_pool_bytes=*/16 << 20});
  s.spares().SetMemoryFloor(0);
  for (const char* job : {"a", "b"}) {
    REQUIRE(s.DeclareTensors(job, {{"w", DType::kUInt8, {4, 1 << 20}}}).ok());
    // A save of one 1 MiB row queues a spare of 1 MiB for the next save.
    auto put = s.BeginPut(job, 1, "w", Region{{0, 1}, {0, 1 << 20}},
                          std::nullopt, /*map=*/false);
    REQUIRE(put.ok());
  }
  // What `ptcctl prepare` asks for job a's coming change: 2 MiB and 1 MiB.
  // Job a's save spare of 1 MiB does not count for the change (it drops
  // it); job b's does not either (b's next save takes it).
  CHECK(s.PrepareMemory("a", 1, {2 << 20, 1 << 20}).value() == (3 << 20));
  s.spares().WaitIdle();
  REQUIRE(s.spares().ready_bytes() == (5 << 20));
  // Job a's change stages version 2: its save's spare goes, b's and the
  // change's stay.
  REQUIRE(s.CreateStaged("a", 2, 1).ok());
  CHECK(s.spares().ready_bytes() == (4 << 20));
  // The change's buffers are the prepared ones (each put queues another
  // of its size for the next save, of the new layout).
  Counter& used = GetCounter("ptc_store_spares_used_total");
  const int64_t used_before = used.value();
  for (const Region& r : {Region{{0, 2}, {0, 1 << 20}},
                          Region{{2, 3}, {0, 1 << 20}}}) {
    auto staged = s.BeginPut("a", 2, "w", r, std::nullopt, /*map=*/false,
                             /*stage_epoch=*/1);
    REQUIRE(staged.ok());
  }
  CHECK(used.value() - used_before == 2);
}

TEST_CASE(
    "spare pool: a deleted job's save spares are anyone's, and give way to "
    "the next job's registration",
    "[tensor_store]") {
  Store s({/*memory_limit_bytes=*/64 << 20, /*spare_pool_bytes=*/8 << 20});
  s.spares().SetMemoryFloor(0);
  Counter& used = GetCounter("ptc_store_spares_used_total");
  // Job "a" saves 4 MiB as 4 rows of 1 MiB: the pool's spares for its next
  // save fill half the pool.
  REQUIRE(s.DeclareTensors("a", {{"w", DType::kUInt8, {4, 1 << 20}}}).ok());
  for (int64_t row = 0; row < 4; ++row) {
    auto put = s.BeginPut("a", 1, "w", Region{{row, row + 1}, {0, 1 << 20}},
                          std::nullopt, /*map=*/false);
    REQUIRE(put.ok());
  }
  s.spares().WaitIdle();
  REQUIRE(s.spares().ready_bytes() == (4 << 20));
  // A job registered beside it with 2 rows of 3 MiB finds room for one:
  // a live job's spares are its next save's.
  CHECK(s.PrepareMemory("b", 0, {3 << 20, 3 << 20}).value() == (3 << 20));
  s.spares().WaitIdle();
  REQUIRE(s.spares().ready_bytes() == (7 << 20));
  // Job "a" is deleted: its spares stay, as anyone's. Job "c", registered
  // next with a's rows, finds them ready, and its first save takes them.
  REQUIRE(s.DeleteJob("a").ok());
  CHECK(s.spares().ready_bytes() == (7 << 20));
  CHECK(s.PrepareMemory("c", 0, {1 << 20, 1 << 20}).value() == (2 << 20));
  CHECK(s.spares().queued_bytes() == 0);
  REQUIRE(s.DeclareTensors("c", {{"w", DType::kUInt8, {4, 1 << 20}}}).ok());
  const int64_t used_before = used.value();
  {
    auto put = s.BeginPut("c", 1, "w", Region{{0, 1}, {0, 1 << 20}},
                          std::nullopt, /*map=*/false);
    REQUIRE(put.ok());
  }
  CHECK(used.value() - used_before == 1);
  s.spares().WaitIdle();  // c's put asked for one of 1 MiB for its next save
  REQUIRE(s.spares().ready_bytes() == (7 << 20));
  // Job "d", registered with rows of 2 MiB: a's three left give way for
  // them; b's and c's do not.
  CHECK(s.PrepareMemory("d", 0, {2 << 20, 2 << 20}).value() == (4 << 20));
  s.spares().WaitIdle();
  CHECK(s.spares().ready_bytes() == (8 << 20));
}

TEST_CASE("spare pool: spares give way when the machine's memory is short",
          "[tensor_store]") {
  MemoryBudget budget(64 << 20);
  SparePool pool(&budget, 8 << 20);
  // No spare that would leave less than the floor available.
  pool.SetMemoryFloor(int64_t{1} << 50);  // 1 PiB: more than any machine has
  CHECK(!pool.Take(1 << 20, {"job", 1}));
  pool.WaitIdle();
  CHECK(pool.ready_bytes() == 0);
  CHECK(budget.used() == 0);
  // Ready spares are given back when memory becomes short.
  pool.SetMemoryFloor(0);
  CHECK(!pool.Take(1 << 20, {"job", 2}));
  pool.WaitIdle();
  REQUIRE(pool.ready_bytes() == (1 << 20));
  pool.SetMemoryFloor(int64_t{1} << 50);  // 1 PiB: more than any machine has
  // The idle thread gives them back; under outside load it may wait long
  // for a CPU (the bound only catches a spare never given back).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  // (The count drops before the memory returns to the budget.)
  while ((pool.ready_bytes() > 0 || budget.used() > 0) &&
         absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  CHECK(pool.ready_bytes() == 0);
  CHECK(budget.used() == 0);
}

TEST_CASE(
    "store: small objects are per version and rank, immutable once "
    "committed, bounded, and paid for",
    "[tensor_store]") {
  Store s({1 << 20});
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {4}}}).ok());
  REQUIRE(s.PutSmallObject("job", 1, "rng", 0, "state of rank 0").ok());
  REQUIRE(s.PutSmallObject("job", 1, "rng", 1, "state of rank 1").ok());
  // Each pays for its bytes, its name and its entry.
  CHECK(s.data_bytes_used() ==
        2 * SmallObjectMemoryBytes("rng", "state of rank 0"));
  auto got = s.GetSmallObject("job", 1, "rng", 1);
  REQUIRE(got.ok());
  CHECK(*got->bytes == "state of rank 1");
  CHECK(got->checksum == Checksum("state of rank 1", 15));
  CHECK(s.List("job").jobs(0).versions(0).small_objects() == 2);

  // The same object again, a damaged one, a huge one: refused, clearly.
  auto again = s.PutSmallObject("job", 1, "rng", 0, "other");
  CHECK(again.code() == absl::StatusCode::kAlreadyExists);
  CHECK(s.PutSmallObject("job", 1, "step", 0, "7", /*expected=*/12345).code() ==
        absl::StatusCode::kDataLoss);
  auto huge = s.PutSmallObject("job", 1, "big", 0,
                               std::string(kMaxSmallObjectBytes + 1, 'x'));
  CHECK(huge.code() == absl::StatusCode::kInvalidArgument);
  CHECK(huge.message().find("store larger state as a tensor") !=
        std::string::npos);
  auto missing = s.GetSmallObject("job", 1, "rng", 5);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message().find("'rng' of rank 5") !=
        std::string::npos);
  CHECK(s.PutSmallObject("nojob", 1, "rng", 0, "x").code() ==
        absl::StatusCode::kNotFound);

  CHECK(s.PutSmallObject("job", 1, std::string(kMaxSmallObjectNameBytes + 1, 'n'),
                         0, "x")
            .code() == absl::StatusCode::kInvalidArgument);
  // Many empty objects with long names reach the memory limit: what they
  // hold is counted, not only their (empty) bytes.
  absl::Status full;
  int stored = 0;
  for (int i = 0; i < 100000 && full.ok(); ++i) {
    full = s.PutSmallObject("job", 2, absl::StrCat(std::string(200, 'n'), i),
                            0, "");
    stored += full.ok();
  }
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(stored < (1 << 20) / 200);
  REQUIRE(s.DeleteVersion("job", 2).ok());

  REQUIRE(s.Commit("job", 1).ok());
  CHECK(s.PutSmallObject("job", 1, "step", 0, "7").code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(s.DeleteVersion("job", 1).ok());
  s.WaitReleased();
  CHECK(s.data_bytes_used() == 0);
  // A reference taken before the delete stays valid.
  CHECK(*got->bytes == "state of rank 1");
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

// A put of region `r` of "w" into `version` by a writer of `epoch` (0: a
// save), finished; its status.
absl::Status PutAs(Store& s, int64_t version, const Region& r, int64_t epoch) {
  auto put = s.BeginPut("job", version, "w", r, std::nullopt, true, epoch);
  if (!put.ok()) return put.status();
  if (!s.hollow())
    std::memset((*put)->buffer->mutable_data(), 3, (*put)->bytes);
  return s.FinishPut(std::move(*put)).status();
}

TEST_CASE(
    "store: a staged version takes writes only from its own plan epoch, and a "
    "save's version only from saves",
    "[tensor_store]") {
  Store s(Options(1 << 20, GENERATE(false, true)));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region a{{0, 4}, {0, 8}}, b{{4, 8}, {0, 8}};
  REQUIRE(s.CreateStaged("job", 2, 5).ok());
  CHECK(s.CreateStaged("job", 2, 6).code() ==
        absl::StatusCode::kAlreadyExists);
  // A save racing the change cannot land inside the staged version.
  const absl::Status save = PutAs(s, 2, a, 0);
  CHECK(save.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(save.message(), "being staged by a reconfiguration"));
  CHECK(s.PutSmallObject("job", 2, "iteration", 0, "x").code() ==
        absl::StatusCode::kFailedPrecondition);
  // Nor can another plan's writer.
  CHECK(PutAs(s, 2, a, 4).code() == absl::StatusCode::kAborted);
  CHECK(PutAs(s, 2, a, 5).ok());
  CHECK(s.List("job").jobs(0).versions(0).stage_epoch() == 5);

  // A save's version refuses staged writers, and an abort never deletes it.
  REQUIRE(PutAs(s, 3, a, 0).ok());
  CHECK(PutAs(s, 3, b, 5).code() == absl::StatusCode::kAborted);
  CHECK_FALSE(s.DeleteStaged("job", 3, 100));
  // An abort of an older epoch leaves a newer plan's staging alone; its
  // own (or a fencing, newer) epoch deletes it.
  CHECK_FALSE(s.DeleteStaged("job", 2, 4));
  CHECK(s.DeleteStaged("job", 2, 5));
  // A writer of the aborted plan cannot bring the version back.
  const absl::Status late = PutAs(s, 2, b, 5);
  CHECK(late.code() == absl::StatusCode::kAborted);
  CHECK(absl::StrContains(late.message(), "aborted or fenced"));
  std::vector<int64_t> versions;
  const proto::ListResponse listed = s.List("job");
  for (const auto& v : listed.jobs(0).versions())
    versions.push_back(v.version());
  CHECK(versions == std::vector<int64_t>{3});
}

TEST_CASE(
    "store: a checked commit proves every expected region and small object "
    "first, and commits nothing otherwise",
    "[tensor_store]") {
  Store s(Options(1 << 20, GENERATE(false, true)));
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  const Region a{{0, 4}, {0, 8}}, b{{4, 8}, {0, 8}};
  REQUIRE(PutAs(s, 1, a, 0).ok());
  REQUIRE(s.PutSmallObject("job", 1, "iteration", 0, "7").ok());
  VersionExpectation expect;
  expect.regions = {{"w", a}, {"w", b}};
  expect.small_objects = {{"iteration", 0}};
  auto missing = s.CommitChecked("job", 1, expect, false);
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(missing.status().message(),
                          "lacks region [4:8, 0:8]"));
  CHECK_FALSE(s.List("job").jobs(0).versions(0).committed());
  // A region covered only in parts is not the region.
  expect.regions = {{"w", Region{{0, 8}, {0, 8}}}};
  CHECK(s.CommitChecked("job", 1, expect, false).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  expect.regions = {{"w", a}};
  expect.small_objects = {{"iteration", 1}};
  auto no_object = s.CommitChecked("job", 1, expect, false);
  CHECK(absl::StrContains(no_object.status().message(),
                          "lacks small object 'iteration' of rank 1"));
  expect.small_objects = {{"iteration", 0}};
  auto checked = s.CommitChecked("job", 1, expect, /*check_only=*/true);
  REQUIRE(checked.ok());
  REQUIRE(checked->checksums.size() == 1);
  CHECK(checked->checksums[0] == FilledChecksum(s, a, 3));
  CHECK_FALSE(s.List("job").jobs(0).versions(0).committed());
  REQUIRE(s.CommitChecked("job", 1, expect, false).ok());
  CHECK(s.List("job").jobs(0).versions(0).committed());
  CHECK(PutAs(s, 1, b, 0).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "store: a hollow store charges memory as if the bytes were there, holds "
    "none, and proves re-partitioned regions by their fingerprints",
    "[tensor_store]") {
  Store s(Options(int64_t{160} << 30, /*hollow=*/true));
  // 64 GiB of float32 per version, which no machine here could hold.
  const Shape shape = {int64_t{1} << 17, int64_t{1} << 17};
  REQUIRE(s.DeclareTensors("job", {{"w", DType::kFloat32, shape}}).ok());
  auto put_all = [&](int64_t version, std::vector<Region> regions) {
    for (const Region& r : regions) {
      auto put = s.BeginPut("job", version, "w", r);
      REQUIRE(put.ok());
      CHECK((*put)->buffer->hollow());
      CHECK((*put)->buffer->fd() < 0);
      CHECK((*put)->buffer->mutable_data() == nullptr);
      REQUIRE(s.FinishPut(std::move(*put)).ok());
    }
  };
  const int64_t half = int64_t{1} << 16, full = int64_t{1} << 17;
  put_all(1, {Region{{0, half}, {0, full}}, Region{{half, full}, {0, full}}});
  CHECK(s.data_bytes_used() == int64_t{64} << 30);
  // Version 2 holds the tensor in columns: the same elements, the same
  // fingerprint; a part of it differs.
  const Region left{{0, full}, {0, half}}, right{{0, full}, {half, full}};
  put_all(2, {left, right});
  auto rows = s.Fingerprint("job", 1, "w", {});
  auto columns = s.Fingerprint("job", 2, "w", {});
  REQUIRE(rows.ok());
  REQUIRE(columns.ok());
  CHECK(rows->first == columns->first);
  CHECK(rows->second == int64_t{1} << 34);
  auto part = s.Fingerprint("job", 2, "w", {left});
  REQUIRE(part.ok());
  CHECK(part->first != rows->first);
  // Beyond the limit, as with the bytes: 3 x 64 GiB of 160.
  CHECK(s.BeginPut("job", 3, "w", Region::Full(shape)).status().code() ==
        absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ptc
