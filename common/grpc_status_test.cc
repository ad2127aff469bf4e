#include "common/grpc_status.h"

#include <string>
#include <vector>

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

TEST_CASE(
    "AskPatiently: asks again while refused for busy threads, a few times "
    "while unavailable, never after another error or past its deadline",
    "[common]") {
  // The statuses the server answers, in order; then OK.
  auto server = [](std::vector<grpc::StatusCode> answers, int* calls) {
    return [answers = std::move(answers), calls](grpc::ClientContext* ctx) {
      REQUIRE(ctx != nullptr);
      const int i = (*calls)++;
      if (i >= static_cast<int>(answers.size())) return grpc::Status::OK;
      return grpc::Status(answers[i], "answer " + std::to_string(i));
    };
  };
  const absl::Time later = absl::Now() + absl::Seconds(60);
  int calls = 0, unavailable = 0;
  CHECK(AskPatiently(later, 0,
                     server({grpc::StatusCode::RESOURCE_EXHAUSTED,
                             grpc::StatusCode::RESOURCE_EXHAUSTED,
                             grpc::StatusCode::RESOURCE_EXHAUSTED},
                            &calls),
                     &unavailable)
            .ok());
  CHECK(calls == 4);
  CHECK(unavailable == 0);

  calls = unavailable = 0;
  const absl::Status down = AskPatiently(
      later, 0, server({grpc::StatusCode::UNAVAILABLE}, &calls), &unavailable);
  CHECK(absl::IsUnavailable(down));
  CHECK(down.message() == "answer 0");
  CHECK(calls == 1);

  calls = unavailable = 0;
  CHECK(AskPatiently(later, 2,
                     server({grpc::StatusCode::UNAVAILABLE,
                             grpc::StatusCode::RESOURCE_EXHAUSTED,
                             grpc::StatusCode::UNAVAILABLE},
                            &calls),
                     &unavailable)
            .ok());
  CHECK(calls == 4);
  CHECK(unavailable == 2);

  calls = unavailable = 0;
  const absl::Status refused = AskPatiently(
      later, 5,
      server({grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::OK},
             &calls),
      &unavailable);
  CHECK(absl::IsInvalidArgument(refused));
  CHECK(calls == 1);

  // Refused for as long as it asks: it stops once the next pause would
  // pass the deadline, with the last answer.
  calls = unavailable = 0;
  const absl::Time start = absl::Now();
  const absl::Status busy =
      AskPatiently(start + absl::Milliseconds(300), 0,
                   server(std::vector<grpc::StatusCode>(
                              1000, grpc::StatusCode::RESOURCE_EXHAUSTED),
                          &calls),
                   &unavailable);
  CHECK(absl::IsResourceExhausted(busy));
  CHECK(calls >= 2);
  CHECK(calls < 1000);
}

}  // namespace
}  // namespace ptc
