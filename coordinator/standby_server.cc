#include "coordinator/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_callback.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/limits.h"

namespace ptc {

std::string StandbyMessage(const std::string& leader) {
  return absl::StrCat(
      "this coordinator stands by: ",
      leader.empty() ? "no coordinator leads now (an election is under way)"
                     : absl::StrCat("the coordinator at ", leader, " leads"),
      "; retry, and give ptcd, clients and ptcctl every coordinator's "
      "address (\"a:7000,b:7000\"): they follow the leader");
}

// Answers every method the server has no service for (all of
// proto.Coordinator's; the health service is registered) at once.
class StandbyServer::Redirect final : public grpc::CallbackGenericService {
 public:
  explicit Redirect(std::function<std::string()> leader)
      : leader_(std::move(leader)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(const std::string& message) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(StandbyMessage(leader_()));
  }

 private:
  const std::function<std::string()> leader_;
};

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen_address, std::function<std::string()> leader) {
  std::unique_ptr<StandbyServer> s(new StandbyServer);
  s->redirect_ = std::make_unique<Redirect>(std::move(leader));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, ServerCredentials(), &s->port_);
  AllowKeepalivePings(builder);
  grpc::ResourceQuota quota("ptc-coordinator-standby");
  quota.SetMaxThreads(kMaxRpcThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterCallbackGenericService(s->redirect_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen_address));
  }
  // Every service, and the server as a whole (""), is not serving.
  s->server_->GetHealthCheckService()->SetServingStatus(false);
  return s;
}

StandbyServer::~StandbyServer() { Shutdown(); }

void StandbyServer::Shutdown() {
  if (!server_) return;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  server_->Wait();
  server_.reset();
}

}  // namespace ptc
