// Requests an attacker (or a broken coordinator) could send a ptcd's state
// transformer: each gets a clear error, the daemon stays up, its staged and
// committed versions and its memory accounting stay exact, and the next
// honest request works.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "plan/piece.h"
#include "proto/transformer.grpc.pb.h"
#include "ptc/region_proto.h"
#include "ptc/small_object.h"
#include "state_transformer/ucx_worker.h"
#include "tensor_store/internal/testing.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr int64_t kRows = 64, kCols = 256;  // 64 KiB of fp32

// A one-host cluster whose committed version 1 of "job" holds tensor "w".
std::unique_ptr<testing::DaemonCluster> Cluster() {
  auto c = std::make_unique<testing::DaemonCluster>(1);
  auto& client = c->daemons[0]->client;
  REQUIRE(
      client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  std::vector<char> bytes(kRows * kCols * 4);
  testing::FillPattern(5, 0, bytes.data(), bytes.size());
  REQUIRE(client
              ->Put("job", 1, "w", Region{{0, kRows}, {0, kCols}}, bytes.data(),
                    bytes.size())
              .ok());
  REQUIRE(client->Commit("job", 1).ok());
  return c;
}

proto::Region ToProto(const Region& r) {
  proto::Region out;
  RegionToProto(r, &out);
  return out;
}

// A fragment for host 0 that builds `version` of "job" from version 1: it
// holds `hold` of "w", filled by `pieces` from `source` (0: itself).
proto::ExecuteFragmentRequest Fragment(int64_t version, int64_t epoch,
                                       const Region& hold,
                                       const std::vector<Region>& pieces,
                                       int32_t source = 0) {
  proto::ExecuteFragmentRequest req;
  req.set_job("job");
  req.set_source_version(1);
  req.set_target_version(version);
  req.set_plan_epoch(epoch);
  req.set_host(0);
  proto::TensorDecl* d = req.add_tensors();
  d->set_key("w");
  d->set_dtype("fp32");
  d->add_shape(kRows);
  d->add_shape(kCols);
  proto::HostFragment* f = req.mutable_fragment();
  f->set_host(0);
  proto::HeldRegion* h = f->add_holds();
  h->set_tensor(0);
  *h->mutable_region() = ToProto(hold);
  for (const Region& p : pieces) {
    proto::Transfer* x = f->add_transfers();
    x->set_tensor(0);
    *x->mutable_region() = ToProto(p);
    x->set_source_host(source);
    x->set_target_host(0);
    x->set_target_rank(-1);
  }
  return req;
}

struct Transformer {
  explicit Transformer(const std::string& address)
      : stub(proto::Transformer::NewStub(grpc::CreateChannel(
            address, grpc::InsecureChannelCredentials()))) {}

  absl::Status Execute(const proto::ExecuteFragmentRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    auto reader = stub->ExecuteFragment(&ctx, req);
    proto::FragmentProgress p;
    while (reader->Read(&p)) {
    }
    return FromGrpcStatus(reader->Finish());
  }
  absl::Status Abort(int64_t version, int64_t epoch) {
    grpc::ClientContext ctx;
    proto::AbortStagedRequest req;
    req.set_job("job");
    req.set_version(version);
    req.set_plan_epoch(epoch);
    proto::AbortStagedResponse resp;
    return FromGrpcStatus(stub->AbortStaged(&ctx, req, &resp));
  }
  absl::Status Commit(int64_t version, int64_t epoch) {
    grpc::ClientContext ctx;
    proto::CommitStagedRequest req;
    req.set_job("job");
    req.set_version(version);
    req.set_plan_epoch(epoch);
    proto::CommitStagedResponse resp;
    return FromGrpcStatus(stub->CommitStaged(&ctx, req, &resp));
  }

  std::unique_ptr<proto::Transformer::Stub> stub;
};

// The daemon is up, holds only the committed version 1, and accounts for
// exactly its bytes.
void RequireHealthy(testing::DaemonCluster& c) {
  auto list = c.daemons[0]->client->List("job");
  REQUIRE(list.ok());
  REQUIRE(list->jobs_size() == 1);
  REQUIRE(list->jobs(0).versions_size() == 1);
  CHECK(list->jobs(0).versions(0).version() == 1);
  auto stats = c.daemons[0]->client->Stats();
  REQUIRE(stats.ok());
  CHECK(testing::DataBytesUsed(*stats) == kRows * kCols * 4);
}

const Region kAll{{0, kRows}, {0, kCols}};

TEST_CASE("hostile fragments are refused and leave the daemon healthy",
          "[transformer][hostile]") {
  auto c = Cluster();
  Transformer t(c->addresses.at(0));

  SECTION("a piece of another rank than its tensor (was an assertion abort)") {
    const absl::Status s =
        t.Execute(Fragment(2, 1, kAll, {kAll, Region{{0, 4}}}));
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("has rank 1 but the tensor has rank 2"));
  }
  SECTION("a piece far outside its tensor, over UCX and over gRPC") {
    for (const proto::Transport transport :
         {proto::TRANSPORT_UCX, proto::TRANSPORT_GRPC, proto::TRANSPORT_AUTO}) {
      auto req = Fragment(2, 1, kAll,
                          {kAll, Region{{0, int64_t{1} << 40}, {0, kCols}}}, 1);
      req.set_transport(transport);
      (*req.mutable_peers())[1] = c->addresses.at(0);
      const absl::Status s = t.Execute(req);
      INFO(proto::Transport_Name(transport) << ": " << s.ToString());
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()), Catch::Contains("out of bounds"));
    }
  }
  SECTION("a held region no piece fills (would be published as zeros)") {
    const absl::Status s =
        t.Execute(Fragment(2, 1, kAll, {Region{{0, kRows / 2}, {0, kCols}}}));
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("no piece fills"));
  }
  SECTION("a held region outside its tensor") {
    const Region big{{0, kRows + 1}, {0, kCols}};
    const absl::Status s = t.Execute(Fragment(2, 1, big, {big}));
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("an unknown tensor id") {
    auto req = Fragment(2, 1, kAll, {kAll});
    req.mutable_fragment()->mutable_transfers(0)->set_tensor(7);
    const absl::Status s = t.Execute(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("unknown tensor id 7"));
  }
  SECTION("parallel pulls of 2^31-1 (was a thread each)") {
    for (int pulls : {std::numeric_limits<int32_t>::max(), -1}) {
      auto req = Fragment(2, 1, kAll, {kAll});
      req.set_parallel_pulls(pulls);
      const absl::Status s = t.Execute(req);
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()), Catch::Contains("parallel pulls"));
    }
  }
  SECTION("a peer timeout out of range") {
    for (int64_t ms : {int64_t{-1}, int64_t{3600} * 1000 + 1}) {
      auto req = Fragment(2, 1, kAll, {kAll});
      req.set_peer_timeout_ms(ms);
      const absl::Status s = t.Execute(req);
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()), Catch::Contains("peer timeout"));
    }
  }
  SECTION("a source that never answers is given up after the peer timeout") {
    // A port that accepts connections and never speaks: each transport's
    // pull waits on it until its deadline, which follows the fragment's
    // peer timeout (the coordinator's host timeout), not a fixed minute.
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
            0);
    REQUIRE(listen(listener, 16) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) ==
            0);
    for (const proto::Transport transport :
         {proto::TRANSPORT_GRPC, proto::TRANSPORT_UCX}) {
      auto req = Fragment(2, 1, kAll, {kAll}, 1);
      req.set_transport(transport);
      req.set_peer_timeout_ms(500);
      (*req.mutable_peers())[1] =
          absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
      const absl::Time start = absl::Now();
      const absl::Status s = t.Execute(req);
      const absl::Duration took = absl::Now() - start;
      INFO(proto::Transport_Name(transport) << ": " << s.ToString() << " after "
                                            << absl::FormatDuration(took));
      if (s.code() == absl::StatusCode::kFailedPrecondition) continue;  // no UCX
      CHECK_FALSE(s.ok());
      CHECK(took < absl::Seconds(5));  // 0.5 s and the bytes at 1 MB/s
    }
    close(listener);
  }
  SECTION("a small object from the coordinator's copy: none, or too large") {
    auto req = Fragment(2, 1, kAll, {kAll});
    proto::SmallObjectMove* m = req.add_small_objects();
    m->set_name("step");
    m->set_source_host(kFromCoordinator);
    m->set_target_host(req.host());
    absl::Status s = t.Execute(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("none is attached"));
    m->set_has_kept(true);
    m->set_kept(std::string(kMaxSmallObjectBytes + 1, 'x'));
    s = t.Execute(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("comes with a kept copy"));
  }
  SECTION("a shape whose element count overflows int64") {
    auto req = Fragment(2, 1, kAll, {kAll});
    proto::TensorDecl* d = req.add_tensors();
    d->set_key("huge");
    d->set_dtype("fp32");
    for (int i = 0; i < 3; ++i) d->add_shape(int64_t{1} << 40);
    const absl::Status s = t.Execute(req);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("larger than 2^50"));
  }
  RequireHealthy(*c);

  // The honest fragment after all that.
  REQUIRE(t.Execute(Fragment(2, 1, kAll, {kAll})).ok());
  REQUIRE(t.Commit(2, 1).ok());
}

TEST_CASE(
    "an abort for an epoch far ahead fences only that epoch, not the job's "
    "next plans",
    "[transformer][hostile]") {
  auto c = Cluster();
  Transformer t(c->addresses.at(0));
  REQUIRE(t.Abort(2, std::numeric_limits<int64_t>::max()).ok());
  REQUIRE(t.Abort(2, 3).ok());
  // The aborted epoch itself is fenced: its fragment arriving late is
  // refused.
  CHECK(t.Execute(Fragment(2, 3, kAll, {kAll})).code() ==
        absl::StatusCode::kAborted);
  RequireHealthy(*c);
  // Another epoch goes through (it was fenced until the daemon restarted).
  REQUIRE(t.Execute(Fragment(2, 4, kAll, {kAll})).ok());
  REQUIRE(t.Commit(2, 4).ok());
  // Older epochs are stale now.
  CHECK(t.Execute(Fragment(3, 2, kAll, {kAll})).code() ==
        absl::StatusCode::kAborted);
}

// A raw UCX peer with one-sided operations: what an attacker on the
// fabric runs once it has a worker address (a host admitted to some plan
// epoch once gets it).
class RawUcxPeer {
 public:
  RawUcxPeer() {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG;
    ucp_config_t* config;
    REQUIRE(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
    REQUIRE(ucp_init(&params, config, &context_) == UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wp = {};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    REQUIRE(ucp_worker_create(context_, &wp, &worker_) == UCS_OK);
  }
  ~RawUcxPeer() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
    if (ep_ != nullptr) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep_, &p);
      Wait(r);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  // This worker's address, for a peer to send to (it never receives).
  std::string Address() {
    ucp_address_t* a = nullptr;
    size_t n = 0;
    REQUIRE(ucp_worker_get_address(worker_, &a, &n) == UCS_OK);
    std::string out(reinterpret_cast<const char*>(a), n);
    ucp_worker_release_address(worker_, a);
    return out;
  }

  // Connects to the worker at `peer` with a key of this peer's own memory:
  // well-formed, but not one the daemon made (as a key of memory the
  // daemon has since let go would be). False if UCX refuses.
  bool Connect(const std::string& peer) {
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    if (ucp_ep_create(worker_, &ep, &ep_) != UCS_OK) return false;
    ucp_mem_map_params_t mp = {};
    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = own_.data();
    mp.length = own_.size();
    if (ucp_mem_map(context_, &mp, &memh_) != UCS_OK) return false;
    void* packed = nullptr;
    size_t size = 0;
    if (ucp_rkey_pack(context_, memh_, &packed, &size) != UCS_OK) return false;
    const bool unpacked = ucp_ep_rkey_unpack(ep_, packed, &rkey_) == UCS_OK;
    ucp_rkey_buffer_release(packed);
    return unpacked;
  }

  // A get (or put) of `n` bytes at `remote` in the peer's memory, driven
  // for up to `wait`: OK if it completed, its error, or UCS_INPROGRESS if
  // it is still pending (left to the endpoint's forced close).
  ucs_status_t Rma(bool put, void* local, uint64_t remote, size_t n,
                   absl::Duration wait) {
    ucp_request_param_t p = {};
    void* r = put ? ucp_put_nbx(ep_, local, n, remote, rkey_, &p)
                  : ucp_get_nbx(ep_, local, n, remote, rkey_, &p);
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    if (put && r == nullptr) r = ucp_ep_flush_nbx(ep_, &p);  // reach the peer
    return Wait(r, wait);
  }

 private:
  ucs_status_t Wait(void* r, absl::Duration wait = absl::Seconds(10)) {
    if (r == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    const absl::Time deadline = absl::Now() + wait;
    ucs_status_t s;
    while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r);
    return s;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  std::vector<char> own_ = std::vector<char>(4096);
};

TEST_CASE(
    "no UCX peer reads or writes a daemon's memory with one-sided "
    "operations, whatever key and address it uses",
    "[transformer][hostile]") {
  auto c = Cluster();
  Transformer t(c->addresses.at(0));
  {
    // Nothing of the store is exposed for reads.
    grpc::ClientContext ctx;
    proto::ExposePiecesRequest req;
    req.set_job("job");
    req.set_version(1);
    req.set_plan_epoch(1);
    proto::PieceRef* piece = req.add_pieces();
    piece->set_tensor("w");
    *piece->mutable_region() = ToProto(kAll);
    proto::ExposePiecesResponse resp;
    CHECK(FromGrpcStatus(t.stub->ExposePieces(&ctx, req, &resp)).code() ==
          absl::StatusCode::kUnimplemented);
  }
  // A worker as ptcd's (this process is its daemon), and memory of the
  // process that was never offered to anyone. Before ptcd's workers gave
  // up one-sided operations, UCX served this get and put in software:
  // the get returned the secret and the put changed the canary, with a
  // key the daemon never made; after a dropped exposure, such gets
  // crashed ptcd.
  auto daemon = UcxWorker::Create(/*serve=*/true);
  REQUIRE(daemon.ok());
  std::vector<char> secret(64, '\x5a'), canary(64, '\x11');
  {
    RawUcxPeer attacker;
    if (attacker.Connect((*daemon)->address())) {
      std::vector<char> got(64, 0);
      const ucs_status_t get = attacker.Rma(
          /*put=*/false, got.data(), reinterpret_cast<uint64_t>(secret.data()),
          got.size(), absl::Seconds(2));
      INFO("the get: " << ucs_status_string(get));
      CHECK(get != UCS_OK);
      CHECK(got == std::vector<char>(64, 0));
      std::vector<char> poison(64, '\x66');
      const ucs_status_t put = attacker.Rma(
          /*put=*/true, poison.data(),
          reinterpret_cast<uint64_t>(canary.data()), poison.size(),
          absl::Seconds(2));
      INFO("the put: " << ucs_status_string(put));
      CHECK(canary == std::vector<char>(64, '\x11'));
    }
  }
  // The worker still serves tagged messages, and the daemon its store.
  auto sender = UcxWorker::Create(/*serve=*/false);
  REQUIRE(sender.ok());
  std::vector<char> in(16, 0);
  const std::vector<char> out(16, '\x7e');
  auto receive = (*daemon)->PostReceive(42, in.data(), in.size());
  REQUIRE(receive.ok());
  REQUIRE((*sender)
              ->Send((*daemon)->address(), {{42, out.data(), out.size()}},
                     absl::Seconds(30))
              .ok());
  REQUIRE((*daemon)->Wait(receive->get(), absl::Seconds(30)).ok());
  CHECK(in == out);
  RequireHealthy(*c);
}

TEST_CASE(
    "a SendParts to a peer that never receives ends when the daemon drains",
    "[transformer][hostile]") {
  // 16 MiB: a rendezvous send, which waits for the receiver forever.
  constexpr int64_t kBigRows = 4096, kBigCols = 1024;
  const Region big{{0, kBigRows}, {0, kBigCols}};
  testing::DaemonCluster c(1);
  auto& client = c.daemons[0]->client;
  REQUIRE(client->Declare("job", {{"w", DType::kFloat32, {kBigRows, kBigCols}}})
              .ok());
  std::vector<char> bytes(kBigRows * kBigCols * 4, 7);
  REQUIRE(client->Put("job", 1, "w", big, bytes.data(), bytes.size()).ok());
  REQUIRE(client->Commit("job", 1).ok());

  RawUcxPeer silent;  // never progresses, never posts a receive
  Transformer t(c.addresses.at(0));
  proto::SendPartsRequest req;
  req.set_job("job");
  req.set_version(1);
  req.set_plan_epoch(1);
  req.set_ucx_address(silent.Address());
  proto::PartToSend* part = req.add_parts();
  part->set_tensor("w");
  *part->mutable_region() = ToProto(big);
  part->set_first(0);
  part->set_count(kBigRows * kBigCols);
  part->set_tag(42);
  absl::Status sent;
  std::thread caller([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(120));
    proto::SendPartsResponse resp;
    sent = FromGrpcStatus(t.stub->SendParts(&ctx, req, &resp));
  });
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time start = absl::Now();
  c.daemons[0]->server->Shutdown(absl::Seconds(1));
  const absl::Duration drained = absl::Now() - start;
  caller.join();
  if (sent.code() == absl::StatusCode::kFailedPrecondition) {
    WARN("this ptcd has no UCX worker: " << sent.message());
    return;
  }
  INFO("SendParts: " << sent.ToString());
  CHECK(!sent.ok());
  // The drain's second, not the send's minute.
  CHECK(drained < absl::Seconds(4));
}

}  // namespace
}  // namespace ptc
