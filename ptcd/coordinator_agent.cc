#include "ptcd/coordinator_agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"
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

// How long a heartbeat waits for its answer.
constexpr absl::Duration kAnswerWithin = absl::Seconds(5);
// How often a host whose coordinator had no heartbeat stream tries one
// again (the coordinator may have been upgraded since).
constexpr absl::Duration kStreamRetry = absl::Minutes(5);

// The host's heartbeats on one stream (Coordinator.Heartbeats): a message
// and its answer per beat, on one HTTP/2 stream rather than a call each
// (the coordinator's cost per heartbeat). gRPC's reactions run on its own
// threads; Beat waits for them. An error ends the stream for good: the
// agent opens another. Destroying it cancels the stream and waits for
// gRPC's last reaction. Beat starts writes from outside gRPC's reactions,
// so the stream is held (AddHold) until Beat will start no more: without
// the hold, a stream the coordinator ended between Beat's look and its
// StartWrite was already freed by gRPC (OnDone), and the write corrupted
// ptcd's heap.
class HeartbeatStream final
    : public grpc::ClientBidiReactor<proto::HeartbeatRequest,
                                     proto::HeartbeatResponse> {
 public:
  explicit HeartbeatStream(proto::Coordinator::Stub* stub) {
    stub->async()->Heartbeats(&ctx_, this);
    AddHold();
    StartRead(&in_);
    StartCall();
  }

  ~HeartbeatStream() override {
    ctx_.TryCancel();
    Release();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }

  // Sends `req` and waits up to `timeout` for its answer. The stream's
  // end, as an error: the coordinator's status (UNIMPLEMENTED: it has no
  // such stream), or DEADLINE_EXCEEDED where no answer came in time (the
  // stream is then cancelled).
  absl::StatusOr<proto::HeartbeatResponse> Beat(
      const proto::HeartbeatRequest& req, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    // The last beat's write is over (its answer came, so it was sent, but
    // gRPC may say so later).
    if (!WaitFor(&HeartbeatStream::WriteOverLocked, deadline))
      return TimedOut(timeout);
    {
      absl::MutexLock lock(&mu_);
      if (!ended_) {
        out_ = req;
        writing_ = true;
        answered_ = false;
      }
    }
    if (!Ended()) {
      StartWrite(&out_);  // held: the stream is alive, ended or not
      if (!WaitFor(&HeartbeatStream::AnsweredLocked, deadline))
        return TimedOut(timeout);
      absl::MutexLock lock(&mu_);
      if (answered_) return answer_;
    }
    // The stream ended: no more writes; its status once gRPC is done.
    Release();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return EndedLocked();
  }

  void OnWriteDone(bool) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended: OnDone follows once it is released
      absl::MutexLock lock(&mu_);
      ended_ = true;
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      answer_ = in_;
      answered_ = true;
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    ended_ = true;
    done_ = true;
  }

 private:
  bool WriteOverLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_ || ended_;
  }
  bool AnsweredLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return answered_ || ended_;
  }
  bool Ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  // Lets gRPC end the stream (OnDone); once, on the agent's thread.
  void Release() {
    if (!held_) return;
    held_ = false;
    RemoveHold();
  }

  bool WaitFor(bool (HeartbeatStream::*ready)() const, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(this, ready), deadline);
  }

  absl::Status EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return FromGrpcStatus(status_);
    return absl::UnavailableError("the coordinator ended the heartbeat stream");
  }

  // Cancels the stream (not under the lock: gRPC may react at once).
  absl::Status TimedOut(absl::Duration timeout) {
    ctx_.TryCancel();
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer to a heartbeat within ", absl::FormatDuration(timeout)));
  }

  grpc::ClientContext ctx_;
  proto::HeartbeatRequest out_;  // the beat being written
  proto::HeartbeatResponse in_;  // the answer being read
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  proto::HeartbeatResponse answer_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // its read side ended
  bool done_ ABSL_GUARDED_BY(mu_) = false;   // OnDone ran
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool held_ = true;  // the agent's thread only
};

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
  // Heartbeats go on a stream; by call where the coordinator has none,
  // until kStreamRetry passes.
  std::unique_ptr<HeartbeatStream> stream;
  absl::Time calls_until = absl::InfinitePast();
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
      absl::StatusOr<proto::HeartbeatResponse> answer =
          absl::UnavailableError("not sent");
      if (absl::Now() >= calls_until) {
        if (stream == nullptr)
          stream = std::make_unique<HeartbeatStream>(stub.get());
        answer = stream->Beat(req, kAnswerWithin);
        if (!answer.ok()) stream.reset();  // the next beat opens another
        if (absl::IsUnimplemented(answer.status()) ||
            absl::IsResourceExhausted(answer.status())) {
          Log("transformer")
              ->info(
                  "the coordinator at {} takes no heartbeat stream ({}); "
                  "heartbeats are calls for {}",
                  coordinator_, answer.status().ToString(),
                  absl::FormatDuration(kStreamRetry));
          calls_until = absl::Now() + kStreamRetry;
        }
      }
      if (!answer.ok()) {
        // By call: the coordinator takes no stream, or the stream just
        // ended (the beat is not skipped).
        grpc::ClientContext call;
        call.set_deadline(absl::ToChronoTime(absl::Now() + kAnswerWithin));
        proto::HeartbeatResponse resp;
        const grpc::Status s = stub->Heartbeat(&call, req, &resp);
        answer = s.ok() ? absl::StatusOr<proto::HeartbeatResponse>(resp)
                        : FromGrpcStatus(s);
      }
      if (!answer.ok()) {
        Log("transformer")
            ->debug("heartbeat to {}: {}", coordinator_,
                    answer.status().ToString());
        continue;
      }
      const proto::HeartbeatResponse& resp = *answer;
      if (resp.heartbeat_interval_seconds() > 0)
        interval = ToldInterval(resp.heartbeat_interval_seconds());
      if (!resp.known()) {
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
