// KeptChannel (common/channel.h): one channel per peer and kind, kept
// between calls, made anew where the kept one's connection failed, and
// dropped when the process's security changes.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "proto/coordinator.grpc.pb.h"

namespace ptc {
namespace {

class Answers final : public proto::Coordinator::Service {
 public:
  grpc::Status ListHosts(grpc::ServerContext*, const proto::ListHostsRequest*,
                         proto::ListHostsResponse*) override {
    return grpc::Status::OK;
  }
};

// A server on `port` (0: one it picks; the port it took is put there).
std::unique_ptr<grpc::Server> Serve(Answers* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", *port),
                           grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A fail-fast call (as the coordinator's fan-outs make them).
grpc::Status Ask(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  proto::ListHostsResponse resp;
  return proto::Coordinator::NewStub(channel)->ListHosts(&ctx, {}, &resp);
}

TEST_CASE("kept channels: one per peer and kind, made anew after a failure",
          "[channel]") {
  REQUIRE(ConfigureSecurity({.insecure = true}, "kept_channel_test").ok());
  Answers service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&service, &port);
  REQUIRE(server != nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  std::shared_ptr<grpc::Channel> kept = KeptChannel(address, "test");
  REQUIRE(Ask(kept).ok());
  // The same peer and kind: the same channel, its connection kept.
  CHECK(KeptChannel(address, "test") == kept);
  CHECK(kept->GetState(false) == GRPC_CHANNEL_READY);
  // Another kind (other arguments) or expected name: another channel.
  CHECK(KeptChannel(address, "other") != kept);
  CHECK(KeptChannel(address, "test", {}, "host0") != kept);
  // A host's channel: one for its short calls, whichever service, and
  // one apart for the patient keepalive of a change's staging streams.
  std::shared_ptr<grpc::Channel> host = HostChannel(address);
  CHECK(Ask(host).ok());
  CHECK(HostChannel(address) == host);
  CHECK(HostChannel(address, /*patient=*/true) != host);
  CHECK(HostChannel(address, /*patient=*/true) ==
        HostChannel(address, /*patient=*/true));

  // The peer goes away: a call fails, and the channel waits out a backoff
  // in which it would fail every call at once.
  server->Shutdown();
  server.reset();
  CHECK_FALSE(Ask(kept).ok());
  // Back on the same port (a restarted ptcd): the next channel asked for
  // is one that connects now, if the kept one still waits.
  server = Serve(&service, &port);
  REQUIRE(server != nullptr);
  std::shared_ptr<grpc::Channel> again = KeptChannel(address, "test");
  CHECK(Ask(again).ok());
  CHECK(KeptChannel(address, "test") == again);

  // Security changed: channels kept with the old are not used again.
  REQUIRE(ConfigureSecurity({.insecure = true}, "kept_channel_test").ok());
  std::shared_ptr<grpc::Channel> after = KeptChannel(address, "test");
  CHECK(after != again);
  CHECK(Ask(after).ok());
  server->Shutdown();
}

}  // namespace
}  // namespace ptc
