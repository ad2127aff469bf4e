#include "tensor_store/tensor_store_server.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ptc {

absl::StatusOr<std::unique_ptr<TensorStoreServer>> TensorStoreServer::Start(
    TensorStoreServerOptions options) {
  if (options.memory_limit_bytes <= 0) {
    return absl::InvalidArgumentError("the memory limit must be positive");
  }
  std::unique_ptr<TensorStoreServer> s(new TensorStoreServer(options));
  if (!options.socket_path.empty()) {
    LocalServerOptions local{options.socket_path, options.allowed_uids,
                             options.host_name,   options.allowed_gid,
                             JobTokensEnabled(),  options.put_timeout};
    local.coordinator_relay = options.coordinator_relay;
    local.coordinator = options.coordinator;
    PTC_ASSIGN_OR_RETURN(s->local_,
                         LocalServer::Start(&s->store_, std::move(local)));
  }
  LocalServer* local = s->local_.get();
  Store* store = &s->store_;
  auto gauge = [&](const char* name, std::function<double()> read) {
    s->gauges_.push_back(std::make_unique<Gauge>(name, std::move(read)));
  };
  gauge("ptc_store_memory_used_bytes",
        [store] { return static_cast<double>(store->memory_used()); });
  gauge("ptc_store_memory_limit_bytes",
        [store] { return static_cast<double>(store->memory_limit()); });
  gauge("ptc_store_spare_ready_bytes",
        [store] { return static_cast<double>(store->spare_ready()); });
  gauge("ptc_store_local_clients",
        [local] { return local ? local->num_clients() : 0.0; });
  PTC_RETURN_IF_ERROR(
      CheckCallerPolicies(proto::TensorStore::service_full_name()));
  s->service_ = std::make_unique<TensorStoreService>(
      &s->store_, [local] { return local ? local->num_clients() : 0; },
      options.put_timeout, options.peer_admissions);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, ServerCredentials(),
                           &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  AllowKeepalivePings(builder);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  grpc::ResourceQuota quota("ptcd");
  quota.SetMaxThreads(kMaxRpcThreads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(s->service_.get());
  for (const auto& make : options.services) {
    s->extra_services_.push_back(make(&s->store_));
    builder.RegisterService(s->extra_services_.back().get());
  }
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (address in use or not local?)"));
  }
  Log("tensor_store")
      ->info("ptcd serving on port {} (memory limit {} bytes)", s->port_,
             options.memory_limit_bytes);
  return s;
}

void TensorStoreServer::Shutdown(absl::Duration drain) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (local_) local_->Stop();
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
    server_->Wait();
  }
}

void TensorStoreServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

}  // namespace ptc
