// A host's processes reach the coordinator through their ptcd's relay
// (ptcd/coordinator_relay.h): unary calls and Watch streams pass through
// unchanged, errors too; the relay relays the Coordinator service only,
// bounds its calls, and ends the streams in flight when it stops.
#include "ptcd/coordinator_relay.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "coordinator/coordinator_server.h"
#include "proto/coordinator.grpc.pb.h"
#include "tensor_store/local_server.h"
#include "tensor_store/store.h"
#include "tests/testing.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=64,positions=8,pad=8";

// A coordinator (its state: one job, "gpt", on host0) and a relay to it.
struct Relayed {
  explicit Relayed(int max_calls = 1024, int max_calls_per_user = 512) {
    proto::CoordinatorState state = testing::KnownHosts(c, 2);
    auto* j = state.add_jobs();
    j->set_job("gpt");
    j->set_model(kModel);
    j->set_config("tp=1,pp=1,dp=1");
    j->add_hosts("host0");
    REQUIRE(
        WriteFileAtomically(dir.path() + "/state.pb", state.SerializeAsString())
            .ok());
    CoordinatorServerOptions options;
    options.service.state_dir = dir.path();
    options.service.host_timeout = absl::Hours(1);
    auto started = CoordinatorServer::Start(options);
    REQUIRE(started.ok());
    coordinator = std::move(*started);
    address = absl::StrCat("127.0.0.1:", coordinator->port());
    auto r =
        CoordinatorRelay::Start({.socket_path = dir.path() + "/relay.sock",
                                 .coordinator = address,
                                 .max_calls = max_calls,
                                 .max_calls_per_user = max_calls_per_user});
    REQUIRE(r.ok());
    relay = std::move(*r);
    channel = OpenLocalChannel(relay->socket_path(), "");
    stub = proto::Coordinator::NewStub(channel);
  }

  // host0's ptcd as a process finds it: its Hello names this relay and
  // the coordinator the relay leads to.
  LocalServerOptions HostPtcd() const {
    LocalServerOptions options;
    options.socket_path = dir.path() + "/ptcd.sock";
    options.host_name = "host0";
    options.coordinator_relay = relay->socket_path();
    options.coordinator = address;
    return options;
  }

  testing::DaemonCluster c{1};
  testing::TempDir dir;
  std::unique_ptr<CoordinatorServer> coordinator;
  std::string address;
  std::unique_ptr<CoordinatorRelay> relay;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::Coordinator::Stub> stub;
};

// Waits (up to a minute, for a loaded machine) until `relay` has `calls`
// calls in flight.
bool WaitActive(const CoordinatorRelay& relay, int calls) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (relay.active_calls() != calls && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  return relay.active_calls() == calls;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

TEST_CASE(
    "coordinator relay: a process's calls and Watch stream reach the "
    "coordinator through its ptcd, errors unchanged",
    "[ptcd]") {
  Relayed r;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(30));
    proto::ListJobsRequest req;
    req.set_job("gpt");
    proto::ListJobsResponse resp;
    const grpc::Status s = r.stub->ListJobs(&ctx, req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    REQUIRE(resp.jobs_size() == 1);
    CHECK(resp.jobs(0).job() == "gpt");
    CHECK(resp.jobs(0).config() == "tp=1,pp=1,dp=1");
  }
  // A coordinator's error comes back as the coordinator said it.
  {
    auto direct = proto::Coordinator::NewStub(
        grpc::CreateChannel(r.address, grpc::InsecureChannelCredentials()));
    proto::ListJobsRequest req;
    req.set_job("no-such-job");
    proto::ListJobsResponse resp;
    grpc::ClientContext a, b;
    SetDeadline(&a, absl::Seconds(30));
    SetDeadline(&b, absl::Seconds(30));
    const grpc::Status relayed = r.stub->ListJobs(&a, req, &resp);
    const grpc::Status straight = direct->ListJobs(&b, req, &resp);
    REQUIRE(!straight.ok());
    CHECK(relayed.error_code() == straight.error_code());
    CHECK(relayed.error_message() == straight.error_message());
  }
  // A Watch stream: the job's state at once, then held until cancelled.
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(120));
    proto::WatchRequest req;
    req.set_job("gpt");
    req.set_follow(true);
    auto reader = r.stub->Watch(&ctx, req);
    proto::ReconfigureEvent e;
    REQUIRE(reader->Read(&e));
    CHECK(e.layout_epoch() >= 1);
    CHECK(r.relay->active_calls() == 1);
    ctx.TryCancel();
    while (reader->Read(&e)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
    // The relay's call ends with the process's.
    CHECK(WaitActive(*r.relay, 0));
  }
  // Only the coordinator's service is relayed.
  {
    grpc::GenericStub generic(r.channel);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(30));
    grpc::ByteBuffer request, response;
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/ptc.proto.TensorStore/List", {}, &request,
                      &response, [&](grpc::Status s) {
                        status = s;
                        done.Notify();
                      });
    done.WaitForNotification();
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
    CHECK(status.error_message().find("coordinator calls only") !=
          std::string::npos);
  }
  CHECK(WaitActive(*r.relay, 0));
}

// Two processes' Watch streams through the relay, each told its first
// event.
struct TwoWatches {
  explicit TwoWatches(proto::Coordinator::Stub* stub) {
    proto::WatchRequest req;
    req.set_job("gpt");
    req.set_follow(true);
    SetDeadline(&a, absl::Seconds(120));
    SetDeadline(&b, absl::Seconds(120));
    first = stub->Watch(&a, req);
    second = stub->Watch(&b, req);
    proto::ReconfigureEvent e;
    REQUIRE(first->Read(&e));
    REQUIRE(second->Read(&e));
  }
  grpc::ClientContext a, b;
  std::unique_ptr<grpc::ClientReader<proto::ReconfigureEvent>> first, second;
};

TEST_CASE(
    "coordinator relay: calls beyond its bound are refused "
    "RESOURCE_EXHAUSTED, and stopping it ends the streams in flight",
    "[ptcd]") {
  Relayed r(/*max_calls=*/2);
  TwoWatches w(r.stub.get());
  auto& first = w.first;
  auto& second = w.second;
  proto::ReconfigureEvent e;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(30));
    proto::ListJobsRequest list;
    proto::ListJobsResponse resp;
    const grpc::Status s = r.stub->ListJobs(&ctx, list, &resp);
    CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(s.error_message().find("relays 2 coordinator calls at once") !=
          std::string::npos);
  }
  r.relay->Stop();
  while (first->Read(&e)) {
  }
  while (second->Read(&e)) {
  }
  CHECK(!first->Finish().ok());
  CHECK(!second->Finish().ok());
  CHECK(WaitActive(*r.relay, 0));
}

// A call held open without its request (the test never writes on it).
struct Silent : grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
  void OnDone(const grpc::Status& s) override {
    status = s;
    done.Notify();
  }
  grpc::Status status;
  absl::Notification done;
};

grpc::Status ListJobs(proto::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(30));
  proto::ListJobsRequest req;
  proto::ListJobsResponse resp;
  return stub->ListJobs(&ctx, req, &resp);
}

TEST_CASE(
    "coordinator relay: a call counts from its request on, and one user's "
    "calls are bounded apart from the relay's",
    "[ptcd][hostile]") {
  Relayed r(/*max_calls=*/3, /*max_calls_per_user=*/2);
  grpc::GenericStub generic(r.channel);
  grpc::ClientContext silent_ctx;
  SetDeadline(&silent_ctx, absl::Seconds(120));
  Silent silent;
  generic.PrepareBidiStreamingCall(&silent_ctx, "/ptc.proto.Coordinator/Watch",
                                   {}, &silent);
  silent.StartCall();
  // Answered on the same connection after it: the relay has the silent
  // call, which holds no slot.
  REQUIRE(ListJobs(r.stub.get()).ok());
  CHECK(r.relay->active_calls() == 0);
  TwoWatches w(r.stub.get());
  CHECK(r.relay->active_calls() == 2);
  // The relay has a third slot, but not for this user.
  const grpc::Status third = ListJobs(r.stub.get());
  CHECK(third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  INFO(third.error_message());
  CHECK(third.error_message().find(absl::StrCat(
            "uid ", getuid(),
            " has 2 coordinator calls through this ptcd at once")) !=
        std::string::npos);
  // Ended, the silent call never reached the coordinator; the streams'
  // slots come back as they end.
  silent_ctx.TryCancel();
  silent.done.WaitForNotification();
  CHECK(!silent.status.ok());
  proto::ReconfigureEvent e;
  w.a.TryCancel();
  while (w.first->Read(&e)) {
  }
  w.first->Finish().ok();
  CHECK(WaitActive(*r.relay, 1));
  CHECK(ListJobs(r.stub.get()).ok());
  w.b.TryCancel();
  while (w.second->Read(&e)) {
  }
  w.second->Finish().ok();
  CHECK(WaitActive(*r.relay, 0));
}

TEST_CASE(
    "coordinator relay: calls ended at any moment (deadlines, cancels, "
    "the relay stopping) leave no call behind and the relay whole",
    "[ptcd][hostile]") {
  Relayed r(/*max_calls=*/8, /*max_calls_per_user=*/6);
  // Every call ends as its caller or the relay ended it; any other code
  // (UNKNOWN, INTERNAL, ...) is kept to be shown.
  absl::Mutex mu;
  std::vector<std::string> unexpected;
  auto ended = [&](const grpc::Status& s) {
    switch (s.error_code()) {
      case grpc::StatusCode::OK:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
      case grpc::StatusCode::CANCELLED:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
      case grpc::StatusCode::UNAVAILABLE:  // the relay stopping
        return;
      default: {
        absl::MutexLock lock(&mu);
        unexpected.push_back(
            absl::StrCat(s.error_code(), ": ", s.error_message()));
      }
    }
  };
  auto caller = [&](int seed) {
    std::mt19937 rng(seed);
    // Connections of their own, as processes have.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = proto::Coordinator::NewStub(
        grpc::CreateCustomChannel("unix:" + r.relay->socket_path(),
                                  grpc::InsecureChannelCredentials(), args));
    for (int i = 0; i < 40; ++i) {
      grpc::ClientContext ctx;
      const int ms = std::uniform_int_distribution<int>(0, 20)(rng);
      SetDeadline(&ctx, absl::Milliseconds(1 + ms));
      if (rng() % 2 == 0) {
        proto::WatchRequest req;
        req.set_job("gpt");
        req.set_follow(true);
        auto reader = stub->Watch(&ctx, req);
        proto::ReconfigureEvent e;
        if (rng() % 3 == 0) ctx.TryCancel();
        while (reader->Read(&e)) {
        }
        ended(reader->Finish());
      } else {
        proto::ListJobsRequest req;
        proto::ListJobsResponse resp;
        ended(stub->ListJobs(&ctx, req, &resp));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) threads.emplace_back(caller, t);
  for (std::thread& t : threads) t.join();
  CHECK(WaitActive(*r.relay, 0));
  // Still relays, and stops with streams in flight.
  REQUIRE(ListJobs(r.stub.get()).ok());
  threads.clear();
  for (int t = 0; t < 8; ++t) threads.emplace_back(caller, 100 + t);
  absl::SleepFor(absl::Milliseconds(20));
  r.relay->Stop();
  for (std::thread& t : threads) t.join();
  CHECK(WaitActive(*r.relay, 0));
  INFO(absl::StrJoin(unexpected, "; "));
  CHECK(unexpected.empty());
}

TEST_CASE(
    "coordinator relay: with no coordinator listening a call fails "
    "UNAVAILABLE within its deadline",
    "[ptcd]") {
  testing::TempDir dir;
  // Port 1: nothing listens there.
  auto gone =
      CoordinatorRelay::Start({.socket_path = dir.path() + "/relay.sock",
                               .coordinator = "127.0.0.1:1"});
  REQUIRE(gone.ok());
  auto stub =
      proto::Coordinator::NewStub(OpenLocalChannel((*gone)->socket_path(), ""));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, absl::Seconds(60));
  proto::ListJobsRequest req;
  proto::ListJobsResponse resp;
  const absl::Time start = absl::Now();
  const grpc::Status s = stub->ListJobs(&ctx, req, &resp);
  CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(absl::Now() - start < absl::Seconds(60));
  // Marked as the coordinator's: the process did reach the relay.
  CHECK(IsRelayUpstream(FromGrpcStatus(s)));
  CHECK(WaitActive(**gone, 0));
}

TEST_CASE(
    "coordinator relay: a process that starts while its host's relay cannot "
    "reach the coordinator waits on the relay, not on a connection of its "
    "own",
    "[ptcd]") {
  Relayed r;
  Store store(StoreOptions{64 << 20, 0, false});
  const LocalServerOptions local = r.HostPtcd();
  auto ptcd = LocalServer::Start(&store, local);
  REQUIRE(ptcd.ok());
  // The coordinator goes away (a restart), and the relay's connection to
  // it with it; a process starts meanwhile.
  r.coordinator.reset();
  ClientOptions options;
  options.socket_path = local.socket_path;
  options.coordinator = r.address;
  options.job = "gpt";
  options.rank = 0;
  absl::StatusOr<std::unique_ptr<Client>> connected;
  std::thread process([&] { connected = Client::Connect(options); });
  // Longer than a process asks before it decides (three attempts, about
  // 0.35 s): without the relay's mark it went direct, found no coordinator
  // there either, and failed.
  absl::SleepFor(absl::Seconds(2));
  CoordinatorServerOptions back;
  back.service.state_dir = r.dir.path();
  back.service.host_timeout = absl::Hours(1);
  back.listen_address = r.address;
  auto restarted = CoordinatorServer::Start(back);
  REQUIRE(restarted.ok());
  process.join();
  INFO(connected.status().ToString());
  REQUIRE(connected.ok());
  CHECK((*connected)->relayed());
}

TEST_CASE(
    "coordinator relay: a process asks which ranks run on its host through "
    "its ptcd's relay, or directly where there is none",
    "[ptcd]") {
  Relayed r;
  Store store(StoreOptions{64 << 20, 0, false});
  LocalServerOptions options = r.HostPtcd();
  auto local = LocalServer::Start(&store, options);
  REQUIRE(local.ok());
  Counter& relayed = GetCounter("ptc_relay_calls_total");

  const int64_t before = relayed.value();
  auto direct = RanksOnHost(r.address, "gpt", "host0");
  REQUIRE(direct.ok());
  CHECK(relayed.value() == before);
  CHECK(direct->config == "tp=1,pp=1,dp=1");

  auto via = RanksOnHost(r.address, "gpt", "host0", absl::Seconds(30),
                         options.socket_path);
  INFO(via.status().ToString());
  REQUIRE(via.ok());
  CHECK(relayed.value() > before);
  CHECK(via->config == direct->config);
  CHECK(via->world_size == direct->world_size);
  REQUIRE(via->ranks.size() == direct->ranks.size());
  for (size_t i = 0; i < via->ranks.size(); ++i) {
    CHECK(via->ranks[i] == direct->ranks[i]);
  }
  // An unknown job's error is the coordinator's, relayed.
  CHECK(RanksOnHost(r.address, "nope", "host0", absl::Seconds(30),
                    options.socket_path)
            .status()
            .code() == absl::StatusCode::kNotFound);

  // No ptcd at the socket, or one that relays to another coordinator:
  // asked directly, the same answer.
  const int64_t after = relayed.value();
  auto nobody = RanksOnHost(r.address, "gpt", "host0", absl::Seconds(30),
                            r.dir.path() + "/nobody.sock");
  REQUIRE(nobody.ok());
  CHECK(nobody->config == direct->config);
  (*local)->Stop();
  options.coordinator = "127.0.0.1:1";
  auto elsewhere = LocalServer::Start(&store, options);
  REQUIRE(elsewhere.ok());
  auto other = RanksOnHost(r.address, "gpt", "host0", absl::Seconds(30),
                           options.socket_path);
  REQUIRE(other.ok());
  CHECK(other->config == direct->config);
  CHECK(relayed.value() == after);
}

}  // namespace
}  // namespace ptc
