// The one place where gRPC and absl statuses are converted.
//
//   return ToGrpcStatus(store->Commit(job, version));
//   absl::Status s = FromGrpcStatus(stub->Stats(&ctx, req, &resp));
#ifndef PTC_COMMON_GRPC_STATUS_H_
#define PTC_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ptc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ptc

#endif  // PTC_COMMON_GRPC_STATUS_H_
