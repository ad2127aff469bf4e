#include "common/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "proto/status_payloads.pb.h"

namespace ptc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  proto::StatusPayloads payloads;
  status.ForEachPayload([&](absl::string_view key, const absl::Cord& value) {
    if (absl::StartsWith(key, kWirePayloadPrefix) &&
        payloads.payloads_size() < kMaxWirePayloads &&
        value.size() <= static_cast<size_t>(kMaxWirePayloadBytes)) {
      (*payloads.mutable_payloads())[std::string(key)] = std::string(value);
    }
  });
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (payloads.payloads().empty())
    return grpc::Status(code, std::string(status.message()));
  return grpc::Status(code, std::string(status.message()),
                      payloads.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  // gRPC's own busy refusal is known only by its message, which any
  // Annotate (status_macros.h) changes: mark it here, where it is first
  // seen, so that it is still busy once annotated.
  if (IsBusy(out)) out.SetPayload(kBusyUrl, absl::Cord("1"));
  proto::StatusPayloads payloads;
  const std::string& details = status.error_details();
  if (details.empty() ||
      details.size() > static_cast<size_t>(kMaxWirePayloads *
                                           (kMaxWirePayloadBytes + 256)) ||
      !payloads.ParseFromString(details)) {
    return out;
  }
  int taken = 0;
  for (const auto& [key, value] : payloads.payloads()) {
    if (taken == kMaxWirePayloads) break;
    if (!absl::StartsWith(key, kWirePayloadPrefix) || key.size() > 128 ||
        value.size() > static_cast<size_t>(kMaxWirePayloadBytes))
      continue;
    out.SetPayload(key, absl::Cord(value));
    ++taken;
  }
  return out;
}

absl::Status BusyError(absl::string_view message) {
  absl::Status s = absl::ResourceExhaustedError(message);
  s.SetPayload(kBusyUrl, absl::Cord("1"));
  return s;
}

grpc::Status MarkRelayUpstream(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
  absl::Status marked = FromGrpcStatus(status);
  marked.SetPayload(kRelayUpstreamUrl, absl::Cord("1"));
  return ToGrpcStatus(marked);
}

bool IsRelayUpstream(const absl::Status& status) {
  return absl::IsUnavailable(status) &&
         status.GetPayload(kRelayUpstreamUrl).has_value();
}

bool IsBusy(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return false;
  // gRPC's sync server, when no RPC thread is free (grpc 1.51,
  // src/cpp/server/server_cc.cc).
  constexpr absl::string_view kThreadsBusy = "Server Threadpool Exhausted";
  return status.GetPayload(kBusyUrl).has_value() ||
         status.message() == kThreadsBusy;
}

}  // namespace ptc
