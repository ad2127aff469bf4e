#include "plan/plan_json.h"

#include <catch2/catch.hpp>

#include "plan/internal/plan_testing.h"
#include "plan/planner.h"

namespace ptc {
namespace {

TEST_CASE("plan json: the summary carries the documented fields as numbers",
          "[coordinator][json]") {
  auto job =
      testing::MakeJob("gpt:layers=2,hidden=8,heads=2,vocab=20,positions=4",
                       "tp=2", {0}, "tp=1,dp=2", {1}, Cluster::Uniform(2, 2));
  REQUIRE(job.ok());
  auto plan = PlanReconfiguration(job->input());
  REQUIRE(plan.ok());
  JsonWriter w;
  WritePlanSummary(plan->summary, job->cluster, &w);
  for (const char* key :
       {"\"cross_host_bytes\":", "\"cross_host_bytes_lower_bound\":",
        "\"max_host_send_bytes\":", "\"max_host_send_bytes_lower_bound\":",
        "\"plan_seconds\":"}) {
    CHECK(w.str().find(key) != std::string::npos);
  }
  CHECK(w.str().find(absl::StrCat("\"cross_host_bytes\":",
                                  plan->summary.cross_host_bytes)) !=
        std::string::npos);
  const std::string whole = PlanJson(job->input(), *plan);
  CHECK(whole.find("\"transfers\":[{") != std::string::npos);
  CHECK(whole.find("\"config\":\"tp=2,pp=1,dp=1\"") != std::string::npos);
}

}  // namespace
}  // namespace ptc
