#include "plan/hot_plan.h"

#include <catch2/catch.hpp>

#include "plan/plan_scenario.h"

namespace ptc {
namespace {

constexpr char kSmallGpt[] =
    "gpt:layers=4,hidden=32,heads=4,ffn=64,vocab=100,positions=16,pad=8";

// Every target region is covered exactly once by its rank's pieces, and
// each piece's sender holds it in the source layout.
void CheckCovers(const PlanScenario& s, const ProcessPlan& p) {
  for (int t = 0; t < s.target().num_tensors(); ++t) {
    for (const Shard& d : s.target().shards(t)) {
      if (d.region.empty()) continue;
      std::vector<Region> parts;
      for (const ProcessTransfer& x : p.transfers) {
        if (x.tensor != t || x.target_rank != d.rank) continue;
        const Region part = x.region.Intersect(d.region);
        if (part.empty()) continue;
        parts.push_back(part);
        bool held = false;
        for (const Shard& h : s.source().shards(t))
          held |= h.rank == x.source_rank && h.region.Contains(x.region);
        CHECK(held);
      }
      int64_t volume = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        volume += parts[i].volume();
        for (size_t j = i + 1; j < parts.size(); ++j)
          CHECK_FALSE(parts[i].Intersects(parts[j]));
      }
      CHECK(volume == d.region.volume());
    }
  }
}

PlanScenario Scenario(const std::string& from, const std::string& to,
                      std::vector<int> to_hosts = {0, 1}) {
  auto s = MakePlanScenario(kSmallGpt, from, {0, 1}, to, to_hosts,
                            Cluster::Uniform(2, 2));
  REQUIRE(s.ok());
  return *std::move(s);
}

TEST_CASE("hot plan: an unchanged layout sends nothing between processes",
          "[coordinator][hot_plan]") {
  const PlanScenario s = Scenario("tp=2,dp=2", "tp=2,dp=2");
  auto p = PlanProcessSwitch(s.input());
  REQUIRE(p.ok());
  CheckCovers(s, *p);
  CHECK(p->bytes > 0);
  CHECK(p->bytes_between_processes == 0);
  CHECK(p->bytes_between_hosts == 0);
}

TEST_CASE("hot plan: tp, pp and dp changes cover every target region",
          "[coordinator][hot_plan]") {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"tp=2,dp=2", "tp=1,pp=2,dp=2"},
           {"tp=2,dp=2", "tp=1,dp=4"},
           {"tp=2,dp=2", "tp=2,pp=2"},
           {"tp=1,pp=2,dp=2", "tp=2,dp=2"}}) {
    INFO(from << " -> " << to);
    const PlanScenario s = Scenario(from, to);
    auto p = PlanProcessSwitch(s.input());
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    CheckCovers(s, *p);
    // Every process keeps what it already holds: only new parts move (a
    // pp change whose tp ranks stay where they were moves nothing).
    CHECK(p->bytes_between_processes < p->bytes);
    if (from.substr(0, 4) != to.substr(0, 4))
      CHECK(p->bytes_between_processes > 0);
    CHECK(p->small_objects.size() ==
          static_cast<size_t>(s.target().world_size()) *
              s.spec.small_objects.size());
  }
}

TEST_CASE("hot plan: a shrink takes from the processes that leave",
          "[coordinator][hot_plan]") {
  // dp=2 -> dp=1 on host 0 only: host 0's processes already hold a full
  // replica, so nothing crosses hosts.
  const PlanScenario s = Scenario("tp=2,dp=2", "tp=2", {0});
  auto p = PlanProcessSwitch(s.input());
  REQUIRE(p.ok());
  CheckCovers(s, *p);
  CHECK(p->bytes_between_hosts == 0);
}

TEST_CASE("hot plan: a dead host refuses the hot switch",
          "[coordinator][hot_plan]") {
  PlanScenario s = Scenario("tp=2,dp=2", "tp=2", {0});
  s.alive = {true, false};
  auto p = PlanProcessSwitch(s.input());
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("dead") != std::string::npos);
}

}  // namespace
}  // namespace ptc
