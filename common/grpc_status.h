// The one place where gRPC and absl statuses are converted. A status's
// payloads under "ptc/" (why it failed, for callers to decide by) travel
// with it as the gRPC status's binary details; what arrives from a peer is
// bounded (at most kMaxWirePayloads of kMaxWirePayloadBytes each) and
// anything else in the details is dropped.
//
//   return ToGrpcStatus(store->Commit(job, version));
//   absl::Status s = FromGrpcStatus(stub->Stats(&ctx, req, &resp));
#ifndef PTC_COMMON_GRPC_STATUS_H_
#define PTC_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ptc {

inline constexpr char kWirePayloadPrefix[] = "ptc/";
inline constexpr int kMaxWirePayloads = 16;
inline constexpr int kMaxWirePayloadBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ptc

#endif  // PTC_COMMON_GRPC_STATUS_H_
