#include "coordinator/coordinator_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/limits.h"
#include "common/status_macros.h"

namespace ptc {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer);
  PTC_RETURN_IF_ERROR(
      CheckCallerPolicies(proto::Coordinator::service_full_name()));
  PTC_ASSIGN_OR_RETURN(s->service_,
                       CoordinatorService::Create(options.service));
  // gRPC's health service says SERVING: channels given several
  // coordinators send their calls here, not to a standby
  // (standby_server.h).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, ServerCredentials(),
                           &s->port_);
  builder.SetMaxReceiveMessageSize(kMaxCoordinatorRequestBytes);
  AllowKeepalivePings(builder);
  grpc::ResourceQuota quota("ptc-coordinator");
  quota.SetMaxThreads(kMaxRpcThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address));
  }
  CoordinatorService* service = s->service_.get();
  auto gauge = [&](const char* name, int CoordinatorService::Counts::*field) {
    s->gauges_.push_back(std::make_unique<Gauge>(
        name, [service, field] { return service->GetCounts().*field; }));
  };
  gauge(R"(ptc_coordinator_hosts{state="alive"})",
        &CoordinatorService::Counts::hosts_alive);
  gauge(R"(ptc_coordinator_hosts{state="dead"})",
        &CoordinatorService::Counts::hosts_dead);
  gauge("ptc_coordinator_jobs", &CoordinatorService::Counts::jobs);
  gauge("ptc_coordinator_reconfigurations_in_flight",
        &CoordinatorService::Counts::changes_in_flight);
  gauge("ptc_coordinator_host_probes",
        &CoordinatorService::Counts::probes_open);
  gauge("ptc_coordinator_meeting_calls_held",
        &CoordinatorService::Counts::meeting_calls_held);
  return s;
}

void CoordinatorServer::Shutdown() {
  gauges_.clear();
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    server_->Wait();
    server_.reset();
  }
  service_.reset();
}

}  // namespace ptc
