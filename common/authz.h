// Who may call an RPC. With mutual TLS every caller shows a certificate the
// cluster CA signed, and its name (CN) says what it is:
//   a host name    a ptcd (tools/ptc-certs DIR host NAME)
//   coordinator    the coordinator
//   admin          an operator or scheduler (ptcctl)
//   client:JOB     a training job's processes, for job JOB only
//   client         a training job's processes, for the job of the token
//                  their calls carry (common/job_token.h)
// Each RPC declares in its proto which of these it admits, which request
// field names the job a client acts on, and which names the host a host
// speaks for (proto/callers.proto). Every handler passes its call through
// the one path that enforces that declaration, AuthorizeCall, first.
// Without TLS (--insecure) nobody is authenticated and every call is
// admitted.
//
//   if (grpc::Status denied = Admit<proto::Coordinator>(*ctx, "Abort", req);
//       !denied.ok())
//     return denied;
#ifndef PTC_COMMON_AUTHZ_H_
#define PTC_COMMON_AUTHZ_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "google/protobuf/message.h"

namespace ptc {

enum Caller : unsigned {
  kHost = 1,
  kCoordinator = 2,
  kAdmin = 4,
  kClient = 8,
  kAnyCaller = 15,
};

// What a certificate name is.
Caller CallerKind(const std::string& name);

// Metadata a ptcd's coordinator relay (ptcd/coordinator_relay.h) puts on
// the calls it relays for its host's processes.
inline constexpr char kRelayedMetadata[] = "ptc-relayed";

// The name a call is authorized as: its certificate's (PeerName), except
// that a host's call marked relayed (kRelayedMetadata) is a job's client
// ("client": it acts for the job of the token it carries; without one it
// is no one), never the host: a process reaching the coordinator through
// its host's ptcd gains no right of the host's.
std::string CallerName(const grpc::ServerContextBase& ctx);

// The one authorization path: a call of `method` of the service named
// `service` (its full proto name), with request `req`, against what the
// method declares (proto/callers.proto). PERMISSION_DENIED names the RPC,
// the caller and who may call it; a method that declares no callers is
// refused to everyone (and so is one that does not exist, or a request of
// another type: a programming error). `req` is null at the start of a
// client stream (the callers are checked); the handler passes its first
// message again (the job is checked). `job`, when given,
// receives the job the call acts on: the request's, or for a method whose
// empty job is the caller's own, a client's own job.
absl::Status AuthorizeCall(const grpc::ServerContextBase& ctx,
                           absl::string_view service, absl::string_view method,
                           const google::protobuf::Message* req,
                           std::string* job = nullptr);

// AuthorizeCall for a method of the generated gRPC service `Service`, as
// a gRPC status for the handler to return.
template <typename Service>
grpc::Status Admit(const grpc::ServerContextBase& ctx, const char* method,
                   const google::protobuf::Message* req,
                   std::string* job = nullptr) {
  return ToGrpcStatus(
      AuthorizeCall(ctx, Service::service_full_name(), method, req, job));
}

// Whether every method of the service named `service` declares who may
// call it, and every field it names exists as a string in its request:
// INTERNAL naming the first that does not. Servers check at start.
absl::Status CheckCallerPolicies(absl::string_view service);

// The one job a client caller may act on (from its certificate or token);
// nullopt for every other caller and without TLS. For RPCs that list jobs:
// a client sees its own.
absl::StatusOr<std::optional<std::string>> ClientJob(
    const grpc::ServerContextBase& ctx);

}  // namespace ptc

#endif  // PTC_COMMON_AUTHZ_H_
