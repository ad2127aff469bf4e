// Who may call an RPC. With mutual TLS every caller shows a certificate the
// cluster CA signed, and its name (CN) says what it is:
//   a host name    a ptcd (tools/ptc-certs DIR host NAME)
//   coordinator    the coordinator
//   admin          an operator or scheduler (ptcctl)
//   client:JOB     a training job's processes, for job JOB only
//   client         a training job's processes, for the job of the token
//                  their calls carry (common/job_token.h)
// Each RPC states in the proto which of these it admits; the service checks
// it first with Authorize, or AuthorizeJob where the request names a job
// (a client acts on its own job only). Without TLS (--insecure) nobody is
// authenticated and every call is admitted.
//
//   PTC_RETURN_IF_ERROR(Authorize(*ctx, kCoordinator | kAdmin, "DeleteJob"));
//   PTC_RETURN_IF_ERROR(AuthorizeJob(*ctx, kClient | kAdmin, "BeginSave",
//                                    req.job()));
#ifndef PTC_COMMON_AUTHZ_H_
#define PTC_COMMON_AUTHZ_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// OK if TLS is off or the caller is one of `allowed`; PERMISSION_DENIED
// naming the RPC, the caller and who may call it otherwise (and a warning
// in the log).
absl::Status Authorize(const grpc::ServerContext& ctx, unsigned allowed,
                       const char* rpc);

// Authorize, and a client caller must act on `job`: its certificate names
// it (client:JOB) or its token was issued for it. PERMISSION_DENIED names
// the job the caller may act on; UNAUTHENTICATED says what is wrong with a
// missing or bad token.
absl::Status AuthorizeJob(const grpc::ServerContext& ctx, unsigned allowed,
                          const char* rpc, const std::string& job);

// The one job a client caller may act on (from its certificate or token);
// nullopt for every other caller and without TLS. For RPCs that list jobs:
// a client sees its own.
absl::StatusOr<std::optional<std::string>> ClientJob(
    const grpc::ServerContext& ctx);

}  // namespace ptc

#endif  // PTC_COMMON_AUTHZ_H_
