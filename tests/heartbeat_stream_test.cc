// A host's heartbeats on one stream (Coordinator.Heartbeats): the
// coordinator answers each message as it answers a Heartbeat call, and
// ptcd's agent uses the stream, or calls where the coordinator has none.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/coordinator_service.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptcd/coordinator_agent.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

proto::HostStatus Host(const std::string& name) {
  proto::HostStatus h;
  h.set_name(name);
  h.set_address("127.0.0.1:7070");
  h.set_gpus(4);
  h.set_memory_bytes(int64_t{8} << 30);
  h.set_incarnation(1);
  return h;
}

struct Coordinator {
  Coordinator() {
    CoordinatorServerOptions options;
    options.service.state_dir = dir.path();
    options.service.host_timeout = absl::Hours(1);
    options.service.heartbeat_interval = absl::Milliseconds(200);
    auto started = CoordinatorServer::Start(options);
    REQUIRE(started.ok());
    server = *std::move(started);
    address = absl::StrCat("127.0.0.1:", server->port());
    stub = proto::Coordinator::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  void Register(const std::string& name) {
    grpc::ClientContext ctx;
    proto::RegisterHostRequest req;
    *req.mutable_host() = Host(name);
    proto::RegisterHostResponse resp;
    REQUIRE(stub->RegisterHost(&ctx, req, &resp).ok());
  }
  testing::TempDir dir;
  std::unique_ptr<CoordinatorServer> server;
  std::string address;
  std::unique_ptr<proto::Coordinator::Stub> stub;
};

int64_t Calls(const char* method) {
  return GetCounter(absl::StrCat("ptc_rpc_calls_total{method=\"Coordinator.",
                                 method, "\"}"))
      .value();
}

// Waits up to a minute (a loaded machine) for `ready`.
template <typename F>
bool Eventually(F ready) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (!ready() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  return ready();
}

TEST_CASE(
    "heartbeat stream: each message is answered as a Heartbeat call is, on "
    "one stream",
    "[coordinator]") {
  Coordinator c;
  c.Register("host0");
  grpc::ClientContext ctx;
  auto stream = c.stub->Heartbeats(&ctx);
  proto::HeartbeatResponse resp;
  for (int64_t used : {1000, 2000, 3000}) {
    proto::HeartbeatRequest req;
    req.set_name("host0");
    req.set_incarnation(1);
    req.set_memory_used_bytes(used);
    REQUIRE(stream->Write(req));
    REQUIRE(stream->Read(&resp));
    CHECK(resp.known());
    CHECK(resp.heartbeat_interval_seconds() > 0);
    // The coordinator took it as the host's heartbeat.
    grpc::ClientContext list_ctx;
    proto::ListHostsResponse hosts;
    REQUIRE(c.stub->ListHosts(&list_ctx, {}, &hosts).ok());
    REQUIRE(hosts.hosts_size() == 1);
    CHECK(hosts.hosts(0).memory_used_bytes() == used);
  }
  // A host the coordinator does not know, or another process under the
  // name, is told to register again; the stream goes on.
  proto::HeartbeatRequest stranger;
  stranger.set_name("host9");
  REQUIRE(stream->Write(stranger));
  REQUIRE(stream->Read(&resp));
  CHECK_FALSE(resp.known());
  proto::HeartbeatRequest other;
  other.set_name("host0");
  other.set_incarnation(2);
  REQUIRE(stream->Write(other));
  REQUIRE(stream->Read(&resp));
  CHECK_FALSE(resp.known());
  REQUIRE(stream->WritesDone());
  CHECK(stream->Finish().ok());
}

TEST_CASE(
    "heartbeat stream: a beat marked answer_when_needed is answered only "
    "with something to say",
    "[coordinator]") {
  Coordinator c;
  c.Register("host0");
  grpc::ClientContext ctx;
  auto stream = c.stub->Heartbeats(&ctx);
  proto::HeartbeatRequest beat;
  beat.set_name("host0");
  beat.set_incarnation(1);
  beat.set_answer_when_needed(true);
  // The first is answered (the stream has not been told an interval),
  // the next two not: answers come in order, so the next one read is the
  // stranger's.
  for (int i = 0; i < 3; ++i) REQUIRE(stream->Write(beat));
  proto::HeartbeatRequest stranger = beat;
  stranger.set_name("host9");
  REQUIRE(stream->Write(stranger));
  // A version of a job the coordinator does not know is never reclaimed
  // (nothing to say); so the one after is answered for its stranger.
  proto::HeartbeatRequest holding = beat;
  proto::HeldVersion* v = holding.add_versions();
  v->set_job("unknown-job");
  v->set_version(3);
  REQUIRE(stream->Write(holding));
  REQUIRE(stream->Write(stranger));
  proto::HeartbeatResponse resp;
  REQUIRE(stream->Read(&resp));
  CHECK(resp.known());
  CHECK(resp.heartbeat_interval_seconds() > 0);
  REQUIRE(stream->Read(&resp));
  CHECK_FALSE(resp.known());
  REQUIRE(stream->Read(&resp));
  CHECK_FALSE(resp.known());
  // The coordinator heard every one of them.
  grpc::ClientContext list_ctx;
  proto::ListHostsResponse hosts;
  REQUIRE(c.stub->ListHosts(&list_ctx, {}, &hosts).ok());
  REQUIRE(hosts.hosts_size() == 1);
  CHECK(hosts.hosts(0).alive());
  REQUIRE(stream->WritesDone());
  CHECK_FALSE(stream->Read(&resp));  // nothing more was answered
  CHECK(stream->Finish().ok());
}

TEST_CASE("heartbeat stream: when a quiet beat is answered", "[coordinator]") {
  proto::HeartbeatRequest quiet;
  quiet.set_answer_when_needed(true);
  proto::HeartbeatResponse resp;
  resp.set_known(true);
  resp.set_heartbeat_interval_seconds(2);
  const absl::Duration recent = absl::Seconds(1);
  CHECK_FALSE(HeartbeatNeedsAnswer(quiet, resp, 2, recent));
  // Every beat of a host that asks for answers.
  CHECK(HeartbeatNeedsAnswer(proto::HeartbeatRequest(), resp, 2, recent));
  // Something to say: a new interval, register again, reclaim.
  CHECK(HeartbeatNeedsAnswer(quiet, resp, 0, recent));
  CHECK(HeartbeatNeedsAnswer(quiet, resp, 4, recent));
  proto::HeartbeatResponse untold = resp;  // tells no interval: keep yours
  untold.set_heartbeat_interval_seconds(0);
  CHECK_FALSE(HeartbeatNeedsAnswer(quiet, untold, 2, recent));
  proto::HeartbeatResponse unknown = resp;
  unknown.set_known(false);
  CHECK(HeartbeatNeedsAnswer(quiet, unknown, 2, recent));
  proto::HeartbeatResponse reclaim = resp;
  reclaim.add_reclaim()->set_job("j");
  CHECK(HeartbeatNeedsAnswer(quiet, reclaim, 2, recent));
  // A sign of life at least every kHeartbeatAnswerEvery.
  CHECK_FALSE(HeartbeatNeedsAnswer(
      quiet, resp, 2, kHeartbeatAnswerEvery - absl::Milliseconds(1)));
  CHECK(HeartbeatNeedsAnswer(quiet, resp, 2, kHeartbeatAnswerEvery));
  CHECK(HeartbeatNeedsAnswer(quiet, resp, 2, absl::InfiniteDuration()));
}

TEST_CASE("heartbeat stream: ptcd's agent heartbeats on the stream",
          "[coordinator][ptcd]") {
  Coordinator c;
  const int64_t calls = Calls("Heartbeat");
  const int64_t streamed = Calls("Heartbeats");
  Counter& answers =
      GetCounter("ptc_coordinator_heartbeat_stream_answers_total");
  const int64_t answered = answers.value();
  const absl::Time start = absl::Now();
  CoordinatorAgent agent(c.address, Host("host0"));
  REQUIRE(Eventually([&] { return agent.registered(); }));
  // A stream's open and each of its messages count; six beats at least.
  CHECK(Eventually([&] { return Calls("Heartbeats") - streamed >= 7; }));
  CHECK(Calls("Heartbeat") == calls);
  // Nothing to say after the first: the interval stays (the registry's
  // interval grows only past 500 hosts' beats a second), nothing to
  // reclaim, the host known. One more every kHeartbeatAnswerEvery at most
  // (a loaded machine may take that long over the beats).
  const int64_t due = (absl::Now() - start) / kHeartbeatAnswerEvery;
  CHECK(answers.value() - answered <= 2 + due);
}

// `service` on a port it picks (put in `port`), plaintext.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A test coordinator that registers every host, telling it to beat
// every 0.2 s, and counts the registrations and the beats it reads.
class Registers : public proto::Coordinator::Service {
 public:
  grpc::Status RegisterHost(grpc::ServerContext*,
                            const proto::RegisterHostRequest*,
                            proto::RegisterHostResponse* resp) override {
    resp->set_heartbeat_interval_seconds(0.2);
    ++registrations;
    return grpc::Status::OK;
  }
  std::atomic<int> registrations{0};
  std::atomic<int> beats{0};
};

// A coordinator from before the stream: RegisterHost and Heartbeat, every
// other method UNIMPLEMENTED (gRPC's answer for a method a server lacks).
class OlderCoordinator final : public Registers {
 public:
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest*,
                         proto::HeartbeatResponse* resp) override {
    resp->set_known(true);
    resp->set_heartbeat_interval_seconds(0.2);
    ++beats;
    return grpc::Status::OK;
  }
};

TEST_CASE(
    "heartbeat stream: against a coordinator without it, ptcd's agent "
    "heartbeats by call",
    "[coordinator][ptcd]") {
  OlderCoordinator older;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&older, &port);
  REQUIRE(server != nullptr);
  {
    CoordinatorAgent agent(absl::StrCat("127.0.0.1:", port), Host("host0"));
    REQUIRE(Eventually([&] { return agent.registered(); }));
    // Every beat arrives: the one the stream was refused for, and the
    // calls after it.
    CHECK(Eventually([&] { return older.beats.load() >= 3; }));
  }
  server->Shutdown();
}

// A coordinator from before answer_when_needed: it answers every message
// of the stream.
class AnswersEveryBeat final : public Registers {
 public:
  grpc::Status Heartbeats(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<proto::HeartbeatResponse,
                               proto::HeartbeatRequest>* stream) override {
    proto::HeartbeatRequest req;
    while (stream->Read(&req)) {
      ++beats;
      proto::HeartbeatResponse resp;
      resp.set_known(true);
      resp.set_heartbeat_interval_seconds(0.2);
      if (!stream->Write(resp)) break;
    }
    return grpc::Status::OK;
  }
};

TEST_CASE(
    "heartbeat stream: against a coordinator that answers every beat, "
    "ptcd's agent stays on the stream",
    "[coordinator][ptcd]") {
  AnswersEveryBeat older;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&older, &port);
  REQUIRE(server != nullptr);
  {
    CoordinatorAgent agent(absl::StrCat("127.0.0.1:", port), Host("host0"));
    REQUIRE(Eventually([&] { return agent.registered(); }));
    CHECK(Eventually([&] { return older.beats.load() >= 5; }));
    // Registered once: every answer said it is known.
    CHECK(older.registrations.load() == 1);
    CHECK(agent.registered());
  }
  server->Shutdown();
}

// A coordinator that forgets the host at its `forget_at`th beat and, busy,
// answers late: "not known" for that beat only once two more have come,
// and for those two only after the host has registered again, just before
// the answer to the first beat it reads since. Ordered on one stream, as
// a loaded coordinator's answers are.
class LateToForget final : public Registers {
 public:
  grpc::Status Heartbeats(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<proto::HeartbeatResponse,
                               proto::HeartbeatRequest>* stream) override {
    proto::HeartbeatRequest req;
    proto::HeartbeatResponse known, unknown;
    known.set_known(true);
    unknown.set_known(false);
    int held = 0;  // "not known" answers not yet written
    while (stream->Read(&req)) {
      const int beat = ++beats;
      if (beat >= kForgetAt && registrations.load() == 1) {
        if (++held == 3 && !stream->Write(unknown)) break;
        continue;
      }
      for (--held; held > 0; --held) {
        if (!stream->Write(unknown)) return grpc::Status::OK;
      }
      held = 0;
      if (!stream->Write(known)) break;
    }
    return grpc::Status::OK;
  }
  static constexpr int kForgetAt = 4;
};

TEST_CASE(
    "heartbeat stream: a late 'not known' for a beat from before the host "
    "registered again does not make it register once more",
    "[coordinator][ptcd]") {
  LateToForget late;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&late, &port);
  REQUIRE(server != nullptr);
  {
    CoordinatorAgent agent(absl::StrCat("127.0.0.1:", port), Host("host0"));
    REQUIRE(Eventually([&] { return late.registrations.load() == 2; }));
    // Beats after the second registration: had the agent kept the stream,
    // the two held answers came before the first of them was answered.
    const int beats = late.beats.load();
    REQUIRE(Eventually([&] { return late.beats.load() >= beats + 5; }));
    CHECK(late.registrations.load() == 2);
    CHECK(agent.registered());
  }
  server->Shutdown();
}

}  // namespace
}  // namespace ptc
