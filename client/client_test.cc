// The client library against a real cluster in process (a coordinator and
// ptcd daemons registered through their agents): save/load round trips
// for every dtype, zero-copy loads, loads after a reconfiguration, and a
// clear error for each misuse.
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/internal/testing.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "proto/coordinator.grpc.pb.h"
#include "tools/internal/synthetic.h"

namespace ptc {
namespace {

using testing::ClientCluster;

constexpr char kModel[] =
    "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8,pad=8";

std::unique_ptr<Client> ConnectRank(ClientCluster& c, const std::string& job,
                                    int rank, int host) {
  auto client = Client::Connect(
      {c.daemons.daemons[host]->socket_path(), c.address, job, rank});
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return std::move(*client);
}

// Every rank of the job, each through the ptcd of the host (hostN) the
// coordinator placed it on.
std::vector<std::unique_ptr<Client>> ConnectAll(ClientCluster& c,
                                                const std::string& job,
                                                int ranks) {
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(c.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::ListJobsRequest req;
  proto::ListJobsResponse resp;
  REQUIRE(stub->ListJobs(&ctx, req, &resp).ok());
  std::vector<std::unique_ptr<Client>> out;
  for (const proto::JobStatus& j : resp.jobs()) {
    if (j.job() != job) continue;
    REQUIRE(j.rank_hosts_size() == ranks);
    for (int r = 0; r < ranks; ++r)
      out.push_back(ConnectRank(c, job, r, std::stoi(j.rank_hosts(r).substr(4))));
  }
  REQUIRE(static_cast<int>(out.size()) == ranks);
  return out;
}

std::string SmallFor(const std::string& name, int rank) {
  return tools::SyntheticSmallObject(name, rank);
}

// Rank c's regions (synthetic values) and small objects into `save`: odd
// regions by copy (Write, checksummed during the copy), even ones filled
// in place (Buffer, checksummed at Commit).
void FillRank(Client& c, Client::Save& save) {
  for (int i = 0; i < static_cast<int>(c.regions().size()); ++i) {
    const RankRegion& r = c.regions()[i];
    if (i % 2 == 1) {
      const std::vector<char> bytes =
          tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
      REQUIRE(save.Write(i, absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(bytes.data()),
                                bytes.size()))
                  .ok());
      continue;
    }
    auto dst = save.Buffer(i);
    REQUIRE(dst.ok());
    REQUIRE(static_cast<int64_t>(dst->size()) == r.bytes);
    tools::FillSynthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype),
                         reinterpret_cast<char*>(dst->data()));
  }
  for (const SmallObjectSpec& o : c.spec().small_objects)
    REQUIRE(save.PutSmallObject(o.name, SmallFor(o.name, c.rank())).ok());
}

// Every rank saves (FillRank) and commits. Returns the version the
// coordinator gave the save of `step`.
int64_t SaveAll(std::vector<std::unique_ptr<Client>>& clients, int64_t step) {
  bool committed = false;
  int64_t version = 0;
  for (auto& c : clients) {
    auto save = c->BeginSave(step);
    REQUIRE(save.ok());
    // Every rank saving one step writes into the same version.
    if (version == 0) version = (*save)->version();
    CHECK((*save)->version() == version);
    CHECK((*save)->step() == step);
    FillRank(*c, **save);
    auto done = (*save)->Commit();
    INFO(done.status().ToString());
    REQUIRE(done.ok());
    committed = *done;
  }
  CHECK(committed);  // the last rank's report committed the version
  for (auto& c : clients) {
    REQUIRE(c->WaitCommitted(version, absl::Seconds(10)).ok());
    CHECK(c->committed_step() == step);
  }
  return version;
}

void CheckLoaded(Client& c, const Client::State& s) {
  for (int i = 0; i < static_cast<int>(c.regions().size()); ++i) {
    const RankRegion& r = c.regions()[i];
    const std::vector<char> want =
        tools::Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
    INFO("rank " << c.rank() << " " << r.key << " " << r.region.ToString());
    // Read through the descriptor, and mapped (zero-copy): the same bytes.
    std::vector<uint8_t> read(want.size());
    REQUIRE(s.Read(i, absl::MakeSpan(read)).ok());
    CHECK(std::memcmp(read.data(), want.data(), want.size()) == 0);
    auto got = s.Region(i);
    REQUIRE(got.ok());
    REQUIRE(got->size() == want.size());
    CHECK(std::memcmp(got->data(), want.data(), want.size()) == 0);
    CHECK(s.Checksum(i) == Checksum(want.data(), want.size()));
  }
}

TEST_CASE("client: every dtype round-trips through save and load, zero-copy",
          "[client]") {
  ClientCluster cluster(2, 2);
  const DType* all = AllDTypes();
  for (int d = 0; d < kNumDTypes; ++d) {
    const std::string dtype(DTypeName(all[d]));
    INFO("dtype " << dtype);
    const std::string job = "j-" + dtype;
    cluster.RegisterJob(job, absl::StrCat(kModel, ",dtype=", dtype),
                        "tp=2,dp=2", {"host0", "host1"});
    auto clients = ConnectAll(cluster, job, 4);
    CHECK(clients[0]->host() == "host0");
    CHECK(clients[3]->host() == "host1");
    CHECK(clients[0]->committed_version() == 0);
    const int64_t version = SaveAll(clients, 5);
    CHECK(version == 1);  // ptc numbers versions; the step is metadata
    std::vector<std::unique_ptr<Client::State>> states;
    for (auto& c : clients) {
      REQUIRE(c->committed_version() == version);
      REQUIRE(c->committed_step() == 5);
      auto s = c->Load();
      INFO(s.status().ToString());
      REQUIRE(s.ok());
      CHECK((*s)->version() == version);
      CheckLoaded(*c, **s);
      for (const SmallObjectSpec& o : c->spec().small_objects)
        CHECK(*(*s)->SmallObject(o.name) == SmallFor(o.name, c->rank()));
      states.push_back(std::move(*s));
    }
    // Ranks 0 and 2 are dp replicas (tp 0) on different hosts, ranks 0 and
    // 1 tp peers on host0: a replicated tensor (the position embedding)
    // maps the very same daemon buffer for both ranks of host0: no copy.
    const int i0 = clients[0]->RegionsOf("embedding.position.weight")[0];
    const int i1 = clients[1]->RegionsOf("embedding.position.weight")[0];
    CHECK(states[0]->Inode(i0) == states[1]->Inode(i1));
    CHECK(states[0]->Region(i0).value().data() != nullptr);
    // A GPU runs one job's rank: the next dtype's job takes these GPUs.
    states.clear();
    clients.clear();
    cluster.ForgetJob(job);
  }
}

// The ListJobs calls the (in-process) coordinator has taken.
Counter& ListJobsCalls() {
  return GetCounter(R"(ptc_rpc_calls_total{method="Coordinator.ListJobs"})");
}

// Every rank meets under its layout epoch (each call waits for all).
void MeetAll(std::vector<std::unique_ptr<Client>>& clients) {
  std::vector<absl::StatusOr<std::string>> met(clients.size());
  std::vector<std::thread> meeting;
  for (size_t r = 0; r < clients.size(); ++r) {
    meeting.emplace_back([&, r] {
      met[r] = clients[r]->Rendezvous(clients[r]->layout_epoch(),
                                      r == 0 ? 29500 : 0, absl::Minutes(2));
    });
  }
  for (std::thread& t : meeting) t.join();
  for (const auto& m : met) REQUIRE(m.ok());
}

TEST_CASE(
    "client: ranks that just met under their layout load the version the "
    "meeting named, without asking the coordinator again",
    "[client]") {
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto clients = ConnectAll(cluster, "j", 4);
  const int64_t version = SaveAll(clients, 7);
  MeetAll(clients);
  Counter& lists = ListJobsCalls();
  const int64_t before = lists.value();
  for (auto& c : clients) {
    auto s = c->Load();
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    CHECK((*s)->version() == version);
    CHECK(c->committed_step() == 7);
    CheckLoaded(*c, **s);
  }
  CHECK(lists.value() == before);
  // The meeting's answer serves one load; the next asks.
  REQUIRE(clients[0]->Load().ok());
  CHECK(lists.value() == before + 1);
  // A save after a meeting: the load after it asks, and finds the save.
  MeetAll(clients);
  const int64_t next = SaveAll(clients, 8);
  REQUIRE(next > version);
  auto later = clients[1]->Load();
  REQUIRE(later.ok());
  CHECK((*later)->version() == next);
  // A save open at the meeting could commit before the ranks load: the
  // meeting's answer names no version then, and Load asks.
  auto open = clients[0]->BeginSave(9);
  REQUIRE(open.ok());
  MeetAll(clients);
  const int64_t asked = lists.value();
  REQUIRE(clients[3]->Load().ok());
  CHECK(lists.value() == asked + 1);
}

TEST_CASE(
    "client: after a change a live process takes the rank on its GPU and "
    "the new layout from one answer",
    "[client]") {
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto clients = ConnectAll(cluster, "j", 4);
  const int64_t saved = SaveAll(clients, 1);
  // The job shrinks onto host1's two GPUs.
  REQUIRE(cluster.Reconfigure("j", "tp=2,dp=1", {"host1"}).ok());
  Counter& lists = ListJobsCalls();
  std::set<int> taken;
  for (auto& c : clients) {
    const int old = c->rank();
    const int device = c->device();
    REQUIRE(device >= 0);
    const int64_t before = lists.value();
    auto rank = c->RebindToDevice(device);
    INFO(c->host() << " gpu " << device << ": " << rank.status().ToString());
    REQUIRE(rank.ok());
    CHECK(lists.value() == before + 1);
    if (c->host() == "host1") {
      REQUIRE(*rank >= 0);
      taken.insert(*rank);
      CHECK(c->rank() == *rank);
      CHECK(c->device() == device);
      CHECK(c->config().world_size() == 2);
      CHECK(c->layout_epoch() == 2);
      CHECK(c->committed_version() > saved);
      auto s = c->Load();
      INFO(s.status().ToString());
      REQUIRE(s.ok());
      CheckLoaded(*c, **s);
    } else {
      // No rank on host0 now: the client stays as it was.
      CHECK(*rank == -1);
      CHECK(c->rank() == old);
      CHECK(c->layout_epoch() == 1);
    }
  }
  CHECK(taken == std::set<int>{0, 1});
  CHECK(clients[0]->RebindToDevice(-1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("client: after a reconfiguration each new rank loads its new shards",
          "[client]") {
  ClientCluster cluster(3, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto before = ConnectAll(cluster, "j", 4);
  SaveAll(before, 1);
  REQUIRE(cluster.Reconfigure("j", "tp=1,pp=2,dp=2", {"host1", "host2"}).ok());
  auto after = ConnectAll(cluster, "j", 4);
  for (auto& c : after) {
    CHECK(c->config().ToString() == "tp=1,pp=2,dp=2");
    CHECK(c->committed_version() == 2);
    auto s = c->Load();
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    CheckLoaded(*c, **s);
    // Global objects come from old rank 0; per-tp-rank ones from old tp
    // index 0 (tp' mod 2), dp 0 first: also old rank 0.
    CHECK(*(*s)->SmallObject("iteration") == SmallFor("iteration", 0));
    CHECK(*(*s)->SmallObject("data_cursor") == SmallFor("data_cursor", 0));
    CHECK(*(*s)->SmallObject("rng.model_parallel") ==
          SmallFor("rng.model_parallel", 0));
  }
  // A process of the old layout that still saves is refused, at the start
  // and at its report, and told why; its view cannot load the new layout.
  auto stale = before[0]->BeginSave(9);
  CHECK(stale.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(stale.status().message(),
                          "works under layout epoch 1"));
  CHECK(absl::StrContains(stale.status().message(), "is stale"));
  auto old_load = before[2]->Load();
  CHECK(old_load.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(old_load.status().message(), "changed its layout"));
  // The new ranks save the next step into a new version (the change took
  // version 2; a save can never collide with it).
  CHECK(after[0]->layout_epoch() == 2);
  CHECK(SaveAll(after, 2) == 3);
  // A client of the old config learns the new layout with Refresh, and is
  // told its old rank placement no longer matches.
  const absl::Status moved = before[1]->Refresh();
  CHECK(moved.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(moved.message(),
                          absl::StrCat("placed on host '", after[1]->host(), "'")));
}

TEST_CASE("client: each misuse gets an error that says what to do",
          "[client]") {
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  const std::string sock0 = cluster.daemons.daemons[0]->socket_path();

  auto no_daemon =
      Client::Connect({"/nonexistent/ptcd.sock", cluster.address, "j", 0});
  CHECK(no_daemon.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(no_daemon.status().message(),
                          "cannot connect to ptcd at /nonexistent/ptcd.sock"));

  auto unknown = Client::Connect({sock0, cluster.address, "nope", 0});
  CHECK(unknown.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(unknown.status().message(), "job 'nope' is unknown"));

  auto outside = Client::Connect({sock0, cluster.address, "j", 4});
  CHECK(outside.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(outside.status().message(), "has 4 ranks"));

  auto wrong_host = Client::Connect({sock0, cluster.address, "j", 3});
  CHECK(wrong_host.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(wrong_host.status().message(),
                          "placed on host 'host1'"));

  auto c0 = ConnectRank(cluster, "j", 0, 0);
  auto c1 = ConnectRank(cluster, "j", 1, 0);
  auto nothing = c0->Load();
  CHECK(nothing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(nothing.status().message(), "no committed version"));

  auto save = c0->BeginSave(3);
  REQUIRE(save.ok());
  CHECK((*save)->Buffer(999).status().code() == absl::StatusCode::kOutOfRange);
  const std::vector<uint8_t> short_bytes(3, 7);
  const absl::Status too_short = (*save)->Write(0, short_bytes);
  CHECK(too_short.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(too_short.message(), "bytes but 3 were given"));
  // Written by copy, then changed in place: Commit checksums what is there
  // (the daemon would refuse a stale checksum).
  std::vector<uint8_t> ones(c0->regions()[0].bytes, 1);
  REQUIRE((*save)->Write(0, ones).ok());
  std::memset((*save)->Buffer(0)->data(), 0, ones.size());
  CHECK((*save)->PutSmallObject("rng.cuda", "x").code() ==
        absl::StatusCode::kInvalidArgument);
  auto unwritten = (*save)->Commit();
  CHECK(unwritten.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(unwritten.status().message(), "was not written"));
  for (int i = 0; i < static_cast<int>(c0->regions().size()); ++i)
    REQUIRE((*save)->Buffer(i).ok());
  auto no_small = (*save)->Commit();
  CHECK(no_small.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(no_small.status().message(),
                          "small objects missing: iteration"));
  for (const SmallObjectSpec& o : c0->spec().small_objects)
    REQUIRE((*save)->PutSmallObject(o.name, "s").ok());
  REQUIRE((*save)->Commit().ok());  // zeros: rank 0's copy

  // Rank 1 (same host) saves a replicated tensor with other bytes.
  auto save1 = c1->BeginSave(3);
  REQUIRE(save1.ok());
  for (int i = 0; i < static_cast<int>(c1->regions().size()); ++i) {
    auto dst = (*save1)->Buffer(i);
    REQUIRE(dst.ok());
    std::memset(dst->data(), 1, dst->size());
  }
  for (const SmallObjectSpec& o : c1->spec().small_objects)
    REQUIRE((*save1)->PutSmallObject(o.name, "s").ok());
  auto diverged = (*save1)->Commit();
  CHECK(diverged.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(diverged.status().message(), "replicas diverged"));

  // A negative step.
  CHECK(c0->BeginSave(-1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("client: a version dropped from the host's ptcd is reported gone",
          "[client]") {
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto clients = ConnectAll(cluster, "j", 4);
  SaveAll(clients, 1);
  REQUIRE(cluster.daemons.daemons[0]->client->DeleteVersion("j", 1).ok());
  auto gone = clients[0]->Load();
  CHECK(gone.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(gone.status().message(), "is gone from this host"));
  CHECK(clients[2]->Load().ok());  // host1 still holds it
}

TEST_CASE("client: reports of a save no rank wrote commit nothing",
          "[client][security]") {
  // Every rank "reports" a version it never wrote, straight over gRPC: the
  // coordinator asks every host to prove its share, which they cannot, so
  // the fake version is deleted and the real one stays committed.
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto clients = ConnectAll(cluster, "j", 4);
  const int64_t real = SaveAll(clients, 1);

  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(cluster.address, grpc::InsecureChannelCredentials()));
  auto begin = [&](int rank) {
    grpc::ClientContext ctx;
    proto::BeginSaveRequest req;
    req.set_job("j");
    req.set_rank(rank);
    req.set_layout_epoch(clients[0]->layout_epoch());
    req.set_step(2);
    proto::BeginSaveResponse resp;
    REQUIRE(stub->BeginSave(&ctx, req, &resp).ok());
    return resp.version();
  };
  auto report = [&](int rank, int64_t version) {
    grpc::ClientContext ctx;
    proto::ReportSavedRequest req;
    req.set_job("j");
    req.set_rank(rank);
    req.set_version(version);
    req.set_layout_epoch(clients[0]->layout_epoch());
    proto::ReportSavedResponse resp;
    return FromGrpcStatus(stub->ReportSaved(&ctx, req, &resp));
  };
  // A version that is no save in progress.
  const absl::Status unknown = report(0, real + 100);
  CHECK(unknown.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(unknown.message(), "is not a save in progress"));

  int64_t fake = 0;
  for (int r = 0; r < 4; ++r) fake = begin(r);
  for (int r = 0; r < 3; ++r) REQUIRE(report(r, fake).ok());
  const absl::Status last = report(3, fake);
  INFO(last.ToString());
  CHECK(!last.ok());
  CHECK(absl::StrContains(last.message(), "cannot commit and was deleted"));
  // The job's processes are told, and a wait for it ends at once.
  auto told = clients[1]->FetchEvent();
  REQUIRE(told.ok());
  CHECK(told->dropped_save == fake);
  const absl::Status waited = clients[1]->WaitCommitted(fake, absl::Minutes(5));
  CHECK(waited.code() == absl::StatusCode::kAborted);
  CHECK(
      absl::StrContains(waited.message(), "could not commit and was deleted"));
  REQUIRE(clients[0]->Refresh().ok());
  CHECK(clients[0]->committed_version() == real);
  // The committed state is still whole.
  for (auto& c : clients) {
    auto state = c->Load();
    REQUIRE(state.ok());
    CheckLoaded(*c, **state);
  }
}

TEST_CASE(
    "client: a rank that gives its save up ends its peers' wait, and the "
    "step saves again",
    "[client]") {
  ClientCluster cluster(2, 2);
  cluster.RegisterJob("j", kModel, "tp=2,dp=2", {"host0", "host1"});
  auto clients = ConnectAll(cluster, "j", 4);
  SaveAll(clients, 1);
  // Ranks 0-2 save step 2; rank 3 begins it and cannot finish.
  auto given = clients[3]->BeginSave(2);
  REQUIRE(given.ok());
  const int64_t lost = (*given)->version();
  for (int r = 0; r < 3; ++r) {
    auto save = clients[r]->BeginSave(2);
    REQUIRE(save.ok());
    REQUIRE((*save)->version() == lost);
    FillRank(*clients[r], **save);
    auto done = (*save)->Commit();
    REQUIRE(done.ok());
    CHECK_FALSE(*done);
  }
  absl::Status waited;
  std::thread waiter(
      [&] { waited = clients[0]->WaitCommitted(lost, absl::Minutes(5)); });
  const absl::Time gave_up = absl::Now();
  REQUIRE((*given)->GiveUp("rank 3's ptcd failed (a test)").ok());
  waiter.join();
  // Told, not waiting out its timeout.
  CHECK(absl::Now() - gave_up < absl::Minutes(1));
  CHECK(waited.code() == absl::StatusCode::kAborted);
  auto told = clients[2]->FetchEvent();
  REQUIRE(told.ok());
  CHECK(told->dropped_save == lost);
  CHECK(told->committed_version < lost);
  // Once is enough; the given-up save cannot be committed after.
  CHECK((*given)->GiveUp("again").ok());
  auto late = (*given)->Commit();
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(late.status().message(), "was given up"));
  given->reset();

  // A hostile give-up: a rank outside the job, a stale layout epoch.
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(cluster.address, grpc::InsecureChannelCredentials()));
  auto give_up = [&](int rank, int64_t version, int64_t epoch) {
    grpc::ClientContext ctx;
    proto::ReportSavedRequest req;
    req.set_job("j");
    req.set_rank(rank);
    req.set_version(version);
    req.set_layout_epoch(epoch);
    req.set_failed(std::string(1 << 20, 'x'));
    proto::ReportSavedResponse resp;
    return FromGrpcStatus(stub->ReportSaved(&ctx, req, &resp));
  };
  const int64_t epoch = clients[0]->layout_epoch();
  CHECK(give_up(4, lost, epoch).code() == absl::StatusCode::kInvalidArgument);
  CHECK(give_up(-1, lost, epoch).code() == absl::StatusCode::kInvalidArgument);
  CHECK(give_up(0, lost, epoch + 5).code() ==
        absl::StatusCode::kInvalidArgument);
  // Giving up what is no save in progress changes nothing.
  CHECK(give_up(0, lost + 100, epoch).ok());
  CHECK(clients[2]->FetchEvent()->dropped_save == lost);

  // A rank that has not acted on the deletion yet is refused, rather than
  // given a version only it would write; one that has, is not.
  auto unaware = clients[1]->BeginSave(2, 0, /*known_dropped=*/lost - 1);
  CHECK(unaware.status().code() == absl::StatusCode::kAborted);
  CHECK(absl::StrContains(unaware.status().message(), "was deleted before"));
  {
    auto aware = clients[1]->BeginSave(2, 0, /*known_dropped=*/lost);
    REQUIRE(aware.ok());
    CHECK((*aware)->version() > lost);
  }
  // Every rank saves the step again: a new version, and it commits whole.
  const int64_t again = SaveAll(clients, 2);
  CHECK(again > lost);
  for (auto& c : clients) {
    auto state = c->Load();
    REQUIRE(state.ok());
    CHECK((*state)->version() == again);
    CheckLoaded(*c, **state);
  }
  // A reported save is not given up.
  auto reported = clients[0]->BeginSave(3);
  REQUIRE(reported.ok());
  FillRank(*clients[0], **reported);
  REQUIRE((*reported)->Commit().ok());
  CHECK((*reported)->GiveUp("too late").code() ==
        absl::StatusCode::kFailedPrecondition);
  // A newer save deleted while an older one is still open: a wait for the
  // older one goes on (it can still commit).
  auto newer = clients[1]->BeginSave(4);
  REQUIRE(newer.ok());
  REQUIRE((*newer)->version() > (*reported)->version());
  REQUIRE((*newer)->GiveUp("a test").ok());
  CHECK(clients[2]->FetchEvent()->dropped_save == (*newer)->version());
  CHECK(clients[0]
            ->WaitCommitted((*reported)->version(), absl::Seconds(1))
            .code() == absl::StatusCode::kDeadlineExceeded);
  for (int r = 1; r < 4; ++r) {
    auto save = clients[r]->BeginSave(3);
    REQUIRE(save.ok());
    FillRank(*clients[r], **save);
    REQUIRE((*save)->Commit().ok());
  }
  CHECK(clients[0]
            ->WaitCommitted((*reported)->version(), absl::Seconds(30))
            .ok());
}

}  // namespace
}  // namespace ptc
