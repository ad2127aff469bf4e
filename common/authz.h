// Who may call an RPC. With mutual TLS every caller shows a certificate the
// cluster CA signed, and its name (CN) says what it is:
//   a host name    a ptcd (tools/ptc-certs DIR host NAME)
//   coordinator    the coordinator
//   admin          an operator or scheduler (ptcctl)
//   client:JOB     a training job's processes
// Each RPC states in the proto which of these it admits; the service checks
// it first with Authorize. Without TLS (--insecure) nobody is authenticated
// and every call is admitted.
//
//   PTC_RETURN_IF_ERROR(Authorize(*ctx, kCoordinator | kAdmin, "DeleteJob"));
#ifndef PTC_COMMON_AUTHZ_H_
#define PTC_COMMON_AUTHZ_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"

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

}  // namespace ptc

#endif  // PTC_COMMON_AUTHZ_H_
