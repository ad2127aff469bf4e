// The one place where gRPC and absl statuses are converted. A status's
// payloads under "ptc/" (why it failed, for callers to decide by) travel
// with it as the gRPC status's binary details; what arrives from a peer is
// bounded (at most kMaxWirePayloads of kMaxWirePayloadBytes each) and
// anything else in the details is dropped.
//
//   return ToGrpcStatus(store->Commit(job, version));
//   absl::Status s = FromGrpcStatus(stub->Stats(&ctx, req, &resp));
//
// AskPatiently asks a call again while a busy server refuses it:
//
//   int unavailable = 0;
//   absl::Status s = AskPatiently(deadline, 3, [&](grpc::ClientContext* ctx) {
//     return stub->ListJobs(ctx, req, &resp);
//   }, &unavailable);
#ifndef PTC_COMMON_GRPC_STATUS_H_
#define PTC_COMMON_GRPC_STATUS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <algorithm>
#include <functional>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ptc {

inline constexpr char kWirePayloadPrefix[] = "ptc/";
inline constexpr int kMaxWirePayloads = 16;
inline constexpr int kMaxWirePayloadBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A refusal for load: the server (or a ptcd relaying to it) was too busy
// to take the call and ran none of it, so asking again later may be
// answered. RESOURCE_EXHAUSTED marked so (kBusyUrl), or gRPC's own
// refusal when all of a sync server's RPC threads are busy. A
// RESOURCE_EXHAUSTED without either is a quota (etcd's space, a host's
// memory budget, a message too large): asked again, it is refused again.
inline constexpr char kBusyUrl[] = "ptc/busy";
absl::Status BusyError(absl::string_view message);
bool IsBusy(const absl::Status& status);

// An UNAVAILABLE that a host's ptcd relay (ptcd/coordinator_relay.h)
// answered for its coordinator: the process reached the relay, the relay
// did not reach the coordinator (its connection being made again after a
// reset, or the coordinator down). Unmarked, an UNAVAILABLE through the
// relay means the relay itself was not reached.
inline constexpr char kRelayUpstreamUrl[] = "ptc/relay-upstream";
grpc::Status MarkRelayUpstream(const grpc::Status& status);
bool IsRelayUpstream(const absl::Status& status);

// The pauses between askings of a call refused for load: jittered, from
// 50 ms growing to a second. Wait() sleeps the next one, or returns false
// at once when it would end past `deadline`.
class Backoff {
 public:
  bool Wait(absl::Time deadline) {
    if (absl::Now() + pause_ > deadline) return false;
    absl::SleepFor(pause_ * absl::Uniform(random_, 0.5, 1.5));
    pause_ = std::min(pause_ * 2, absl::Seconds(1));
    return true;
  }

 private:
  absl::BitGen random_;
  absl::Duration pause_ = absl::Milliseconds(50);
};

// `call()` (returning an absl::StatusOr), asked again after Backoff's
// pauses while it is refused for load (IsBusy), until `deadline` or, when
// given, until `stop()` says so (the change it serves was cancelled: a
// busy source is not asked again for minutes after); its last answer.
template <typename Call>
auto AskWhileBusy(absl::Time deadline, Call call,
                  const std::function<bool()>& stop = nullptr)
    -> decltype(call()) {
  Backoff backoff;
  while (true) {
    auto got = call();
    if (got.ok() || !IsBusy(got.status()) || (stop && stop()) ||
        !backoff.Wait(deadline) || (stop && stop()))
      return got;
  }
}

// A call (`call(&ctx)`, returning a grpc::Status), asked again after a
// jittered pause that grows to a second, until `deadline`:
// - while it is refused for load (IsBusy: thousands of a job's processes
//   asking at once; a refused call never ran). A channel's own retries
//   (common/channel.h) give up after five attempts;
// - up to `max_unavailable` times while it fails UNAVAILABLE: a connection
//   reset or a ping left unanswered by a server under load, one failing
//   over, or a coordinator asking to report again.
// `*unavailable` counts the attempts that failed UNAVAILABLE; the last
// status is returned. Any other error returns at once, a quota's
// RESOURCE_EXHAUSTED too (etcd's space, passed on by the coordinator):
// asked again, it would be refused until the deadline.
template <typename Call>
absl::Status AskPatiently(absl::Time deadline, int max_unavailable, Call call,
                          int* unavailable) {
  Backoff backoff;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    const absl::Status s = FromGrpcStatus(call(&ctx));
    bool again = IsBusy(s);
    if (absl::IsUnavailable(s)) again = ++*unavailable <= max_unavailable;
    if (!again || !backoff.Wait(deadline)) return s;
  }
}

}  // namespace ptc

#endif  // PTC_COMMON_GRPC_STATUS_H_
