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
  {
    grpc::ClientContext ctx;
    proto::RegisterHostRequest req;
    *req.mutable_host() = Host("host0");
    proto::RegisterHostResponse resp;
    REQUIRE(c.stub->RegisterHost(&ctx, req, &resp).ok());
  }
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

TEST_CASE("heartbeat stream: ptcd's agent heartbeats on the stream",
          "[coordinator][ptcd]") {
  Coordinator c;
  const int64_t calls = Calls("Heartbeat");
  const int64_t streamed = Calls("Heartbeats");
  CoordinatorAgent agent(c.address, Host("host0"));
  REQUIRE(Eventually([&] { return agent.registered(); }));
  // A stream's open and each of its messages count; three beats at least.
  CHECK(Eventually([&] { return Calls("Heartbeats") - streamed >= 4; }));
  CHECK(Calls("Heartbeat") == calls);
}

// A coordinator from before the stream: RegisterHost and Heartbeat, every
// other method UNIMPLEMENTED (gRPC's answer for a method a server lacks).
class OlderCoordinator final : public proto::Coordinator::Service {
 public:
  grpc::Status RegisterHost(grpc::ServerContext*,
                            const proto::RegisterHostRequest*,
                            proto::RegisterHostResponse* resp) override {
    resp->set_heartbeat_interval_seconds(0.2);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest*,
                         proto::HeartbeatResponse* resp) override {
    resp->set_known(true);
    resp->set_heartbeat_interval_seconds(0.2);
    ++beats;
    return grpc::Status::OK;
  }
  std::atomic<int> beats{0};
};

TEST_CASE(
    "heartbeat stream: against a coordinator without it, ptcd's agent "
    "heartbeats by call",
    "[coordinator][ptcd]") {
  OlderCoordinator older;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&older);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
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

}  // namespace
}  // namespace ptc
