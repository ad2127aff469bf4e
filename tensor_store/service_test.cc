// The TensorStore gRPC service against a real in-process server on
// localhost:0.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/metrics.h"
#include "ptc/fingerprint.h"
#include "ptc/region_proto.h"
#include "ptc/small_object.h"
#include "tensor_store/internal/client_calls.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

using testing::StartDaemon;

std::vector<char> RandomBytes(int64_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// The bytes of `what` cut out of a row-major buffer holding `box`.
std::vector<char> Cut(const std::vector<char>& full, const Region& box,
                      const Region& what, int64_t elem) {
  std::vector<char> out(what.volume() * elem);
  CopyRegion(full.data(), box, out.data(), what, what, elem);
  return out;
}

TEST_CASE("tensor store: every dtype round-trips, whole and across regions",
          "[tensor_store][service]") {
  auto d = StartDaemon();
  const Shape shape = {5, 7, 3};
  const Region full = Region::Full(shape);
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = AllDTypes()[i];
    const std::string key = absl::StrCat("t_", DTypeName(dtype));
    INFO(key);
    REQUIRE(d->client->Declare("job", {{key, dtype, shape}}).ok());
    const int64_t elem = ElementSize(dtype);
    const std::vector<char> data = RandomBytes(full.volume() * elem, i);
    // Two stored regions: columns [0, 3) and [3, 7).
    const Region left{{0, 5}, {0, 3}, {0, 3}}, right{{0, 5}, {3, 7}, {0, 3}};
    for (const Region& r : {left, right}) {
      const std::vector<char> part = Cut(data, full, r, elem);
      auto sum = d->client->Put("job", 1, key, r, part.data(), part.size());
      REQUIRE(sum.ok());
      CHECK(*sum == Checksum(part.data(), part.size()));
    }
    std::vector<char> back(data.size());
    REQUIRE(
        d->client->Read("job", 1, key, full, back.data(), back.size()).ok());
    CHECK(back == data);
  }
  auto list = d->client->List("job");
  REQUIRE(list.ok());
  REQUIRE(list->jobs_size() == 1);
  CHECK(list->jobs(0).versions(0).tensors_size() == kNumDTypes);
  CHECK(list->jobs(0).versions(0).tensors(0).regions_size() == 2);
}

TEST_CASE(
    "tensor store: a commit's expectations are kept under their id for the "
    "job's next commits, until the job is deleted",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  const Shape shape = {4, 6};
  const Region left{{0, 4}, {0, 3}}, right{{0, 4}, {3, 6}};
  REQUIRE(d->client->Declare("job", {{"w", DType::kFloat32, shape}}).ok());
  auto put = [&](int64_t version) {
    for (const Region& r : {left, right}) {
      const std::vector<char> part =
          RandomBytes(r.volume() * 4, static_cast<uint32_t>(version));
      REQUIRE(d->client->Put("job", version, "w", r, part.data(), part.size())
                  .ok());
    }
  };
  auto by_id = [&](int64_t version, uint64_t id) {
    proto::CommitVersionRequest req;
    req.set_job("job");
    req.set_version(version);
    req.set_expectations_id(id);
    return d->client->CommitChecked(req);
  };
  put(1);
  put(2);
  put(3);
  // Named before any was sent: unknown, and version 1 stays open.
  auto unknown = by_id(1, 42);
  REQUIRE(unknown.ok());
  CHECK(unknown->expectations_unknown());
  CHECK(unknown->checksums_size() == 0);

  proto::CommitVersionRequest whole;
  whole.set_job("job");
  whole.set_version(1);
  whole.set_expectations_id(42);
  for (const Region& r : {left, right}) {
    proto::ExpectedRegion* e = whole.add_expect_regions();
    e->set_tensor("w");
    RegionToProto(r, e->mutable_region());
  }
  auto first = d->client->CommitChecked(whole);
  REQUIRE(first.ok());
  CHECK_FALSE(first->expectations_unknown());
  CHECK(first->checksums_size() == 2);

  // Version 2 by id: checked against the same two regions.
  auto second = by_id(2, 42);
  REQUIRE(second.ok());
  CHECK_FALSE(second->expectations_unknown());
  REQUIRE(second->checksums_size() == 2);
  CHECK(second->bytes() == 4 * 6 * 4);
  // Another id is not what the store keeps.
  CHECK(by_id(3, 43)->expectations_unknown());

  // A job deleted forgets them.
  REQUIRE(d->client->DeleteJob("job").ok());
  REQUIRE(d->client->Declare("job", {{"w", DType::kFloat32, shape}}).ok());
  put(4);
  CHECK(by_id(4, 42)->expectations_unknown());
}

TEST_CASE(
    "tensor store: partial reads spanning several stored regions are exact",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  const Shape shape = {40, 24};
  const Region full = Region::Full(shape);
  REQUIRE(d->client->Declare("job", {{"w", DType::kFloat32, shape}}).ok());
  const std::vector<char> data = RandomBytes(full.volume() * 4, 11);
  // A 2 x 3 grid of stored regions with uneven sizes.
  for (Interval rows : {Interval{0, 17}, Interval{17, 40}}) {
    for (Interval cols : {Interval{0, 5}, Interval{5, 16}, Interval{16, 24}}) {
      const Region r{rows, cols};
      const std::vector<char> part = Cut(data, full, r, 4);
      REQUIRE(d->client->Put("job", 3, "w", r, part.data(), part.size()).ok());
    }
  }
  std::mt19937 rng(5);
  for (int iter = 0; iter < 60; ++iter) {
    Region r = full;
    for (int dim = 0; dim < 2; ++dim) {
      int64_t a = rng() % (shape[dim] + 1), b = rng() % (shape[dim] + 1);
      r.mutable_dim(dim) = {std::min(a, b), std::max(a, b)};
    }
    if (r.empty()) continue;
    const std::vector<char> want = Cut(data, full, r, 4);
    std::vector<char> got(want.size());
    // Small chunks, so that chunks cut rows and cross stored regions.
    int64_t off = 0;
    auto n = d->client->ReadWith(
        "job", 3, "w", r,
        [&](int64_t o, const char* src, int64_t k) {
          std::memcpy(got.data() + o, src, k);
          off = o + k;
        },
        /*chunk_bytes=*/100);
    REQUIRE(n.ok());
    CHECK(*n == static_cast<int64_t>(want.size()));
    CHECK(got == want);
  }
}

TEST_CASE(
    "tensor store: fingerprints add up across any partition and match the "
    "values",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  const Shape shape = {16, 10};
  const Region full = Region::Full(shape);
  REQUIRE(d->client->Declare("job", {{"w", DType::kBFloat16, shape}}).ok());
  const std::vector<char> data = RandomBytes(full.volume() * 2, 3);
  for (Interval rows : {Interval{0, 9}, Interval{9, 16}}) {
    const Region r{rows, {0, 10}};
    const std::vector<char> part = Cut(data, full, r, 2);
    REQUIRE(d->client->Put("job", 1, "w", r, part.data(), part.size()).ok());
  }
  const uint64_t want = FingerprintRegion(data.data(), full, full, shape, 2);
  auto all = d->client->Fingerprint("job", 1, "w");
  REQUIRE(all.ok());
  CHECK(all->fingerprint() == want);
  CHECK(all->elements() == full.volume());
  auto cols = d->client->Fingerprint(
      "job", 1, "w", {Region{{0, 16}, {0, 3}}, Region{{0, 16}, {3, 10}}});
  REQUIRE(cols.ok());
  CHECK(cols->fingerprint() == want);
}

TEST_CASE(
    "tensor store: several tensors' fingerprints in one call, each as its "
    "own call would answer; bad asks get clear errors",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  const Shape shape = {16, 10};
  const Region full = Region::Full(shape);
  REQUIRE(d->client
              ->Declare("job", {{"a", DType::kFloat32, shape},
                                {"b", DType::kInt8, shape}})
              .ok());
  for (const char* t : {"a", "b"}) {
    const std::vector<char> data =
        RandomBytes(full.volume() * (t[0] == 'a' ? 4 : 1), t[0]);
    REQUIRE(d->client->Put("job", 1, t, full, data.data(), data.size()).ok());
  }
  const Region left{{0, 16}, {0, 4}};
  auto many = d->client->Fingerprints(
      "job", 1, {{"a", {}}, {"b", {left}}, {"a", {left}}});
  REQUIRE(many.ok());
  REQUIRE(many->tensors_size() == 3);
  const std::pair<std::string, std::vector<Region>> asks[] = {
      {"a", {}}, {"b", {left}}, {"a", {left}}};
  for (int i = 0; i < 3; ++i) {
    auto one = d->client->Fingerprint("job", 1, asks[i].first, asks[i].second);
    REQUIRE(one.ok());
    CHECK(many->tensors(i).fingerprint() == one->fingerprint());
    CHECK(many->tensors(i).elements() == one->elements());
  }
  SECTION("a tensor the job does not declare names it") {
    auto bad = d->client->Fingerprints("job", 1, {{"a", {}}, {"c", {}}});
    CHECK(bad.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(bad.status().message()), Catch::Contains("'c'"));
  }
  SECTION("more tensors than one call takes") {
    std::vector<std::pair<std::string, std::vector<Region>>> lots(
        kMaxFingerprintsPerCall + 1, {"a", {}});
    auto bad = d->client->Fingerprints("job", 1, lots);
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(bad.status().message()),
               Catch::Contains("at most 4096"));
  }
  SECTION("a region outside the tensor") {
    auto bad =
        d->client->Fingerprints("job", 1, {{"b", {Region{{0, 17}, {0, 10}}}}});
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("tensor store: commit, stat, stats and delete",
          "[tensor_store][service]") {
  auto d = StartDaemon();
  REQUIRE(d->client->Declare("job", {{"w", DType::kInt64, {100}}}).ok());
  const std::vector<char> data = RandomBytes(800, 1);
  REQUIRE(
      d->client->Put("job", 1, "w", Region{{0, 100}}, data.data(), 800).ok());
  REQUIRE(d->client->Commit("job", 1).ok());
  auto stat = d->client->Stat("job", 1, "w");
  REQUIRE(stat.ok());
  CHECK(stat->committed());
  CHECK(stat->tensor().regions(0).bytes() == 800);
  auto stats = d->client->Stats();
  REQUIRE(stats.ok());
  CHECK(testing::DataBytesUsed(*stats) == 800);
  CHECK(stats->versions(0).bytes() == 800);
  bool counted = false;
  for (const auto& c : stats->counters()) {
    if (c.name() == "ptc_store_bytes_in_total") counted = c.value() >= 800;
  }
  CHECK(counted);
  auto deleted = d->client->DeleteVersion("job", 1);
  REQUIRE(deleted.ok());
  CHECK(*deleted == 800);
  // Freed in the background; a region the background fingerprinter (idle
  // priority: slow on a busy machine) still reads is freed when it ends.
  d->server->store()->WaitFingerprinted();
  d->server->store()->WaitReleased();
  CHECK(testing::DataBytesUsed(*d->client->Stats()) == 0);
  CHECK(d->client->Stat("job", 1, "w").status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE(
    "service: GetSmallObjects answers many objects in order, within its "
    "answer's budget, and refuses hostile asks",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  REQUIRE(d->client->Declare("job", {{"w", DType::kInt64, {4}}}).ok());
  const std::vector<char> w = RandomBytes(32, 7);
  REQUIRE(d->client->Put("job", 1, "w", Region{{0, 4}}, w.data(), 32).ok());
  // 80 objects of 60 KiB: 4.8 MB, more than one answer carries.
  constexpr int kObjects = 80;
  std::vector<std::pair<std::string, int32_t>> keys;
  std::vector<std::string> want;
  for (int r = 0; r < kObjects; ++r) {
    const std::vector<char> b = RandomBytes(kMaxSmallObjectBytes, 100 + r);
    want.emplace_back(b.begin(), b.end());
    // Asked in an order of their own: the answer keeps it.
    keys.emplace_back(r % 2 ? "odd" : "even", kObjects - 1 - r);
    REQUIRE(d->client
                ->PutSmallObject("job", 1, keys.back().first,
                                 keys.back().second, want.back())
                .ok());
  }
  REQUIRE(d->client->Commit("job", 1).ok());

  auto got = d->client->GetSmallObjects("job", 1, keys);
  REQUIRE(got.ok());
  REQUIRE(got->size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK((*got)[i] == want[i]);

  // One call answers what fits in its budget, in order; the client asked
  // again for the rest.
  auto ask = [&](int from, int n, proto::GetSmallObjectsResponse* resp) {
    proto::GetSmallObjectsRequest req;
    req.set_job("job");
    req.set_version(1);
    for (int i = from; i < from + n; ++i) {
      proto::SmallObjectKey* k = req.add_objects();
      k->set_name(i < kObjects ? keys[i].first : "odd");
      k->set_rank(i < kObjects ? keys[i].second : 1000 + i);
    }
    grpc::ClientContext ctx;
    return FromGrpcStatus(d->client->stub()->GetSmallObjects(&ctx, req, resp));
  };
  proto::GetSmallObjectsResponse one;
  REQUIRE(ask(0, kObjects, &one).ok());
  CHECK(one.objects_size() > 1);
  CHECK(one.objects_size() < kObjects);
  CHECK(one.objects(1).data() == want[1]);
  CHECK(one.objects(1).checksum() == Checksum(want[1].data(), want[1].size()));

  proto::GetSmallObjectsResponse none;
  const absl::Status empty = ask(0, 0, &none);
  CHECK(empty.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(empty.message()), Catch::Contains("ask for 1 to"));
  // More than a call may ask (the client splits them; a hostile caller
  // does not).
  proto::GetSmallObjectsRequest many;
  many.set_job("job");
  many.set_version(1);
  for (int i = 0; i <= kMaxSmallObjectsPerCall; ++i) {
    proto::SmallObjectKey* k = many.add_objects();
    k->set_name("odd");
    k->set_rank(1);
  }
  {
    grpc::ClientContext ctx;
    proto::GetSmallObjectsResponse resp;
    CHECK(d->client->stub()->GetSmallObjects(&ctx, many, &resp).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
  }
  // One object missing fails the call, with nothing answered.
  proto::GetSmallObjectsResponse missing;
  const absl::Status gone = ask(kObjects - 2, 3, &missing);
  CHECK(gone.code() == absl::StatusCode::kNotFound);
  CHECK(d->client->GetSmallObjects("job", 1, {{"even", 1}, {"odd", 4242}})
            .status()
            .code() == absl::StatusCode::kNotFound);
}

// A Put built by hand: the header, then data chunks, optionally cancelled
// or with a wrong checksum.
struct RawPut {
  std::string job = "job";
  int64_t version = 1;
  std::string tensor = "w";
  Region region{{0, 4}, {0, 8}};
  std::string dtype;
  bool header = true;
  bool second_header = false;
  std::vector<int64_t> chunks = {128};  // bytes per data message
  uint64_t checksum = 0;
  bool cancel_midway = false;
};

absl::Status SendRaw(StoreClient& client, const RawPut& p) {
  grpc::ClientContext ctx;
  proto::PutResponse resp;
  auto writer = client.stub()->Put(&ctx, &resp);
  proto::PutRequest msg;
  if (p.header) {
    proto::PutHeader* h = msg.mutable_header();
    h->set_job(p.job);
    h->set_version(p.version);
    h->set_tensor(p.tensor);
    h->set_dtype(p.dtype);
    RegionToProto(p.region, h->mutable_region());
    writer->Write(msg);
    if (p.second_header) writer->Write(msg);
  }
  for (size_t i = 0; i < p.chunks.size(); ++i) {
    proto::PutRequest chunk;
    chunk.set_data(std::string(p.chunks[i], 'x'));
    chunk.set_checksum(p.checksum);
    if (!writer->Write(chunk)) break;
    if (p.cancel_midway && i == 0) {
      ctx.TryCancel();
      break;
    }
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

TEST_CASE(
    "tensor store: bad input gets a clear status, changes nothing, and the "
    "daemon keeps serving",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  REQUIRE(d->client->Declare("job", {{"w", DType::kFloat32, {8, 8}}}).ok());
  // One good region stored beforehand: rows [4, 8).
  const std::vector<char> good = RandomBytes(128, 2);
  REQUIRE(
      d->client->Put("job", 1, "w", Region{{4, 8}, {0, 8}}, good.data(), 128)
          .ok());
  const int64_t used_before = testing::DataBytesUsed(*d->client->Stats());

  struct Case {
    const char* name;
    std::function<absl::Status()> call;
    absl::StatusCode code;
    const char* says;
  };
  auto put = [&](std::function<void(RawPut&)> edit) {
    return [&d, edit] {
      RawPut p;
      edit(p);
      return SendRaw(*d->client, p);
    };
  };
  auto read = [&](std::string job, int64_t version, std::string tensor,
                  Region r) {
    return [&d, job, version, tensor, r] {
      std::vector<char> out(std::max<int64_t>(r.volume(), 1) * 8);
      return d->client->Read(job, version, tensor, r, out.data(),
                             r.volume() * 4);
    };
  };
  const std::vector<Case> cases = {
      {"unknown job", put([](RawPut& p) { p.job = "nojob"; }),
       absl::StatusCode::kNotFound, "job 'nojob' is unknown"},
      {"empty job", put([](RawPut& p) { p.job = ""; }),
       absl::StatusCode::kInvalidArgument, "must not be empty"},
      {"unknown tensor", put([](RawPut& p) { p.tensor = "v"; }),
       absl::StatusCode::kNotFound, "tensor 'v' is not declared"},
      {"negative version", put([](RawPut& p) { p.version = -2; }),
       absl::StatusCode::kInvalidArgument, "negative"},
      {"region out of bounds", put([](RawPut& p) {
         p.region = Region{{0, 4}, {0, 9}};
       }),
       absl::StatusCode::kInvalidArgument, "out of bounds"},
      {"region with begin > end", put([](RawPut& p) {
         p.region = Region{{3, 1}, {0, 8}};
       }),
       absl::StatusCode::kInvalidArgument, "begin <= end"},
      {"region of the wrong rank", put([](RawPut& p) {
         p.region = Region{{0, 4}};
       }),
       absl::StatusCode::kInvalidArgument, "rank 1"},
      {"empty region", put([](RawPut& p) {
         p.region = Region{{2, 2}, {0, 8}};
       }),
       absl::StatusCode::kInvalidArgument, "is empty"},
      {"dtype mismatch", put([](RawPut& p) { p.dtype = "fp16"; }),
       absl::StatusCode::kInvalidArgument,
       "declared fp32 but the put sends fp16"},
      {"unknown dtype", put([](RawPut& p) { p.dtype = "fp7"; }),
       absl::StatusCode::kInvalidArgument, "unknown dtype"},
      {"chunks overflow the region", put([](RawPut& p) {
         p.chunks = {100, 100};
       }),
       absl::StatusCode::kInvalidArgument, "more than the 128 bytes"},
      {"chunks underfill the region", put([](RawPut& p) { p.chunks = {64}; }),
       absl::StatusCode::kInvalidArgument, "after 64 of the 128 bytes"},
      {"no header", put([](RawPut& p) { p.header = false; }),
       absl::StatusCode::kInvalidArgument, "header"},
      {"two headers", put([](RawPut& p) { p.second_header = true; }),
       absl::StatusCode::kInvalidArgument, "exactly one header"},
      {"wrong checksum", put([](RawPut& p) { p.checksum = 12345; }),
       absl::StatusCode::kDataLoss, "checksum"},
      {"put cancelled half way", put([](RawPut& p) {
         p.chunks = {64, 64};
         p.cancel_midway = true;
       }),
       absl::StatusCode::kCancelled, ""},
      {"oversized message", put([](RawPut& p) {
         p.region = Region{{0, 8}, {0, 8}};
         p.chunks = {9 << 20};
       }),
       absl::StatusCode::kResourceExhausted, ""},
      {"region stored already", put([](RawPut& p) {
         p.region = Region{{4, 8}, {0, 8}};
       }),
       absl::StatusCode::kAlreadyExists, "already holds"},
      {"read of a region not stored here",
       read("job", 1, "w", Region{{0, 8}, {0, 8}}), absl::StatusCode::kNotFound,
       "not stored on this host"},
      {"read of an unknown version",
       read("job", 9, "w", Region{{4, 8}, {0, 8}}), absl::StatusCode::kNotFound,
       "no version 9"},
      {"read out of bounds", read("job", 1, "w", Region{{4, 9}, {0, 8}}),
       absl::StatusCode::kInvalidArgument, "out of bounds"},
      {"declare with another shape",
       [&] {
         return d->client->Declare("job", {{"w", DType::kFloat32, {8, 9}}});
       },
       absl::StatusCode::kFailedPrecondition, "cannot be re-declared"},
      {"declare a negative extent",
       [&] {
         return d->client->Declare("job", {{"z", DType::kFloat32, {-1}}});
       },
       absl::StatusCode::kInvalidArgument, "extent -1"},
      {"malformed message bytes",
       [&] {
         grpc::GenericStub generic(grpc::CreateChannel(
             d->address(), grpc::InsecureChannelCredentials()));
         grpc::ClientContext ctx;
         const char garbage[] = "\xff\xff\xff\xff\x0f not a protobuf";
         grpc::Slice slice(garbage, sizeof(garbage));
         grpc::ByteBuffer request(&slice, 1), response;
         absl::Status result;
         absl::Notification done;
         generic.UnaryCall(
             &ctx, "/ptc.proto.TensorStore/Stat", grpc::StubOptions(), &request,
             &response, [&](grpc::Status s) {
               result =
                   absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                s.error_message());
               done.Notify();
             });
         done.WaitForNotification();
         return result;
       },
       absl::StatusCode::kInternal, ""},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const absl::Status s = c.call();
    CHECK(s.code() == c.code);
    CHECK(s.message().find(c.says) != std::string::npos);
    INFO(s.ToString());
    // Nothing partial is left, and the daemon still serves. A call the
    // client saw fail (e.g. by its own message limit) may still be
    // unwinding in the daemon for a moment: wait for it, bounded.
    int64_t used = -1;
    for (int i = 0; i < 200 && used != used_before; ++i) {
      if (i > 0) absl::SleepFor(absl::Milliseconds(10));
      auto stats = d->client->Stats();
      REQUIRE(stats.ok());
      used = testing::DataBytesUsed(*stats);
    }
    CHECK(used == used_before);
    auto list = d->client->List("job");
    REQUIRE(list.ok());
    CHECK(list->jobs(0).versions_size() == 1);
    CHECK(list->jobs(0).versions(0).tensors(0).regions_size() == 1);
    std::vector<char> back(128);
    REQUIRE(
        d->client->Read("job", 1, "w", Region{{4, 8}, {0, 8}}, back.data(), 128)
            .ok());
    CHECK(back == good);
  }
  // And the region that failed so often can still be stored.
  const std::vector<char> top = RandomBytes(128, 4);
  CHECK(d->client->Put("job", 1, "w", Region{{0, 4}, {0, 8}}, top.data(), 128)
            .ok());
}

TEST_CASE("tensor store: the put that crosses the memory limit fails cleanly",
          "[tensor_store][service]") {
  auto d = StartDaemon(/*memory_limit=*/1 << 20);
  REQUIRE(
      d->client->Declare("job", {{"w", DType::kUInt8, {2, 600 << 10}}}).ok());
  const std::vector<char> row = RandomBytes(600 << 10, 8);
  REQUIRE(d->client
              ->Put("job", 1, "w", Region{{0, 1}, {0, 600 << 10}}, row.data(),
                    row.size())
              .ok());
  const int64_t used = testing::DataBytesUsed(*d->client->Stats());
  CHECK(used == (600 << 10));
  auto over = d->client->Put("job", 1, "w", Region{{1, 2}, {0, 600 << 10}},
                             row.data(), row.size());
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(over.status().message().find("memory limit") != std::string::npos);
  CHECK(testing::DataBytesUsed(*d->client->Stats()) == used);
  REQUIRE(d->client->DeleteVersion("job", 1).ok());
  d->server->store()->WaitReleased();
  CHECK(testing::DataBytesUsed(*d->client->Stats()) == 0);
  CHECK(d->client
            ->Put("job", 2, "w", Region{{1, 2}, {0, 600 << 10}}, row.data(),
                  row.size())
            .ok());
}

// Answers Stats with nothing, and keeps each caller's address and port.
class PeerRecorder final : public proto::TensorStore::Service {
 public:
  grpc::Status Stats(grpc::ServerContext* ctx, const proto::StatsRequest*,
                     proto::StatsResponse*) override {
    absl::MutexLock lock(&mu_);
    peers_.push_back(ctx->peer());
    return grpc::Status::OK;
  }
  std::vector<std::string> peers() {
    absl::MutexLock lock(&mu_);
    return peers_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> peers_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE(
    "service: a client made apart connects on its own; the others share one "
    "connection",
    "[service]") {
  // The coordinator keeps one client per host to ask a silent host
  // directly. While the host is unreachable, that client's connection
  // attempts fail, each after seconds (a cut link drops the packets).
  // gRPC shares a connection between a process's channels to one address
  // with the same arguments: a change's fresh clients, once the host is
  // back, would wait on the probe's last doomed attempt and fail with its
  // error ("Connection timed out"). So the probe's client is made apart.
  PeerRecorder recorder;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&recorder);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto probe = StoreClient::ConnectApart(address);
  auto first = StoreClient::Connect(address);
  auto second = StoreClient::Connect(address);
  REQUIRE(probe->Stats().ok());
  REQUIRE(first->Stats().ok());
  REQUIRE(second->Stats().ok());
  const std::vector<std::string> peers = recorder.peers();
  REQUIRE(peers.size() == 3);
  CHECK(peers[0] != peers[1]);  // the probe's connection is its own
  CHECK(peers[1] == peers[2]);  // two clients made by Connect share one
  server->Shutdown();
}

TEST_CASE("service: a Put stream that stalls is cancelled and its memory freed",
          "[tensor_store][hostile]") {
  testing::TempDir dir;
  TensorStoreServerOptions options;
  options.memory_limit_bytes = int64_t{64} << 20;
  // Long enough that the reservation is seen before the timeout frees it,
  // however busy the machine.
  options.put_timeout = absl::Seconds(3);
  auto server = TensorStoreServer::Start(options);
  REQUIRE(server.ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto client = StoreClient::Connect(address);
  REQUIRE(client->Declare("job", {{"w", DType::kFloat32, {1024, 1024}}}).ok());
  auto stub = proto::TensorStore::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::PutResponse resp;
  auto writer = stub->Put(&ctx, &resp);
  proto::PutRequest header;
  header.mutable_header()->set_job("job");
  header.mutable_header()->set_version(1);
  header.mutable_header()->set_tensor("w");
  RegionToProto(Region{{0, 1024}, {0, 1024}},
                header.mutable_header()->mutable_region());
  REQUIRE(writer->Write(header));
  // 4 MiB reserved; the client sends nothing more and never closes.
  auto used_becomes = [&](int64_t bytes) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while ((*server)->store()->data_bytes_used() != bytes &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return (*server)->store()->data_bytes_used();
  };
  CHECK(used_becomes(int64_t{4} << 20) == int64_t{4} << 20);
  CHECK(used_becomes(0) == 0);
  // The server cancelled the call (gRPC tells the client only that; the
  // daemon logs the reason), and the next save has the memory.
  CHECK(writer->Finish().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(client
            ->Put("job", 2, "w", Region{{0, 1024}, {0, 1024}},
                  std::vector<char>(4 << 20).data(), 4 << 20)
            .ok());
}

TEST_CASE(
    "service: one client's idle Put streams do not take the threads the "
    "coordinator, peers and other clients need",
    "[tensor_store][hostile]") {
  auto d = StartDaemon();
  Counter& refused = GetCounter(
      "ptc_store_errors_by_code_total{code=\"RESOURCE_EXHAUSTED\"}");
  const int64_t refused_before = refused.value();
  // 400 Put streams on one connection that send nothing (as a client that
  // opens streams and stalls); each held call holds a server thread. They
  // run on a completion queue, so that every stream's end is awaited at
  // once and the held ones hold until all the others have been answered:
  // only then are they closed (closing one earlier would free its place for
  // a stream the server has not reached yet, on a busy machine).
  auto channel = grpc::CreateChannel(d->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = proto::TensorStore::NewStub(channel);
  constexpr int kStreams = 400;
  constexpr int kHeld = ClientCalls::Bounds{}.per_connection;
  struct Stream {
    grpc::ClientContext context;
    proto::PutResponse response;
    std::unique_ptr<grpc::ClientAsyncWriter<proto::PutRequest>> writer;
    grpc::Status status;
    bool ended = false;
  };
  // Tags: 3i started, 3i+1 ended (its status arrived), 3i+2 closed.
  auto tag = [](int i, int what) {
    return reinterpret_cast<void*>(static_cast<intptr_t>(3 * i + what));
  };
  grpc::CompletionQueue cq;
  std::vector<Stream> streams(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    Stream& s = streams[i];
    s.writer = stub->AsyncPut(&s.context, &s.response, &cq, tag(i, 0));
    s.writer->Finish(&s.status, tag(i, 1));
  }
  int ended = 0;
  // Takes events until `enough` streams have ended (or 120 s have passed,
  // which only a server holding more than its bound lets happen).
  auto await_ends = [&](int enough) {
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::seconds(120);
    while (ended < enough) {
      void* got = nullptr;
      bool ok = false;
      if (cq.AsyncNext(&got, &ok, deadline) !=
          grpc::CompletionQueue::GOT_EVENT) {
        return;
      }
      const intptr_t t = reinterpret_cast<intptr_t>(got);
      if (t % 3 == 1) {
        streams[t / 3].ended = true;
        ++ended;
      }
    }
  };
  // Every stream beyond the connection's bound is refused at once: by
  // ptc's bound, or, while the burst of 400 arrives faster than a busy
  // machine's handler threads refuse them, by gRPC's own "Server
  // Threadpool Exhausted" (also RESOURCE_EXHAUSTED). The bound's 32 hold.
  await_ends(kStreams - kHeld);
  CHECK(ended == kStreams - kHeld);
  CHECK(refused.value() > refused_before);
  // The coordinator's and peers' calls (another connection) are served, and
  // so is another client's save, while the 32 hold.
  auto other = StoreClient::Connect(d->address());
  auto stats = other->Stats();
  REQUIRE(stats.ok());
  REQUIRE(other->Declare("job", {{"w", DType::kFloat32, {4}}}).ok());
  const std::vector<char> bytes(16, 1);
  CHECK(other->Put("job", 1, "w", Region{{0, 4}}, bytes.data(), bytes.size())
            .ok());
  // The refused streams ended with a message that names the bound; the held
  // ones end when their client closes them.
  int held = 0, exhausted = 0, by_bound = 0;
  for (int i = 0; i < kStreams; ++i) {
    const Stream& s = streams[i];
    if (!s.ended) {
      ++held;
      continue;
    }
    CHECK(s.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    ++exhausted;
    if (absl::StrContains(s.status.error_message(),
                          "this connection holds 32 calls")) {
      ++by_bound;
    } else {
      CHECK_THAT(s.status.error_message(),
                 Catch::Contains("Server Threadpool Exhausted"));
    }
  }
  CHECK(exhausted == kStreams - kHeld);
  CHECK(held == kHeld);
  std::vector<int> holding;
  for (int i = 0; i < kStreams; ++i) {
    if (!streams[i].ended) holding.push_back(i);
  }
  for (int i : holding) streams[i].writer->WritesDone(tag(i, 2));
  await_ends(kStreams);
  CHECK(ended == kStreams);
  for (int i : holding) {
    INFO(streams[i].status.error_message());
    CHECK(streams[i].ended);
    CHECK(streams[i].status.error_code() !=
          grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  cq.Shutdown();
  void* got = nullptr;
  bool ok = false;
  while (cq.Next(&got, &ok)) {
  }
  CHECK(by_bound == refused.value() - refused_before);
  CHECK(by_bound > 0);
}

TEST_CASE(
    "service: failures by code are exported from the start, at 0",
    "[tensor_store][service]") {
  auto d = StartDaemon();
  auto stats = d->client->Stats();
  REQUIRE(stats.ok());
  std::set<std::string> names;
  for (const auto& c : stats->counters()) names.insert(c.name());
  for (const char* code : {"INVALID_ARGUMENT", "DATA_LOSS", "INTERNAL",
                           "RESOURCE_EXHAUSTED", "UNAVAILABLE"}) {
    INFO(code);
    CHECK(names.count(absl::StrCat("ptc_store_errors_by_code_total{code=\"",
                                   code, "\"}")) == 1);
  }
}

TEST_CASE(
    "tensor store: a hollow daemon's reads stand for bytes they do not carry, "
    "and only a hollow reader takes them",
    "[tensor_store][service]") {
  TensorStoreServerOptions options;
  options.hollow = true;
  auto server = TensorStoreServer::Start(options);
  REQUIRE(server.ok());
  auto client =
      StoreClient::Connect(absl::StrCat("127.0.0.1:", (*server)->port()));
  const Shape shape = {8, 8};
  const Region top{{0, 4}, {0, 8}};
  REQUIRE(client->Declare("job", {{"w", DType::kFloat32, shape}}).ok());
  // A put's bytes are counted and dropped; the region's checksum is its
  // hollow fingerprint.
  std::vector<char> bytes(top.volume() * 4, 9);
  auto sum = client->Put("job", 1, "w", top, bytes.data(), bytes.size());
  REQUIRE(sum.ok());
  CHECK(*sum == HollowFingerprint(top, shape, 4));
  // A real reader refuses the read.
  const absl::Status real =
      client->Read("job", 1, "w", top, bytes.data(), bytes.size());
  CHECK(real.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(real.message(), "hollow ptcd"));
  // A hollow reader is told how many bytes, with none.
  int calls = 0;
  auto got = client->ReadWith(
      "job", 1, "w", top,
      [&](int64_t offset, const char* data, int64_t n) {
        ++calls;
        CHECK(offset == 0);
        CHECK(data == nullptr);
        CHECK(n == top.volume() * 4);
      },
      0, absl::ZeroDuration(), /*hollow=*/true);
  REQUIRE(got.ok());
  CHECK(*got == top.volume() * 4);
  CHECK(calls == 1);
}

}  // namespace
}  // namespace ptc
