#include "ptcd/coordinator_agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

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
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
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

// How long a heartbeat may take: a call's deadline; on the stream, the
// wait for the beat before it to be written.
constexpr absl::Duration kBeatWithin = absl::Seconds(5);
// A stream with no answer for this long and a beat's period is given up
// (and another opened): the coordinator answers every message that says
// something, and one at least every 8 s (HeartbeatRequest's
// answer_when_needed); older ones answer every message.
constexpr absl::Duration kSilentStream = absl::Seconds(60);
// How often a host whose coordinator had no heartbeat stream tries one
// again (the coordinator may have been upgraded since).
constexpr absl::Duration kStreamRetry = absl::Minutes(5);
// Answers kept for the agent to take, at most (an older coordinator
// answers every beat; the oldest give way: a reclaim is said again).
constexpr size_t kMaxQueuedAnswers = 16;

// The host's heartbeats on one stream (Coordinator.Heartbeats): a message
// per beat on one HTTP/2 stream rather than a call each, answered only
// when the coordinator has something to say (answer_when_needed): the
// coordinator's cost per heartbeat. gRPC's reactions run on its own
// threads; answers are kept for the agent (TakeAnswers) and `on_answer`
// wakes it. An error ends the stream for good: the agent opens another.
// Destroying it cancels the stream and waits for gRPC's last reaction.
// Send starts writes from outside gRPC's reactions, so the stream is held
// (AddHold) until Send will start no more: without the hold, a stream the
// coordinator ended between Send's look and its StartWrite was already
// freed by gRPC (OnDone), and the write corrupted ptcd's heap.
class HeartbeatStream final
    : public grpc::ClientBidiReactor<proto::HeartbeatRequest,
                                     proto::HeartbeatResponse> {
 public:
  HeartbeatStream(proto::Coordinator::Stub* stub,
                  std::function<void()> on_answer)
      : on_answer_(std::move(on_answer)) {
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

  // Writes `req` once the last beat's write is over (waiting up to
  // `timeout`). The stream's end, as an error: the coordinator's status
  // (UNIMPLEMENTED: it has no such stream), or DEADLINE_EXCEEDED where
  // the last write did not finish in time or no answer came for
  // `silence` (the stream is then cancelled). A beat written as the
  // stream ends is lost: the next one finds it ended.
  absl::Status Send(const proto::HeartbeatRequest& req, absl::Duration timeout,
                    absl::Duration silence) {
    if (!WaitFor(&HeartbeatStream::WriteOverLocked, absl::Now() + timeout))
      return Cancel(absl::StrCat("the last heartbeat was not written within ",
                                 absl::FormatDuration(timeout)));
    bool silent = false;
    {
      absl::MutexLock lock(&mu_);
      silent = !ended_ && absl::Now() - heard_at_ > silence;
      if (!ended_ && !silent) {
        out_ = req;
        writing_ = true;
      }
    }
    if (silent) {
      return Cancel(absl::StrCat("no answer on the heartbeat stream for ",
                                 absl::FormatDuration(silence)));
    }
    if (!Ended()) {
      StartWrite(&out_);  // held: the stream is alive, ended or not
      return absl::OkStatus();
    }
    // The stream ended: no more writes; its status once gRPC is done.
    Release();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return EndedLocked();
  }

  // The answers that came since the last call, oldest first.
  std::vector<proto::HeartbeatResponse> TakeAnswers() {
    absl::MutexLock lock(&mu_);
    return std::exchange(answers_, {});
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
      if (answers_.size() == kMaxQueuedAnswers)
        answers_.erase(answers_.begin());
      answers_.push_back(std::move(in_));
      in_.Clear();
      heard_at_ = absl::Now();
    }
    on_answer_();
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
  absl::Status Cancel(const std::string& why) {
    ctx_.TryCancel();
    return absl::DeadlineExceededError(why);
  }

  const std::function<void()> on_answer_;
  grpc::ClientContext ctx_;
  proto::HeartbeatRequest out_;  // the beat being written
  proto::HeartbeatResponse in_;  // the answer being read
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::HeartbeatResponse> answers_ ABSL_GUARDED_BY(mu_);
  // The last answer's arrival (the stream's start before one).
  absl::Time heard_at_ ABSL_GUARDED_BY(mu_) = absl::Now();
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
  // The last registration or beat: the next is due half an interval on.
  absl::Time tick = absl::InfinitePast();
  do {
    // What the coordinator said since the last look, oldest first.
    std::vector<proto::HeartbeatResponse> answers;
    if (absl::Now() >= tick + interval / 2) {
      tick = absl::Now();
      if (!registered) {
        registered = Register(*stub, &interval, &refused);
      } else {
        proto::HeartbeatRequest req;
        req.set_name(host_.name());
        req.set_incarnation(host_.incarnation());
        req.set_answer_when_needed(true);
        if (store_ != nullptr) {
          for (const auto& v : store_->Versions()) *req.add_versions() = v;
          req.set_memory_used_bytes(store_->memory_used());
        }
        absl::Status sent = absl::UnavailableError("not sent");
        if (absl::Now() >= calls_until) {
          if (stream == nullptr) {
            stream = std::make_unique<HeartbeatStream>(stub.get(),
                                                       [this] { Wake(); });
          }
          sent = stream->Send(req, kBeatWithin, kSilentStream + interval);
          if (!sent.ok()) {  // the next beat opens another
            answers = stream->TakeAnswers();
            stream.reset();
          }
          if (absl::IsUnimplemented(sent) || absl::IsResourceExhausted(sent)) {
            Log("transformer")
                ->info(
                    "the coordinator at {} takes no heartbeat stream ({}); "
                    "heartbeats are calls for {}",
                    coordinator_, sent.ToString(),
                    absl::FormatDuration(kStreamRetry));
            calls_until = absl::Now() + kStreamRetry;
          }
        }
        if (!sent.ok()) {
          // By call: the coordinator takes no stream, or the stream just
          // ended (the beat is not skipped). A call is always answered.
          grpc::ClientContext call;
          call.set_deadline(absl::ToChronoTime(absl::Now() + kBeatWithin));
          proto::HeartbeatResponse resp;
          const grpc::Status s = stub->Heartbeat(&call, req, &resp);
          if (s.ok()) {
            answers.push_back(std::move(resp));
          } else {
            Log("transformer")
                ->debug("heartbeat to {}: {}", coordinator_, s.error_message());
          }
        }
      }
    }
    if (stream != nullptr) {
      for (auto& a : stream->TakeAnswers()) answers.push_back(std::move(a));
    }
    for (const proto::HeartbeatResponse& resp : answers) {
      if (!registered) break;  // said of the registration before
      if (resp.heartbeat_interval_seconds() > 0)
        interval = ToldInterval(resp.heartbeat_interval_seconds());
      if (!resp.known()) {
        Log("transformer")
            ->warn(
                "the coordinator does not know {} any more; registering again",
                host_.name());
        registered = false;
        // The stream's later answers are for beats sent before the host
        // registers again: a late "not known" among them would make it
        // register once more. Beats after the registration go on a new
        // stream, whose answers are theirs.
        stream.reset();
        break;
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
  } while (!WaitUntil(tick + interval / 2));
}

bool CoordinatorAgent::Register(proto::Coordinator::Stub& stub,
                                absl::Duration* interval,
                                std::string* refused) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::RegisterHostRequest req;
  *req.mutable_host() = host_;
  proto::RegisterHostResponse resp;
  const grpc::Status s = stub.RegisterHost(&ctx, req, &resp);
  if (s.ok()) {
    if (resp.heartbeat_interval_seconds() > 0)
      *interval = ToldInterval(resp.heartbeat_interval_seconds());
    Log("transformer")
        ->info("registered with the coordinator at {} as {}", coordinator_,
               host_.name());
    return true;
  }
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
      s.error_message() != *refused) {
    // Refused, not unreachable (a certificate that names another host, a
    // bad field): said once per reason, retried all the same.
    *refused = s.error_message();
    Log("transformer")
        ->warn("the coordinator at {} refused to register {}: {}", coordinator_,
               host_.name(), *refused);
  } else {
    Log("transformer")
        ->debug("registering with {}: {}", coordinator_, s.error_message());
  }
  return false;
}

void CoordinatorAgent::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

bool CoordinatorAgent::WaitUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(this, &CoordinatorAgent::DueLocked),
                        deadline);
  woken_ = false;
  return stop_;
}

}  // namespace ptc
