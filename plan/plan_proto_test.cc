#include "plan/plan_proto.h"

#include <catch2/catch.hpp>

#include "plan/internal/plan_testing.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"

namespace ptc {
namespace {

// A GPT job from tp=2 on two hosts to tp=4 on four.
absl::StatusOr<testing::TestJob> SmallJob() {
  return testing::MakeJob(
      "gpt:layers=2,hidden=16,heads=4,vocab=30,positions=4", "tp=2,dp=2",
      {0, 1}, "tp=4,dp=2", {1, 2, 3, 0}, Cluster::Uniform(4, 2));
}

TEST_CASE("plan proto: a plan survives the wire and still validates",
          "[coordinator][proto]") {
  auto job = SmallJob();
  REQUIRE(job.ok());
  auto plan = PlanReconfiguration(job->input());
  REQUIRE(plan.ok());
  std::string bytes;
  REQUIRE(PlanToProto(*plan).SerializeToString(&bytes));
  proto::Plan wire;
  REQUIRE(wire.ParseFromString(bytes));
  auto back = PlanFromProto(wire);
  REQUIRE(back.ok());
  CHECK(ValidatePlan(job->input(), *back).ok());
  CHECK(back->summary.cross_host_bytes == plan->summary.cross_host_bytes);
  CHECK(back->summary.host_send_bytes == plan->summary.host_send_bytes);
  CHECK(back->fragments.size() == plan->fragments.size());
  CHECK(back->small_objects.size() == plan->small_objects.size());
  for (size_t i = 0; i < plan->small_objects.size(); ++i) {
    const SmallObjectMove& a = plan->small_objects[i];
    const SmallObjectMove& b = back->small_objects[i];
    CHECK(b.derive_fallback == a.derive_fallback);
    REQUIRE(b.alternates.size() == a.alternates.size());
    for (size_t k = 0; k < a.alternates.size(); ++k) {
      CHECK(b.alternates[k].rank == a.alternates[k].rank);
      CHECK(b.alternates[k].host == a.alternates[k].host);
    }
  }
}

TEST_CASE("plan proto: the summary alone is the whole plan's summary",
          "[coordinator][proto]") {
  auto job = SmallJob();
  REQUIRE(job.ok());
  auto plan = PlanReconfiguration(job->input());
  REQUIRE(plan.ok());
  REQUIRE(plan->summary.cross_host_bytes > 0);
  REQUIRE(!plan->summary.host_send_bytes.empty());
  std::string whole, alone;
  REQUIRE(PlanToProto(*plan).summary().SerializeToString(&whole));
  REQUIRE(SummaryToProto(plan->summary).SerializeToString(&alone));
  CHECK(alone == whole);
}

TEST_CASE("plan proto: a malformed region is INVALID_ARGUMENT",
          "[coordinator][proto]") {
  proto::Plan wire;
  proto::Interval* d =
      wire.add_fragments()->add_transfers()->mutable_region()->add_dims();
  d->set_begin(5);
  d->set_end(2);
  auto plan = PlanFromProto(wire);
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(plan.status().message().find("[5, 2)") != std::string::npos);
}

}  // namespace
}  // namespace ptc
