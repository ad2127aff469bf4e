#include "common/grpc_status.h"

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "catch2/catch.hpp"
#include "common/status_macros.h"

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

TEST_CASE(
    "grpc status: a relay's mark crosses, on UNAVAILABLE only, and an "
    "annotated status keeps it",
    "[common]") {
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE, "reset");
  const absl::Status marked = FromGrpcStatus(MarkRelayUpstream(unavailable));
  CHECK(IsRelayUpstream(marked));
  CHECK(marked.message() == "reset");
  CHECK_FALSE(IsRelayUpstream(FromGrpcStatus(unavailable)));
  // Another code is passed on as it is.
  const grpc::Status missing(grpc::StatusCode::NOT_FOUND, "no such job");
  const grpc::Status passed = MarkRelayUpstream(missing);
  CHECK(passed.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(passed.error_details().empty());
  // Annotated on its way up, a status says what its payloads said.
  const absl::Status annotated = Annotate(marked, "asking the coordinator");
  CHECK(annotated.message() == "asking the coordinator: reset");
  CHECK(IsRelayUpstream(annotated));
  CHECK(IsBusy(Annotate(BusyError("busy"), "saving")));
  // gRPC's own refusal (no RPC thread free) is busy once annotated too;
  // another RESOURCE_EXHAUSTED is not.
  CHECK(IsBusy(
      Annotate(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                           "Server Threadpool Exhausted")),
               "pulling a piece")));
  CHECK_FALSE(IsBusy(Annotate(
      FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                  "etcdserver: mvcc: database space exceeded")),
      "saving")));
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
  // Asks a server that answers `answers` in order (RESOURCE_EXHAUSTED as
  // gRPC refuses for busy threads), then OK; `calls` and
  // `unavailable` count what it was asked and what failed UNAVAILABLE.
  int calls = 0, unavailable = 0;
  auto ask = [&](absl::Time deadline, int max_unavailable,
                 std::vector<grpc::StatusCode> answers) {
    calls = unavailable = 0;
    return AskPatiently(
        deadline, max_unavailable,
        [&](grpc::ClientContext* ctx) {
          REQUIRE(ctx != nullptr);
          const int i = calls++;
          if (i >= static_cast<int>(answers.size())) return grpc::Status::OK;
          if (answers[i] == grpc::StatusCode::RESOURCE_EXHAUSTED)
            return grpc::Status(answers[i], "Server Threadpool Exhausted");
          return grpc::Status(answers[i], "answer " + std::to_string(i));
        },
        &unavailable);
  };
  using grpc::StatusCode;
  const absl::Time later = absl::Now() + absl::Seconds(60);
  CHECK(ask(later, 0,
            {StatusCode::RESOURCE_EXHAUSTED, StatusCode::RESOURCE_EXHAUSTED,
             StatusCode::RESOURCE_EXHAUSTED})
            .ok());
  CHECK(calls == 4);
  CHECK(unavailable == 0);

  // gRPC's refusal for busy threads, and a ptcd relay's (marked busy).
  calls = unavailable = 0;
  std::vector<grpc::Status> busy_answers = {
      grpc::Status(StatusCode::RESOURCE_EXHAUSTED,
                   "Server Threadpool Exhausted"),
      ToGrpcStatus(BusyError("this ptcd relays 64 coordinator calls at once; "
                             "ask again shortly"))};
  CHECK(AskPatiently(
            later, 0,
            [&](grpc::ClientContext*) {
              const int i = calls++;
              return i < 2 ? busy_answers[i] : grpc::Status::OK;
            },
            &unavailable)
            .ok());
  CHECK(calls == 3);
  // A quota (etcd's space, passed on by the coordinator) returns at once:
  // asked again, it would be refused again.
  calls = 0;
  const absl::Status quota = AskPatiently(
      later, 0,
      [&](grpc::ClientContext*) {
        ++calls;
        return grpc::Status(StatusCode::RESOURCE_EXHAUSTED,
                            "etcdserver: mvcc: database space exceeded");
      },
      &unavailable);
  CHECK(absl::IsResourceExhausted(quota));
  CHECK_FALSE(IsBusy(quota));
  CHECK(calls == 1);

  const absl::Status down = ask(later, 0, {StatusCode::UNAVAILABLE});
  CHECK(absl::IsUnavailable(down));
  CHECK(down.message() == "answer 0");
  CHECK(calls == 1);

  CHECK(ask(later, 2,
            {StatusCode::UNAVAILABLE, StatusCode::RESOURCE_EXHAUSTED,
             StatusCode::UNAVAILABLE})
            .ok());
  CHECK(calls == 4);
  CHECK(unavailable == 2);

  const absl::Status refused =
      ask(later, 5, {StatusCode::INVALID_ARGUMENT, StatusCode::OK});
  CHECK(absl::IsInvalidArgument(refused));
  CHECK(calls == 1);

  // Refused for as long as it asks: it stops once the next pause would
  // pass the deadline, with the last answer.
  const absl::Status busy =
      ask(absl::Now() + absl::Milliseconds(300), 0,
          std::vector<StatusCode>(1000, StatusCode::RESOURCE_EXHAUSTED));
  CHECK(absl::IsResourceExhausted(busy));
  CHECK(calls >= 2);
  CHECK(calls < 1000);
}

TEST_CASE("AskWhileBusy: asks again only while refused for load", "[common]") {
  const absl::Time later = absl::Now() + absl::Seconds(60);
  int calls = 0;
  absl::StatusOr<int> got = AskWhileBusy(later, [&]() -> absl::StatusOr<int> {
    if (++calls <= 2) return BusyError("busy");
    return 7;
  });
  REQUIRE(got.ok());
  CHECK(*got == 7);
  CHECK(calls == 3);
  calls = 0;
  got = AskWhileBusy(later, [&]() -> absl::StatusOr<int> {
    ++calls;
    return absl::ResourceExhaustedError("a host's memory budget");
  });
  CHECK(absl::IsResourceExhausted(got.status()));
  CHECK(calls == 1);
}

TEST_CASE("AskWhileBusy: stops asking once stop() says so", "[common]") {
  // Refused for load until a minute passes; the change it serves is
  // cancelled after the third answer.
  const absl::Time start = absl::Now();
  int calls = 0;
  absl::StatusOr<int> got = AskWhileBusy(
      start + absl::Seconds(60),
      [&]() -> absl::StatusOr<int> {
        ++calls;
        return BusyError("busy");
      },
      [&] { return calls >= 3; });
  CHECK(IsBusy(got.status()));
  CHECK(calls == 3);
  CHECK(absl::Now() - start < absl::Seconds(30));
}

}  // namespace
}  // namespace ptc
