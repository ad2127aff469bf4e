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

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ptc {

inline constexpr char kWirePayloadPrefix[] = "ptc/";
inline constexpr int kMaxWirePayloads = 16;
inline constexpr int kMaxWirePayloadBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A call (`call(&ctx)`, returning a grpc::Status), asked again after a
// jittered pause that grows to a second, until `deadline`:
// - while it is refused for busy RPC threads (RESOURCE_EXHAUSTED: thousands
//   of a job's processes asking at once; a refused call never ran). A
//   channel's own retries (common/channel.h) give up after five attempts;
// - up to `max_unavailable` times while it fails UNAVAILABLE: a connection
//   reset or a ping left unanswered by a server under load, one failing
//   over, or a coordinator asking to report again.
// `*unavailable` counts the attempts that failed UNAVAILABLE; the last
// status is returned. A RESOURCE_EXHAUSTED for another reason (a quota
// that etcd or a host's memory budget refused, passed on by the
// coordinator) is asked again too, and comes back at the deadline: such a
// refusal changed nothing, so asking again is safe, only slower.
template <typename Call>
absl::Status AskPatiently(absl::Time deadline, int max_unavailable, Call call,
                          int* unavailable) {
  absl::BitGen random;
  absl::Duration pause = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    const absl::Status s = FromGrpcStatus(call(&ctx));
    bool again = absl::IsResourceExhausted(s);
    if (absl::IsUnavailable(s)) again = ++*unavailable <= max_unavailable;
    if (!again || absl::Now() + pause > deadline) return s;
    absl::SleepFor(pause * absl::Uniform(random, 0.5, 1.5));
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

}  // namespace ptc

#endif  // PTC_COMMON_GRPC_STATUS_H_
