#include "ptcd/coordinator_agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/logging.h"

namespace ptc {

CoordinatorAgent::CoordinatorAgent(std::string coordinator,
                                   proto::HostStatus host, Store* store)
    : coordinator_(std::move(coordinator)),
      host_(std::move(host)),
      store_(store) {
  thread_ = std::thread([this] { Loop(); });
}

CoordinatorAgent::~CoordinatorAgent() {
  stop_.Notify();
  thread_.join();
}

bool CoordinatorAgent::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

namespace {

// The interval the coordinator asked for, within sane bounds (a garbled
// or hostile answer must not stop the heartbeats, or flood it).
absl::Duration ToldInterval(double seconds) {
  return std::clamp(absl::Seconds(seconds), absl::Milliseconds(50),
                    absl::Minutes(5));
}

}  // namespace

void CoordinatorAgent::Loop() {
  // Reconnect within a second of the coordinator coming back: with gRPC's
  // default backoff (up to two minutes) a restarted coordinator heard
  // from its hosts seconds late, and timed them out.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto stub = proto::Coordinator::NewStub(
      OpenChannel(coordinator_, args, "coordinator"));
  absl::Duration interval = absl::Seconds(1);
  bool registered = false;
  std::string refused;  // the last reason the coordinator gave
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (!registered) {
      proto::RegisterHostRequest req;
      *req.mutable_host() = host_;
      proto::RegisterHostResponse resp;
      const grpc::Status s = stub->RegisterHost(&ctx, req, &resp);
      if (s.ok()) {
        registered = true;
        if (resp.heartbeat_interval_seconds() > 0)
          interval = ToldInterval(resp.heartbeat_interval_seconds());
        Log("transformer")
            ->info("registered with the coordinator at {} as {}", coordinator_,
                   host_.name());
      } else if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
                 s.error_message() != refused) {
        // Refused, not unreachable (a certificate that names another host,
        // a bad field): said once per reason, retried all the same.
        refused = s.error_message();
        Log("transformer")
            ->warn("the coordinator at {} refused to register {}: {}",
                   coordinator_, host_.name(), refused);
      } else {
        Log("transformer")
            ->debug("registering with {}: {}", coordinator_, s.error_message());
      }
    } else {
      proto::HeartbeatRequest req;
      req.set_name(host_.name());
      req.set_incarnation(host_.incarnation());
      if (store_ != nullptr) {
        for (const auto& v : store_->Versions()) *req.add_versions() = v;
        req.set_memory_used_bytes(store_->memory_used());
      }
      proto::HeartbeatResponse resp;
      const grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
      if (s.ok() && resp.heartbeat_interval_seconds() > 0)
        interval = ToldInterval(resp.heartbeat_interval_seconds());
      if (s.ok() && !resp.known()) {
        Log("transformer")
            ->warn(
                "the coordinator does not know {} any more; registering again",
                host_.name());
        registered = false;
        continue;
      }
      for (const proto::HeldVersion& v : resp.reclaim()) {
        if (store_ == nullptr) break;
        auto deleted = store_->DeleteVersion(v.job(), v.version());
        if (deleted.ok()) {
          Log("transformer")
              ->info("job {}: reclaimed version {} ({} bytes) that nothing "
                     "owns any more",
                     v.job(), v.version(), *deleted);
        }
      }
    }
    {
      absl::MutexLock lock(&mu_);
      registered_ = registered;
    }
  } while (!stop_.WaitForNotificationWithTimeout(interval / 2));
}

}  // namespace ptc
