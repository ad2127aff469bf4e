#include "ptcd/coordinator_relay.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

Counter& relayed_calls_total = GetCounter("ptc_relay_calls_total");
Counter& refused_calls_total = GetCounter("ptc_relay_refused_calls_total");

constexpr char kCoordinatorPrefix[] = "/ptc.proto.Coordinator/";

}  // namespace

// One relayed call: the process's side (a generic server reactor, "down")
// and the coordinator's (a generic client reactor, "up"), each message
// passed on before the next is read, in both directions. The call ends
// with the coordinator's status; it is deleted once both sides are done.
//
// Every Coordinator method takes one request (unary, or a server stream
// such as Watch): the relay reads the process's first message, sends it
// up as the last, and reads nothing more (a process cannot park messages
// in the relay). Only then does the call count against the relay's bounds
// and go upstream: a call that never sends its request holds no slot and
// no call at the coordinator (a connection's streams are bounded, see
// Start).
//
// The up side's operations started from the down side's reactions need
// the up reactor alive: two holds keep it so. Hold A covers the request
// going up (released once it is written, or the process half-closed or
// left without one); hold B covers each answer being written down (the
// next up read is started when it is written; B is added in the up
// side's own reaction, which keeps the call alive meanwhile). So the up
// side ends, and the down side is finished with its status, only once
// nothing of the down side can touch it again.
class CoordinatorRelay::Call {
 public:
  Call(CoordinatorRelay* relay, grpc::GenericCallbackServerContext* ctx)
      : relay_(relay),
        ctx_(ctx),
        user_(relay->UserOf(ctx->peer())),
        down_(this),
        up_(this) {
    const std::string& method = ctx->method();
    if (!absl::StartsWith(method, kCoordinatorPrefix)) {
      Refuse(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          absl::StrCat("this socket relays ptc's coordinator "
                                       "calls only, not ",
                                       method)));
      return;
    }
    if (TlsEnabled() && ctx->client_metadata().count(kJobTokenMetadata) == 0) {
      // A call without a token must not reach the coordinator on the
      // host's connection at all (not even ListHosts, which a job's client
      // may call without naming a job).
      Refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "a call through ptcd's coordinator relay needs its "
                          "job's token (PTC_JOB_TOKEN; ptcctl token JOB)"));
      return;
    }
    down_.StartRead(&from_down_);
  }

  grpc::ServerGenericBidiReactor* reactor() { return &down_; }

 private:
  struct Down : grpc::ServerGenericBidiReactor {
    explicit Down(Call* c) : call(c) {}
    void OnReadDone(bool ok) override { call->DownRead(ok); }
    void OnWriteDone(bool ok) override { call->DownWritten(ok); }
    void OnCancel() override { call->up_ctx_.TryCancel(); }
    void OnDone() override { call->SideDone(/*down=*/true); }
    Call* call;
  };
  struct Up : grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
    explicit Up(Call* c) : call(c) {}
    void OnReadDone(bool ok) override { call->UpRead(ok); }
    void OnWriteDone(bool ok) override { call->UpWritten(ok); }
    void OnDone(const grpc::Status& s) override { call->UpDone(s); }
    Call* call;
  };

  // Refused before anything went upstream: the call has one side.
  void Refuse(const grpc::Status& status) {
    refused_calls_total.Add();
    down_.Finish(status);
  }

  // The process's request, or none (!ok: it half-closed or went away).
  void DownRead(bool ok) {
    if (!ok) {
      down_.Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                "the call ended before its request came"));
      return;
    }
    if (absl::Status taken = relay_->TakeSlot(user_); !taken.ok()) {
      Refuse(ToGrpcStatus(taken));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      relayed_ = true;
    }
    relayed_calls_total.Add();
    if (ctx_->deadline() != std::chrono::system_clock::time_point::max())
      up_ctx_.set_deadline(ctx_->deadline());
    const auto& metadata = ctx_->client_metadata();
    if (auto it = metadata.find(kJobTokenMetadata); it != metadata.end()) {
      up_ctx_.AddMetadata(kJobTokenMetadata,
                          std::string(it->second.data(), it->second.size()));
    }
    up_ctx_.AddMetadata(kRelayedMetadata, "1");
    relay_->upstream_->PrepareBidiStreamingCall(&up_ctx_, ctx_->method(), {},
                                                &up_);
    up_.AddHold();  // A
    up_.StartRead(&from_up_);
    up_.StartWriteLast(&from_down_, grpc::WriteOptions());
    up_.StartCall();
  }
  void UpWritten(bool /*ok*/) {
    // Sent, or the coordinator's side ended (UpDone says how).
    up_.RemoveHold();  // A
  }
  // The coordinator answered a message, or has no more (!ok: its status
  // follows in UpDone).
  void UpRead(bool ok) {
    if (!ok) return;
    up_.AddHold();  // B
    down_.StartWrite(&from_up_);
  }
  void DownWritten(bool ok) {
    if (ok) {
      up_.StartRead(&from_up_);
    } else {
      up_ctx_.TryCancel();  // the process went away
    }
    up_.RemoveHold();  // B
  }
  void UpDone(const grpc::Status& s) {
    // Before Finish: once the down side is done the relay may stop and go.
    relay_->GiveSlot(user_);
    // An UNAVAILABLE is marked as the coordinator's: the process reached
    // this relay, and asks again through it rather than on a connection
    // of its own.
    down_.Finish(MarkRelayUpstream(s));
    SideDone(/*down=*/false);
  }
  void SideDone(bool down) {
    {
      absl::MutexLock lock(&mu_);
      (down ? down_done_ : up_done_) = true;
      if (!down_done_ || (relayed_ && !up_done_)) return;
    }
    delete this;
  }

  CoordinatorRelay* relay_;
  // Lives until the down side is done.
  grpc::GenericCallbackServerContext* ctx_;
  // Who called: the user the relay's accept identified on the connection.
  const int64_t user_ = -1;
  Down down_;
  Up up_;
  grpc::ClientContext up_ctx_;
  grpc::ByteBuffer from_down_;
  grpc::ByteBuffer from_up_;
  absl::Mutex mu_;
  // The call went upstream (it has two sides).
  bool relayed_ ABSL_GUARDED_BY(mu_) = false;
  bool down_done_ ABSL_GUARDED_BY(mu_) = false;
  bool up_done_ ABSL_GUARDED_BY(mu_) = false;
};

class CoordinatorRelay::Service : public grpc::CallbackGenericService {
 public:
  explicit Service(CoordinatorRelay* relay) : relay_(relay) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    return (new Call(relay_, ctx))->reactor();
  }

 private:
  CoordinatorRelay* relay_;
};

int64_t CoordinatorRelay::UserOf(const std::string& peer) const {
  int fd = -1;
  if (!absl::StartsWith(peer, "fd:") ||
      !absl::SimpleAtoi(absl::string_view(peer).substr(3), &fd)) {
    return -1;
  }
  absl::MutexLock lock(&slots_mu_);
  auto it = user_of_fd_.find(fd);
  return it == user_of_fd_.end() ? -1 : it->second;
}

absl::Status CoordinatorRelay::TakeSlot(int64_t user) {
  absl::MutexLock lock(&slots_mu_);
  if (active_.load() >= options_.max_calls) {
    return BusyError(
        absl::StrCat("this ptcd relays ", options_.max_calls,
                     " coordinator calls at once; ask again shortly"));
  }
  int& mine = calls_of_user_[user];
  if (mine >= options_.max_calls_per_user) {
    return BusyError(absl::StrCat(
        "uid ", user, " has ", mine,
        " coordinator calls through this ptcd at once, the most one user may "
        "(the rest are kept for others); ask again shortly"));
  }
  ++mine;
  active_.fetch_add(1);
  return absl::OkStatus();
}

void CoordinatorRelay::GiveSlot(int64_t user) {
  absl::MutexLock lock(&slots_mu_);
  auto it = calls_of_user_.find(user);
  if (it != calls_of_user_.end() && --it->second <= 0) calls_of_user_.erase(it);
  active_.fetch_sub(1);
}

std::string RelaySocketFor(const std::string& local_socket) {
  if (absl::EndsWith(local_socket, ".sock")) {
    return absl::StrCat(local_socket.substr(0, local_socket.size() - 5),
                        "-coordinator.sock");
  }
  return absl::StrCat(local_socket, ".coordinator");
}

absl::StatusOr<std::unique_ptr<CoordinatorRelay>> CoordinatorRelay::Start(
    CoordinatorRelayOptions options) {
  if (options.coordinator.empty())
    return absl::InvalidArgumentError("the relay needs a coordinator address");
  std::unique_ptr<CoordinatorRelay> r(new CoordinatorRelay(std::move(options)));
  grpc::ChannelArguments args;
  // The process's own client retries what the coordinator refuses for
  // busy threads; a second layer of retries here would multiply them.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // The process's client enforces its own limit on answers.
  args.SetMaxReceiveMessageSize(-1);
  // Its own connection, even where one process hosts many relays (the
  // scale harness's hollow hosts): one per host, as on a cluster.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A coordinator that restarted is tried again within seconds (gRPC's
  // default backoff grows to two minutes, failing every relayed call
  // meanwhile).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  r->upstream_ = std::make_unique<grpc::GenericStub>(
      OpenChannel(r->options_.coordinator, args, "coordinator"));
  r->service_ = std::make_unique<Service>(r.get());
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxCoordinatorRequestBytes);
  // A process's connection with no call for five minutes is closed (its
  // channel connects again when it next calls).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60 * 1000);
  // Calls waiting for their request hold no slot (Call): a connection may
  // have twice as many streams open as the relay has slots, no more (a
  // client queues the rest; below it, calls beyond the slots are refused,
  // not queued).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             2 * r->options_.max_calls);
  builder.RegisterCallbackGenericService(r->service_.get());
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr)
    return absl::InternalError("the coordinator relay's server did not start");
  PTC_ASSIGN_OR_RETURN(
      r->listen_fd_,
      ListenLocal(r->options_.socket_path, SOCK_STREAM, r->options_.access));
  r->accept_thread_ = std::thread([relay = r.get()] { relay->AcceptLoop(); });
  Log("tensor_store")
      ->info("coordinator relay {} ready (to {})", r->options_.socket_path,
             r->options_.coordinator);
  return r;
}

CoordinatorRelay::CoordinatorRelay(CoordinatorRelayOptions options)
    : options_(std::move(options)) {}

CoordinatorRelay::~CoordinatorRelay() { Stop(); }

void CoordinatorRelay::Stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(options_.socket_path.c_str());
  }
  // Cancels the calls in flight (a Watch stream never ends by itself) and
  // waits for their reactors.
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

void CoordinatorRelay::AcceptLoop() {
  while (!stopping_) {
    // Non-blocking: gRPC's poller serves the connection.
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory for now: keep serving.
      Log("tensor_store")
          ->warn("accept on the coordinator relay: {}; retrying in 100 ms",
                 std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const LocalPeer peer = IdentifyLocalPeer(fd);
    if (std::string why = RefusalOf(peer, fd, options_.access); !why.empty()) {
      // gRPC's client sees the connection closed (UNAVAILABLE); the same
      // user was already told why by the local socket.
      Log("security")
          ->warn("coordinator relay refused pid {} uid {}: {}", peer.pid,
                 peer.uid, why);
      close(fd);
      continue;
    }
    {
      // A descriptor's number is reused only after gRPC closed its last
      // connection, whose calls were done with it.
      absl::MutexLock lock(&slots_mu_);
      user_of_fd_[fd] = peer.known ? int64_t{peer.uid} : -1;
    }
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
  }
}

}  // namespace ptc
