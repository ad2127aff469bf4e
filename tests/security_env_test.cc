// A process whose PTC_TLS_* names files it cannot read (common/channel.h):
// its channels use TLS with no certificates, so every call fails and
// nothing goes in clear, with or without a job's token (its credentials
// are made once for the process, for this case too).
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
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
    ++calls;
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

grpc::Status Ask(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::ListHostsResponse resp;
  return proto::Coordinator::NewStub(channel)->ListHosts(&ctx, {}, &resp);
}

TEST_CASE("security from unreadable PTC_TLS_* files: calls fail, none in clear",
          "[channel]") {
  // Set before the process's first channel: nothing configured it.
  setenv("PTC_TLS_CA", "/nonexistent/ca.pem", 1);
  setenv("PTC_TLS_CERT", "/nonexistent/cert.pem", 1);
  setenv("PTC_TLS_KEY", "/nonexistent/key.pem", 1);
  Answers service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  CHECK_FALSE(Ask(OpenChannel(address)).ok());
  CHECK_FALSE(Ask(OpenChannel(address, {}, "", "a job's token")).ok());
  CHECK_FALSE(Ask(KeptChannel(address, "test")).ok());
  CHECK(service.calls.load() == 0);
  server->Shutdown();
}

}  // namespace
}  // namespace ptc
