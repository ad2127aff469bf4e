#include "coordinator/coordinator_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ptc {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer);
  PTC_ASSIGN_OR_RETURN(s->service_,
                       CoordinatorService::Create(options.service));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address,
                           ServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address));
  }
  return s;
}

void CoordinatorServer::Shutdown() {
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    server_->Wait();
    server_.reset();
  }
  service_.reset();
}

}  // namespace ptc
