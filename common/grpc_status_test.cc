#include "common/grpc_status.h"

#include <string>

#include "catch2/catch.hpp"

namespace ptc {
namespace {

TEST_CASE("grpc status: code, message and ptc payloads cross, nothing else",
          "[common]") {
  absl::Status s = absl::FailedPreconditionError("no worker here");
  s.SetPayload("ptc/no-ucx-worker", absl::Cord("1"));
  s.SetPayload("other/key", absl::Cord("x"));
  s.SetPayload("ptc/too-big", absl::Cord(std::string(2000, 'x')));
  const grpc::Status wire = ToGrpcStatus(s);
  const absl::Status back = FromGrpcStatus(wire);
  CHECK(back.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(back.message() == "no worker here");
  CHECK(back.GetPayload("ptc/no-ucx-worker") == absl::Cord("1"));
  CHECK_FALSE(back.GetPayload("other/key").has_value());
  CHECK_FALSE(back.GetPayload("ptc/too-big").has_value());
  CHECK(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
}

TEST_CASE("grpc status: hostile details from a peer are bounded or dropped",
          "[common]") {
  // Not a payload message at all.
  const absl::Status junk = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "down", "\xff\xff\xff"));
  CHECK(junk.code() == absl::StatusCode::kUnavailable);
  CHECK(junk.message() == "down");
  // Payloads outside ptc/, and more than the bound: dropped.
  absl::Status many = absl::InternalError("many");
  for (int i = 0; i < 40; ++i)
    many.SetPayload("ptc/p" + std::to_string(i), absl::Cord("v"));
  int arrived = 0;
  FromGrpcStatus(ToGrpcStatus(many))
      .ForEachPayload([&](absl::string_view, const absl::Cord&) { ++arrived; });
  CHECK(arrived == kMaxWirePayloads);
  // An enormous details string is not parsed.
  const absl::Status huge = FromGrpcStatus(grpc::Status(
      grpc::StatusCode::INTERNAL, "huge", std::string(1 << 20, '\x0a')));
  int none = 0;
  huge.ForEachPayload([&](absl::string_view, const absl::Cord&) { ++none; });
  CHECK(none == 0);
}

}  // namespace
}  // namespace ptc
