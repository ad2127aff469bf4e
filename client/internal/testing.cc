#include "client/internal/testing.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace ptc::testing {
namespace {

std::unique_ptr<proto::Coordinator::Stub> Stub(const std::string& address) {
  return proto::Coordinator::NewStub(
      OpenChannel(address, grpc::ChannelArguments(), "coordinator"));
}

}  // namespace

ClientCluster::ClientCluster(int hosts, int gpus_per_host) : daemons(hosts) {
  auto c = CoordinatorServer::Start({"127.0.0.1:0", {dir.path()}});
  REQUIRE(c.ok());
  coordinator = std::move(*c);
  address = absl::StrCat("127.0.0.1:", coordinator->port());
  for (int h = 0; h < hosts; ++h) {
    proto::HostStatus s;
    s.set_name(absl::StrCat("host", h));
    s.set_address(daemons.addresses.at(h));
    s.set_gpus(gpus_per_host);
    s.set_incarnation(h + 1);
    agents.push_back(std::make_unique<CoordinatorAgent>(address, s));
  }
  for (auto& a : agents) {
    for (int i = 0; i < 500 && !a->registered(); ++i)
      absl::SleepFor(absl::Milliseconds(10));
    REQUIRE(a->registered());
  }
}

void ClientCluster::RegisterJob(const std::string& job,
                                const std::string& model,
                                const std::string& config,
                                const std::vector<std::string>& hosts) {
  grpc::ClientContext ctx;
  proto::RegisterJobRequest req;
  req.set_job(job);
  req.set_model(model);
  req.set_config(config);
  for (const std::string& h : hosts) req.add_hosts(h);
  proto::RegisterJobResponse resp;
  const absl::Status s =
      FromGrpcStatus(Stub(address)->RegisterJob(&ctx, req, &resp));
  INFO(s.ToString());
  REQUIRE(s.ok());
}

void ClientCluster::ForgetJob(const std::string& job) {
  grpc::ClientContext ctx;
  proto::ForgetJobRequest req;
  req.set_job(job);
  proto::ForgetJobResponse resp;
  const absl::Status s = FromGrpcStatus(Stub(address)->ForgetJob(&ctx, req, &resp));
  INFO(s.ToString());
  REQUIRE(s.ok());
}

absl::Status ClientCluster::Reconfigure(const std::string& job,
                                        const std::string& config,
                                        const std::vector<std::string>& hosts) {
  auto stub = Stub(address);
  proto::ReconfigureResponse resp;
  {
    grpc::ClientContext ctx;
    proto::ReconfigureRequest req;
    req.set_job(job);
    req.set_to(config);
    for (const std::string& h : hosts) req.add_hosts(h);
    absl::Status s = FromGrpcStatus(stub->Reconfigure(&ctx, req, &resp));
    if (!s.ok()) return s;
  }
  for (int i = 0; i < 6000; ++i) {
    grpc::ClientContext ctx;
    proto::ListJobsRequest req;
    req.set_job(job);
    proto::ListJobsResponse jobs;
    absl::Status s = FromGrpcStatus(stub->ListJobs(&ctx, req, &jobs));
    if (!s.ok()) return s;
    const proto::ReconfigureEvent& e = jobs.jobs(0).reconfiguration();
    if (e.plan_epoch() == resp.plan_epoch()) {
      if (e.phase() == proto::PHASE_COMMITTED) return absl::OkStatus();
      if (e.phase() == proto::PHASE_ABORTED) return absl::AbortedError(e.error());
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("the reconfiguration did not end");
}

}  // namespace ptc::testing
