// The UCX transport against a real ptcd (store + transformer service):
// the source sends every part (as it is where it is one span of stored
// memory, packed otherwise), stale epochs refused. AutoTransport's fallback: a
// piece whose UCX transfer breaks part-way is fetched again over gRPC (the
// same staged bytes rewritten, nothing lost), and that peer uses gRPC from
// then on; a stale epoch is final.
#include "state_transformer/ucx_transport.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "ptc/fingerprint.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/testing.h"
#include "tests/testing.h"

namespace ptc {
namespace {

// Stands in for a UCX connection that breaks: it delivers the first half of
// a piece (read from the real peer over gRPC) and then fails with `error`.
class BreaksHalfway : public PieceTransport {
 public:
  BreaksHalfway(PieceTransport* real, absl::Status error)
      : real_(real), error_(std::move(error)) {}
  absl::Status Fetch(int32_t host, const std::string& job, int64_t version,
                     const std::string& tensor, const Region& region,
                     int64_t element_size,
                     const StoreClient::Consumer& consume) override {
    ++calls;
    const int64_t half = region.volume() * element_size / 2;
    absl::Status s =
        real_->Fetch(host, job, version, tensor, region, element_size,
                     [&](int64_t off, const char* data, int64_t n) {
                       if (off < half)
                         consume(off, data, std::min(n, half - off));
                     });
    return s.ok() ? error_ : s;
  }
  absl::StatusOr<std::string> FetchSmallObject(int32_t, const std::string&,
                                               int64_t, const std::string&,
                                               int32_t) override {
    return absl::InternalError("small objects go over gRPC");
  }
  int calls = 0;

 private:
  PieceTransport* real_;
  absl::Status error_;
};

constexpr int64_t kRows = 256, kCols = 1024;  // 1 MiB of fp32

std::unique_ptr<testing::Daemon> DaemonWithRegion() {
  auto d = testing::StartDaemon();
  REQUIRE(
      d->client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  std::vector<char> bytes(kRows * kCols * 4);
  testing::FillPattern(11, 0, bytes.data(), bytes.size());
  REQUIRE(d->client
              ->Put("job", 1, "w", Region{{0, kRows}, {0, kCols}}, bytes.data(),
                    bytes.size())
              .ok());
  REQUIRE(d->client->Commit("job", 1).ok());
  return d;
}

// The expected bytes of `r` of the pattern tensor.
std::vector<char> Want(const Region& r) {
  std::vector<char> all(kRows * kCols * 4), want(r.volume() * 4);
  testing::FillPattern(11, 0, all.data(), all.size());
  CopyRegion(all.data(), Region{{0, kRows}, {0, kCols}}, want.data(), r, r, 4);
  return want;
}

// A one-host cluster whose version 1 of "job" stores the pattern tensor as
// two row halves (so pieces can span two stored buffers).
std::unique_ptr<testing::DaemonCluster> ClusterWithHalves() {
  auto c = std::make_unique<testing::DaemonCluster>(1);
  auto& client = c->daemons[0]->client;
  REQUIRE(
      client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  for (const Region& half : {Region{{0, kRows / 2}, {0, kCols}},
                             Region{{kRows / 2, kRows}, {0, kCols}}}) {
    const std::vector<char> bytes = Want(half);
    REQUIRE(client->Put("job", 1, "w", half, bytes.data(), bytes.size()).ok());
  }
  REQUIRE(client->Commit("job", 1).ok());
  return c;
}

// Makes the daemon at `address` see plan `epoch` of "job" the way only the
// coordinator can: a fragment of that epoch (an empty one, staging an empty
// version 1000 + epoch). Peers' calls never move a host's epoch.
void SeeEpoch(const std::string& address, int64_t epoch) {
  auto stub = proto::Transformer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  proto::ExecuteFragmentRequest req;
  req.set_job("job");
  req.set_source_version(1);
  req.set_target_version(1000 + epoch);
  req.set_plan_epoch(epoch);
  grpc::ClientContext ctx;
  auto reader = stub->ExecuteFragment(&ctx, req);
  proto::FragmentProgress progress;
  while (reader->Read(&progress)) {
  }
  REQUIRE(FromGrpcStatus(reader->Finish()).ok());
}

TEST_CASE(
    "ucx transport: the source sends every part; one span lands in place, "
    "others are packed and scattered",
    "[transformer]") {
  auto cluster = ClusterWithHalves();
  UcxPieceTransport transport(1, cluster->addresses);
  const Region whole{{0, kRows}, {0, kCols}};
  // Two staged buffers: the whole tensor, and a block overlapping it that
  // must receive its share by a local copy.
  std::vector<uint8_t> a(whole.volume() * 4, 0);
  const Region block{{100, 200}, {0, 512}};
  std::vector<uint8_t> b(block.volume() * 4, 0);
  const PieceTarget targets[] = {{whole, a.data()}, {block, b.data()}};
  const StoreClient::Consumer refuse = [](int64_t, const char*, int64_t) {
    FAIL("a piece inside staged buffers must be placed, not streamed");
  };
  auto as_chars = [](const std::vector<uint8_t>& v, const Region& in,
                     const Region& r) {
    std::vector<char> out(r.volume() * 4);
    CopyRegion(v.data(), in, out.data(), r, r, 4);
    return out;
  };
  // `piece` holds the right bytes in both staged buffers.
  auto check_placed = [&](const Region& piece) {
    CHECK(as_chars(a, whole, piece) == Want(piece));
    const Region in_block = block.Intersect(piece);
    if (!in_block.empty()) {
      CHECK(as_chars(b, block, in_block) == Want(in_block));
    }
  };
  // Fetches `piece` into the staged buffers and checks it landed.
  auto fetch = [&](const Region& piece) {
    REQUIRE(
        transport.FetchInto(0, "job", 1, "w", piece, 4, targets, refuse).ok());
    check_placed(piece);
  };

  SECTION(
      "rows spanning both stored halves: two parts, each one span of "
      "stored memory, sent as it is and received in place") {
    const Region piece{{64, 192}, {0, kCols}};
    fetch(piece);
    // Nothing outside the piece was touched.
    const Region above{{0, 64}, {0, kCols}};
    CHECK(as_chars(a, whole, above) ==
          std::vector<char>(above.volume() * 4, 0));
  }

  SECTION("a narrow column slice (2 KiB runs): packed at the source") {
    const Region piece{{0, kRows}, {256, 768}};
    fetch(piece);
    const Region left{{0, kRows}, {0, 256}};
    CHECK(as_chars(a, whole, left) == std::vector<char>(left.volume() * 4, 0));
  }

  SECTION(
      "a batch: placed, scattered and streamed pieces from one peer in one "
      "call") {
    const Region rows{{0, 40}, {0, kCols}};     // sent, in place
    const Region slice{{40, 200}, {0, 256}};    // sent packed, scattered
    const Region wide{{200, kRows}, {0, 700}};  // across both halves
    const Region loose{{10, 20}, {100, 300}};   // no target: streamed
    std::vector<char> streamed(loose.volume() * 4, 0);
    const StoreClient::Consumer stream = [&](int64_t off, const char* data,
                                             int64_t n) {
      std::memcpy(streamed.data() + off, data, n);
    };
    const std::string w = "w";
    const PieceTransport::BatchPiece batch[] = {
        {&w, rows, 4, targets, &refuse},
        {&w, slice, 4, targets, &refuse},
        {&w, wide, 4, targets, &refuse},
        {&w, loose, 4, {}, &stream}};
    REQUIRE(transport.FetchBatch(0, "job", 1, batch).ok());
    for (const Region& r : {rows, slice, wide}) check_placed(r);
    CHECK(streamed == Want(loose));
  }

  SECTION("a piece spanning two staged buffers lands in each") {
    const Region top{{0, kRows / 2}, {0, kCols}};
    const Region bottom{{kRows / 2, kRows}, {0, kCols}};
    std::vector<uint8_t> t(top.volume() * 4, 0), u(bottom.volume() * 4, 0);
    const PieceTarget halves[] = {{top, t.data()}, {bottom, u.data()}};
    const Region piece{{100, kRows - 100}, {128, 640}};
    REQUIRE(
        transport.FetchInto(0, "job", 1, "w", piece, 4, halves, refuse).ok());
    CHECK(as_chars(t, top, top.Intersect(piece)) == Want(top.Intersect(piece)));
    CHECK(as_chars(u, bottom, bottom.Intersect(piece)) ==
          Want(bottom.Intersect(piece)));
  }

  SECTION(
      "staged buffers that overlap and leave a gap in the piece: it is "
      "streamed, not half placed") {
    const Region top{{0, 100}, {0, kCols}}, middle{{50, 150}, {0, kCols}};
    std::vector<uint8_t> t(top.volume() * 4, 0), m(middle.volume() * 4, 0);
    const PieceTarget overlapping[] = {{top, t.data()}, {middle, m.data()}};
    const Region piece{{0, 200}, {0, kCols}};  // rows 150-200 in neither
    std::vector<char> streamed(piece.volume() * 4, 0);
    REQUIRE(transport
                .FetchInto(0, "job", 1, "w", piece, 4, overlapping,
                           [&](int64_t off, const char* data, int64_t n) {
                             std::memcpy(streamed.data() + off, data, n);
                           })
                .ok());
    CHECK(streamed == Want(piece));
  }

  SECTION("a plan epoch older than the host has seen is refused") {
    UcxPieceTransport newer(7, cluster->addresses);
    const Region piece{{0, 8}, {0, kCols}};
    // A peer's call does not move the host's epoch; a fragment does.
    REQUIRE(transport.FetchInto(0, "job", 1, "w", piece, 4, targets, refuse)
                .ok());
    SeeEpoch(cluster->addresses.at(0), 7);
    REQUIRE(newer.FetchInto(0, "job", 1, "w", piece, 4, targets, refuse).ok());
    const absl::Status s =
        transport.FetchInto(0, "job", 1, "w", piece, 4, targets, refuse);
    CHECK(s.code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(s.message()), Catch::Contains("stale"));
  }

  SECTION("a version the peer does not have is a clear error") {
    const absl::Status s = transport.FetchInto(
        0, "job", 9, "w", Region{{0, 8}, {0, kCols}}, 4, targets, refuse);
    CHECK(s.code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(s.message()), Catch::Contains("host 0"));
  }
}

TEST_CASE(
    "ucx transport: a later transport pulls with the workers an earlier one "
    "left idle, so its source checks no new address",
    "[transformer]") {
  auto cluster = ClusterWithHalves();
  const Region whole{{0, kRows}, {0, kCols}};
  std::vector<uint8_t> a(whole.volume() * 4, 0);
  const PieceTarget targets[] = {{whole, a.data()}};
  const StoreClient::Consumer refuse = [](int64_t, const char*, int64_t) {
    FAIL("a piece inside the staged buffer must be placed, not streamed");
  };
  Counter& checks = GetCounter("ptc_transformer_ucx_address_checks_total");
  const Region piece{{0, 64}, {0, kCols}};
  {
    UcxPieceTransport first(1, cluster->addresses);
    REQUIRE(first.FetchInto(0, "job", 1, "w", piece, 4, targets, refuse).ok());
  }
  const int64_t before = checks.value();
  // The next change's fragment: a transport of its own (a later epoch).
  SeeEpoch(cluster->addresses.at(0), 2);
  UcxPieceTransport second(2, cluster->addresses);
  const Region next{{64, kRows}, {0, kCols}};
  REQUIRE(second.FetchInto(0, "job", 1, "w", next, 4, targets, refuse).ok());
  CHECK(checks.value() == before);  // a new worker's address is one more
  std::vector<char> got(whole.volume() * 4);
  std::memcpy(got.data(), a.data(), got.size());
  CHECK(got == Want(whole));
}

TEST_CASE(
    "ucx transport: what lands in a staged buffer is added up as it lands: "
    "its fingerprint (and its checksum, from one whole part) need no second "
    "read",
    "[transformer]") {
  auto cluster = ClusterWithHalves();
  UcxPieceTransport transport(1, cluster->addresses);
  const Region whole{{0, kRows}, {0, kCols}};
  const std::vector<int64_t> shape = {kRows, kCols};
  const std::vector<char> all = Want(whole);
  std::vector<uint8_t> a(whole.volume() * 4, 0);
  const Region block{{100, 200}, {0, 512}};
  std::vector<uint8_t> b(block.volume() * 4, 0);
  StagedSums sa, sb;
  const PieceTarget targets[] = {{whole, a.data(), &sa, shape},
                                 {block, b.data(), &sb, shape}};
  const StoreClient::Consumer refuse = [](int64_t, const char*, int64_t) {
    FAIL("a piece inside staged buffers must be placed, not streamed");
  };
  const std::string w = "w";

  SECTION("four pieces that tile it: in place, packed and scattered") {
    const Region pieces[] = {
        Region{{0, 40}, {0, kCols}}, Region{{40, 200}, {0, 256}},
        Region{{40, 200}, {256, kCols}}, Region{{200, kRows}, {0, kCols}}};
    for (const Region& piece : pieces) {
      const PieceTransport::BatchPiece batch[] = {
          {&w, piece, 4, targets, &refuse}};
      REQUIRE(transport.FetchBatch(0, "job", 1, batch).ok());
    }
    REQUIRE(sa.Whole(whole.volume()).has_value());
    CHECK(*sa.Whole(whole.volume()) ==
          FingerprintRegion(all.data(), whole, whole, shape, 4));
    // No part was the whole buffer: its checksum is taken when it is sealed.
    CHECK(!sa.WholeChecksum(whole.volume()).has_value());
    // The overlapping block got its share by copies from the whole one.
    CHECK(sb.Whole(block.volume()) ==
          FingerprintRegion(all.data(), whole, block, shape, 4));
  }

  SECTION("one piece, the whole buffer: its part's checksum is the buffer's") {
    const PieceTransport::BatchPiece batch[] = {
        {&w, whole, 4, targets, &refuse}};
    REQUIRE(transport.FetchBatch(0, "job", 1, batch).ok());
    CHECK(sa.Whole(whole.volume()) ==
          FingerprintRegion(all.data(), whole, whole, shape, 4));
    CHECK(sa.WholeChecksum(whole.volume()) == Checksum(all.data(), all.size()));
  }

  SECTION("a piece fetched twice is not a whole buffer's fingerprint") {
    const Region top{{0, 128}, {0, kCols}}, bottom{{128, kRows}, {0, kCols}};
    for (const Region& piece : {top, top, bottom}) {
      const PieceTransport::BatchPiece batch[] = {
          {&w, piece, 4, targets, &refuse}};
      REQUIRE(transport.FetchBatch(0, "job", 1, batch).ok());
    }
    CHECK(!sa.Whole(whole.volume()).has_value());
  }
}

TEST_CASE(
    "auto transport: a UCX transfer that breaks part-way is redone over "
    "gRPC, and the peer stays on gRPC",
    "[transformer]") {
  auto d = DaemonWithRegion();
  const std::map<int32_t, std::string> peers = {{1, d->address()}};
  GrpcPieceTransport probe(peers);
  auto broken = std::make_unique<BreaksHalfway>(
      &probe, absl::UnavailableError("UCX endpoint closed by peer"));
  BreaksHalfway* ucx = broken.get();
  AutoTransport transport(std::move(broken),
                          std::make_unique<GrpcPieceTransport>(peers));
  const Region r{{16, 80}, {256, 768}};  // a column slice: packed at source
  std::vector<char> got(r.volume() * 4, 0);
  std::vector<char> want(got.size());
  {
    std::vector<char> all(kRows * kCols * 4);
    testing::FillPattern(11, 0, all.data(), all.size());
    CopyRegion(all.data(), Region{{0, kRows}, {0, kCols}}, want.data(), r, r,
               4);
  }
  auto write = [&](int64_t off, const char* data, int64_t n) {
    std::memcpy(got.data() + off, data, n);
  };
  REQUIRE(transport.Fetch(1, "job", 1, "w", r, 4, write).ok());
  CHECK(got == want);
  CHECK(ucx->calls == 1);
  // The next piece from that peer goes straight to gRPC.
  std::fill(got.begin(), got.end(), 0);
  REQUIRE(transport.Fetch(1, "job", 1, "w", r, 4, write).ok());
  CHECK(got == want);
  CHECK(ucx->calls == 1);
}

TEST_CASE("auto transport: a stale plan epoch is final, not retried",
          "[transformer]") {
  auto d = DaemonWithRegion();
  const std::map<int32_t, std::string> peers = {{1, d->address()}};
  GrpcPieceTransport probe(peers);
  AutoTransport transport(
      std::make_unique<BreaksHalfway>(
          &probe, absl::AbortedError("plan epoch 3 is stale; newest is 4")),
      std::make_unique<GrpcPieceTransport>(peers));
  const Region r{{0, 4}, {0, kCols}};
  const absl::Status s = transport.Fetch(1, "job", 1, "w", r, 4,
                                         [](int64_t, const char*, int64_t) {});
  CHECK(s.code() == absl::StatusCode::kAborted);
}

TEST_CASE(
    "transformer service: SendParts refuses bad requests "
    "with clear errors",
    "[transformer]") {
  auto cluster = ClusterWithHalves();
  auto stub = proto::Transformer::NewStub(grpc::CreateChannel(
      cluster->addresses.at(0), grpc::InsecureChannelCredentials()));
  auto worker = UcxWorker::Create(/*serve=*/false);
  REQUIRE(worker.ok());
  auto send = [&](const proto::SendPartsRequest& req) {
    grpc::ClientContext ctx;
    proto::SendPartsResponse resp;
    return FromGrpcStatus(stub->SendParts(&ctx, req, &resp));
  };
  auto request = [&](int64_t epoch) {
    proto::SendPartsRequest req;
    req.set_job("job");
    req.set_version(1);
    req.set_plan_epoch(epoch);
    req.set_ucx_address((*worker)->address());
    return req;
  };
  auto add = [](proto::SendPartsRequest* req, const Region& r, int64_t first,
                int64_t count) {
    proto::PartToSend* p = req->add_parts();
    p->set_tensor("w");
    RegionToProto(r, p->mutable_region());
    p->set_first(first);
    p->set_count(count);
    p->set_tag(1);
  };
  const Region rows{{0, 8}, {0, kCols}};

  SECTION("a part outside its region") {
    auto req = request(1);
    add(&req, rows, 8 * kCols - 4, 5);
    const absl::Status s = send(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("outside region"));
  }
  SECTION("too many parts in one call") {
    auto req = request(1);
    for (int i = 0; i <= kMaxPartsPerCall; ++i) add(&req, rows, 0, 1);
    const absl::Status s = send(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("at most 4096"));
  }
  SECTION("more bytes than one call may send") {
    auto req = request(1);
    const Region whole{{0, kRows}, {0, kCols}};  // 1 MiB each
    for (int64_t i = 0; i <= kMaxSendPartsBytes / (1 << 20); ++i)
      add(&req, whole, 0, whole.volume());
    const absl::Status s = send(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("split the request"));
  }
  SECTION("no worker address to send to") {
    auto req = request(1);
    add(&req, rows, 0, 1);
    req.clear_ucx_address();
    const absl::Status s = send(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("address"));
  }
  SECTION("a worker address that is not one (ptcd must not abort)") {
    for (const std::string& junk :
         {std::string(300, 'x'), std::string("\x20short", 6)}) {
      auto req = request(1);
      add(&req, rows, 0, 1);
      req.set_ucx_address(junk);
      const absl::Status s = send(req);
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()),
                 Catch::Contains("UCX worker address"));
    }
  }
  SECTION("an unknown tensor, job or version") {
    auto req = request(1);
    add(&req, rows, 0, 1);
    req.mutable_parts(0)->set_tensor("nope");
    CHECK(send(req).code() == absl::StatusCode::kNotFound);
    req = request(1);
    add(&req, rows, 0, 1);
    req.set_version(5);
    CHECK(send(req).code() == absl::StatusCode::kNotFound);
  }
  SECTION("a stale plan epoch, and an epoch that is not positive") {
    SeeEpoch(cluster->addresses.at(0), 9);
    REQUIRE(send(request(9)).ok());
    auto req = request(3);
    add(&req, rows, 0, 1);
    const absl::Status s = send(req);
    CHECK(s.code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(s.message()), Catch::Contains("stale"));
    CHECK(send(request(0)).code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ptc
