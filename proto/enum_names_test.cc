#include "proto/enum_names.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("enum names: every phase, transport and strategy reads short",
          "[proto]") {
  CHECK(PhaseName(proto::PHASE_NONE) == "none");
  CHECK(PhaseName(proto::PHASE_STAGING) == "staging");
  CHECK(PhaseName(proto::PHASE_COMMITTING) == "committing");
  CHECK(PhaseName(proto::PHASE_COMMITTED) == "committed");
  CHECK(PhaseEnded(proto::PHASE_ABORTED));
  CHECK_FALSE(PhaseEnded(proto::PHASE_VERIFYING));
  CHECK(TransportName(proto::TRANSPORT_GRPC) == "grpc");
  CHECK(StrategyName(proto::PLAN_STRATEGY_TENPLEX) == "tenplex");
  CHECK(PlacementName(proto::PLACEMENT_CONTIGUOUS) == "contiguous");
  CHECK(ParsePlacement("explicit").value() == proto::PLACEMENT_EXPLICIT);
}

TEST_CASE("enum names: the flags parse back, and a wrong one lists the names",
          "[proto]") {
  for (int v = 0; v < proto::Transport_ARRAYSIZE; ++v) {
    const auto t = static_cast<proto::Transport>(v);
    CHECK(ParseTransport(TransportName(t)).value() == t);
  }
  CHECK(ParseTransport("").value() == proto::TRANSPORT_AUTO);
  CHECK(ParseStrategy("").value() == proto::PLAN_STRATEGY_PTC);
  CHECK(ParseStrategy("tenplex").value() == proto::PLAN_STRATEGY_TENPLEX);
  const absl::Status bad = ParseTransport("rdma").status();
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.message() == "transport 'rdma' is unknown; use auto, ucx, grpc");
  CHECK(ParseStrategy("PLAN_STRATEGY_PTC").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ptc
