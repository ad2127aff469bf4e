#include "plan/placement.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plan/job_placement.h"
#include "plan/plan_scenario.h"
#include "plan/planner.h"
#include "proto/enum_names.h"
#include "ptc/families.h"

namespace ptc {
namespace {

ModelSpec Gpt(int layers = 4) {
  return *BuildModelSpec(*ParseArchitecture(absl::StrCat(
      "gpt:layers=", layers, ",hidden=32,heads=4,vocab=64,positions=8")));
}

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

PlacementRequest Request(const PlanScenario& s, std::vector<int> hosts) {
  PlacementRequest req;
  req.spec = &s.spec;
  req.cluster = &s.cluster;
  req.target = &s.target();
  req.hosts = std::move(hosts);
  req.source = &s.source();
  req.source_placement = &s.source_placement;
  req.alive = s.alive;
  return req;
}

// What the planner sends across hosts with `placement` as the target's.
int64_t PlannedCrossBytes(const PlanScenario& s, const Placement& placement) {
  PlanInput in = s.input();
  in.target_placement = &placement;
  auto plan = PlanReconfiguration(in);
  REQUIRE(plan.ok());
  return plan->summary.cross_host_bytes;
}

TEST_CASE("placement: a dead host's job keeps every surviving replica in place",
          "[coordinator][placement]") {
  // tp=2,pp=4,dp=2 on 8 hosts of 2 GPUs: each host is one tp group, hosts
  // 2k and 2k+1 hold stage k. host1 dies; dp=1 fits the 7 survivors.
  std::vector<bool> alive(8, true);
  alive[1] = false;
  auto s = MakePlanScenario(Gpt(), "tp=2,pp=4,dp=2", Range(8), "tp=2,pp=4,dp=1",
                            {0, 2, 3, 4, 5, 6, 7}, Cluster::Uniform(8, 2), alive);
  REQUIRE(s.ok());
  const PlacementRequest req = Request(*s, {0, 2, 3, 4, 5, 6, 7});
  auto chosen = ChoosePlacement(req);
  REQUIRE(chosen.ok());
  CHECK(chosen->cross_host_bytes == 0);
  CHECK(chosen->released.size() == 3);
  CHECK(PlannedCrossBytes(*s, chosen->placement) == 0);
  auto contiguous = ContiguousPlacementResult(req);
  REQUIRE(contiguous.ok());
  CHECK(contiguous->cross_host_bytes > 0);  // stages 2, 3 land on stage 1's hosts
  CHECK(PlannedCrossBytes(*s, contiguous->placement) ==
        contiguous->cross_host_bytes);
  // Deterministic.
  auto again = ChoosePlacement(req);
  REQUIRE(again.ok());
  CHECK(again->placement.host == chosen->placement.host);
  CHECK(again->placement.device == chosen->placement.device);
}

TEST_CASE(
    "placement: a job spreads where its state lies on more hosts than it "
    "needs",
    "[coordinator][placement]") {
  // tp=1,pp=4,dp=2 on 2 hosts of 4 GPUs: host0 holds layers 0-1, host1
  // layers 2-3. Two ranks, one per half, fit one host; each half kept
  // where it is moves nothing.
  const ModelSpec spec = *BuildModelSpec(*ParseArchitecture(
      "gpt:layers=4,hidden=48,heads=6,vocab=2241,positions=300,pad=64"));
  auto s = MakePlanScenario(spec, "tp=1,pp=4,dp=2", {0, 1},
                            "tp=1,pp=2,dp=1,zero=1,layers=2/2", {0, 1},
                            Cluster::Uniform(2, 4), {true, true});
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, {0, 1});
  for (bool survive : {true, false}) {
    req.survive = survive;  // nothing has a replica: movement decides
    auto chosen = ChoosePlacement(req);
    REQUIRE(chosen.ok());
    CHECK(chosen->cross_host_bytes == 0);
    CHECK(chosen->released.empty());
    CHECK(PlannedCrossBytes(*s, chosen->placement) == 0);
  }
  // Where spreading moves no less, the job packs (a host stays free).
  auto fresh =
      MakePlanScenario(spec, "tp=1,pp=4,dp=2", {0, 1}, "tp=1,pp=2,dp=1", {0, 1},
                       Cluster::Uniform(3, 4), {true, true, true});
  REQUIRE(fresh.ok());
  PlacementRequest empty = Request(*fresh, {2, 0, 1});
  empty.source = nullptr;  // a registration: nothing held anywhere
  empty.source_placement = nullptr;
  auto packed = ChoosePlacement(empty);
  REQUIRE(packed.ok());
  CHECK(packed->released.size() == 2);
}

TEST_CASE("placement: a change moves a replica out of a rack that holds both",
          "[coordinator][placement]") {
  // tp=2,pp=1,dp=2 with both replicas in rackA (host0, host1); host2 and
  // host3 are rackB. Either host's loss is survived as it is, the rack's
  // is not: recoverability first moves one replica to rackB.
  Cluster cluster = Cluster::Uniform(4, 2);
  for (int h = 0; h < 4; ++h)
    cluster.hosts[h].domain = h < 2 ? "rackA" : "rackB";
  auto s = MakePlanScenario(Gpt(), "tp=2,pp=1,dp=2", {0, 1}, "tp=2,pp=1,dp=2",
                            Range(4), cluster, std::vector<bool>(4, true));
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, Range(4));
  auto chosen = ChoosePlacement(req);
  REQUIRE(chosen.ok());
  CHECK(chosen->survival.SurvivesAnyHost());
  CHECK(chosen->survival.domains_lost.empty());
  CHECK(chosen->cross_host_bytes > 0);  // a replica's worth, to rackB
  // Movement first keeps both where they are.
  req.survive = false;
  auto still = ChoosePlacement(req);
  REQUIRE(still.ok());
  CHECK(still->cross_host_bytes == 0);
  CHECK(still->survival.domains_lost.size() == 1);
}

// 40 hosts of one GPU: rackA is hosts 0-21, rackB 22-39.
Cluster TwoRacks() {
  Cluster cluster = Cluster::Uniform(40, 1);
  for (int h = 0; h < 40; ++h)
    cluster.hosts[h].domain = h < 22 ? "rackA" : "rackB";
  return cluster;
}

TEST_CASE(
    "placement: a large job's new replica goes to the rack its stage "
    "lost",
    "[coordinator][placement]") {
  // tp=1,pp=4,dp=9 (36 units: the large job's path) on hosts of one GPU;
  // rackA is hosts 0-21, rackB 22-39. Stage 0 has 8 replicas in rackA and
  // one in rackB (host22), which dies. Its new replica costs the same on
  // any spare (rackA's 20 and 21, rackB's 38 and 39): on rackB's, stage 0
  // survives either rack's loss again.
  const Cluster cluster = TwoRacks();
  // Stages 1-3 take rackA's 8-19 and rackB's 23-37 in turns: each is in
  // both racks.
  std::vector<int> source = {0, 1, 2, 3, 4, 5, 6, 7, 22};
  for (int i = 0; i < 15; ++i) {
    if (i < 12) source.push_back(8 + i);
    source.push_back(23 + i);
  }
  std::vector<bool> alive(40, true);
  alive[22] = false;
  // The spares last, or first (the hosts that hold stages are placed
  // first either way).
  std::vector<int> candidates;
  for (int h = 0; h < 40; ++h)
    if (alive[h]) candidates.push_back(h);
  if (GENERATE(false, true)) {
    std::stable_partition(candidates.begin(), candidates.end(), [](int h) {
      return h == 20 || h == 21 || h == 38 || h == 39;
    });
  }
  auto s = MakePlanScenario(Gpt(), "tp=1,pp=4,dp=9", source, "tp=1,pp=4,dp=9",
                            candidates, cluster, alive);
  REQUIRE(s.ok());
  auto chosen = ChoosePlacement(Request(*s, candidates));
  REQUIRE(chosen.ok());
  INFO(chosen->survival.Describe());
  CHECK(chosen->survival.SurvivesAnyHost());
  CHECK(chosen->survival.domains_lost.empty());
  CHECK(chosen->released.size() == 3);
  CHECK(PlannedCrossBytes(*s, chosen->placement) == chosen->cross_host_bytes);
  int on_spare = 0;
  for (int r = 0; r < 9; ++r) {
    const int h = chosen->placement.host[r];
    if (h == 38 || h == 39) ++on_spare;
    CHECK(h != 20);
    CHECK(h != 21);
  }
  CHECK(on_spare == 1);
}

TEST_CASE(
    "placement: a large job moves a replica out of a rack that holds "
    "all of its stage's",
    "[coordinator][placement]") {
  // tp=1,pp=4,dp=9 on hosts of one GPU, rackA hosts 0-21, rackB 22-39.
  // Stage 0's nine replicas are all in rackA (hosts 0-8); stages 1-3 take
  // both racks in turns; hosts 36-39 are free. Recoverability first moves
  // one of stage 0's replicas to a free rackB host: one replica's bytes.
  const Cluster cluster = TwoRacks();
  std::vector<int> source = Range(9);
  for (int i = 0; i < 14; ++i) {
    if (i < 13) source.push_back(9 + i);
    source.push_back(22 + i);
  }
  auto s = MakePlanScenario(Gpt(), "tp=1,pp=4,dp=9", source, "tp=1,pp=4,dp=9",
                            Range(40), cluster, std::vector<bool>(40, true));
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, Range(40));
  auto chosen = ChoosePlacement(req);
  REQUIRE(chosen.ok());
  INFO(chosen->survival.Describe());
  CHECK(chosen->survival.domains_lost.empty());
  CHECK(chosen->cross_host_bytes > 0);
  CHECK(PlannedCrossBytes(*s, chosen->placement) == chosen->cross_host_bytes);
  int in_b = 0;
  for (int r = 0; r < 9; ++r) in_b += chosen->placement.host[r] >= 22;
  CHECK(in_b == 1);
  // Movement first keeps them.
  req.survive = false;
  auto still = ChoosePlacement(req);
  REQUIRE(still.ok());
  CHECK(still->cross_host_bytes == 0);
  REQUIRE(still->survival.domains_lost.size() == 1);
  CHECK(still->survival.domains_lost[0].domain == "rackA");
  // What it adds: one host's share of stage 0, sent to the free host.
  CHECK(chosen->cross_host_bytes == still->host_bytes[0]);
}

TEST_CASE("placement: a scale-up keeps each stage on the hosts that hold it",
          "[coordinator][placement]") {
  // pp=2 stages on hosts 0,1 (tp=4 each, 4 GPUs) -> dp=4 on 8 hosts.
  auto s = MakePlanScenario(Gpt(), "tp=4,pp=2,dp=1", {0, 1}, "tp=4,pp=2,dp=4",
                            Range(8), Cluster::Uniform(8, 4));
  REQUIRE(s.ok());
  const PlacementRequest req = Request(*s, Range(8));
  auto chosen = ChoosePlacement(req);
  auto contiguous = ContiguousPlacementResult(req);
  REQUIRE(chosen.ok());
  REQUIRE(contiguous.ok());
  CHECK(chosen->cross_host_bytes <= contiguous->cross_host_bytes);
  CHECK(chosen->cross_host_bytes == PlannedCrossBytes(*s, chosen->placement));
  // Hosts 0 and 1 keep a replica of their own stage: they receive nothing.
  const ParallelConfig& to = *s->target().config();
  for (int r = 0; r < to.world_size(); ++r) {
    const int h = chosen->placement.host[r];
    if (h < 2) CHECK(to.IndexOn(to.CoordOf(r), "pp") == h);
  }
}

TEST_CASE("placement: a stage's dp replicas go to different hosts, so that any "
          "one host's loss leaves a copy of everything",
          "[coordinator][placement]") {
  // tp=1,pp=2,dp=2 on two hosts of 2 GPUs, held in rank order (each host
  // one stage, both its replicas): recoverability first moves half of it.
  auto s = MakePlanScenario(Gpt(), "tp=1,pp=2,dp=2", {0, 1}, "tp=1,pp=2,dp=2", {0, 1},
                            Cluster::Uniform(2, 2));
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, {0, 1});
  auto chosen = ChoosePlacement(req);
  REQUIRE(chosen.ok());
  CHECK(static_cast<int>(chosen->survival.hosts_lost.size()) == 0);
  const ParallelConfig& cfg = *s->target().config();
  for (int h = 0; h < 2; ++h) {
    std::set<int> stages;
    for (int r = 0; r < cfg.world_size(); ++r)
      if (chosen->placement.host[r] == h) stages.insert(cfg.IndexOn(cfg.CoordOf(r), "pp"));
    CHECK(stages == std::set<int>{0, 1});
  }
  CHECK(chosen->cross_host_bytes > 0);
  CHECK(chosen->cross_host_bytes == PlannedCrossBytes(*s, chosen->placement));
  SurvivalReport report =
      CheckSurvival(s->spec, s->target(), chosen->placement, s->cluster);
  CHECK(report.hosts == 2);
  CHECK(report.hosts_lost.empty());
  CHECK(report.Describe() == "survives the loss of any one host");

  // Rank order only: nothing moves, and either host's loss loses a stage.
  req.survive = false;
  auto packed = ChoosePlacement(req);
  REQUIRE(packed.ok());
  CHECK(packed->cross_host_bytes == 0);
  CHECK(static_cast<int>(packed->survival.hosts_lost.size()) == 2);
  report = CheckSurvival(s->spec, s->target(), packed->placement, s->cluster);
  REQUIRE(report.hosts_lost.size() == 2);
  CHECK_THAT(report.Describe(),
             Catch::StartsWith("does not survive the loss of host host0 (tensor '") &&
                 Catch::Contains(" is only there), host1 (tensor '"));

  // One replica: nothing to spread; both groupings are the same.
  auto single = MakePlanScenario(Gpt(), "tp=1,pp=2,dp=1", {0}, "tp=1,pp=4,dp=1", {0, 1},
                                 Cluster::Uniform(2, 2));
  REQUIRE(single.ok());
  auto one = ChoosePlacement(Request(*single, {0, 1}));
  REQUIRE(one.ok());
  CHECK(static_cast<int>(one->survival.hosts_lost.size()) == 2);
}

TEST_CASE(
    "placement: a small object a new rank can only copy is judged like a "
    "region: one copy per class of its scope, lost with the host holding it",
    "[coordinator][placement]") {
  // tp=1,pp=2,dp=2 on two hosts, each stage's replicas spread: every
  // tensor survives either host's loss.
  ModelSpec spec = Gpt();
  auto judge = [&](std::vector<std::string> scope, NewRankRule rule,
                   bool kept = false) {
    ModelSpec with = spec;
    with.small_objects.push_back({"cursor", std::move(scope), rule, 64});
    auto s = MakePlanScenario(with, "tp=1,pp=2,dp=2", {0, 1}, "tp=1,pp=2,dp=2",
                              {0, 1}, Cluster::Uniform(2, 2));
    REQUIRE(s.ok());
    PlacementRequest req = Request(*s, {0, 1});
    req.small_objects_kept = kept;
    auto chosen = ChoosePlacement(req);
    REQUIRE(chosen.ok());
    const SurvivalReport report = CheckSurvival(
        s->spec, s->target(), chosen->placement, s->cluster, kept);
    // The placement's own report and the judgement of the placement agree.
    CHECK(chosen->survival.Describe() == report.Describe());
    return report;
  };
  // Global, or one per stage: copies on both hosts.
  CHECK(judge({}, NewRankRule::kCopy).Describe() ==
        "survives the loss of any one host");
  CHECK(judge({"pp"}, NewRankRule::kCopy).Describe() ==
        "survives the loss of any one host");
  // One per rank that a new rank copies: each copy lives on one host.
  const SurvivalReport own = judge({"pp", "dp", "tp"}, NewRankRule::kCopy);
  CHECK(own.hosts_lost.size() == 2);
  CHECK_FALSE(own.SurvivesAnyHost());
  CHECK_THAT(
      own.Describe(),
      Catch::StartsWith("does not survive the loss of host host0 (small object "
                        "'cursor' of rank ") &&
          Catch::Contains(
              " is only there), host1 (small object 'cursor' of rank "));
  // One per rank that a new rank derives (an RNG state): a fresh value.
  CHECK(judge({"pp", "dp", "tp"}, NewRankRule::kDerive).SurvivesAnyHost());
  // The coordinator keeps a copy of each class on one host: only regions
  // count.
  CHECK(
      judge({"pp", "dp", "tp"}, NewRankRule::kCopy, /*kept=*/true).Describe() ==
      "survives the loss of any one host");
}

TEST_CASE("small object classes: the ranks holding one copy, and their group",
          "[coordinator][placement]") {
  ModelSpec spec = Gpt();
  spec.small_objects = {{"step", {}, NewRankRule::kCopy, 8},
                        {"loader", {"dp"}, NewRankRule::kCopy, 64},
                        {"rng", {"pp", "dp", "tp"}, NewRankRule::kDerive, 16}};
  auto config = ParallelConfig::Parse("tp=2,dp=2");
  REQUIRE(config.ok());
  // Replica d on host d: the loader's classes are each on one host, the
  // step spans both; derived objects have no class.
  std::vector<SmallObjectClass> classes =
      SmallObjectClasses(spec, *config, [](int r) { return r / 2; });
  REQUIRE(classes.size() == 3);
  CHECK(classes[0].object == 0);
  CHECK(classes[0].first_rank == 0);
  CHECK(classes[0].group == -2);
  CHECK(classes[1].object == 1);
  CHECK(classes[1].first_rank == 0);
  CHECK(classes[1].group == 0);
  CHECK(classes[2].object == 1);
  CHECK(classes[2].first_rank == 2);
  CHECK(classes[2].group == 1);
  // Ranks alternating over the hosts: every class spans both.
  classes = SmallObjectClasses(spec, *config, [](int r) { return r % 2; });
  for (const SmallObjectClass& c : classes) CHECK(c.group == -2);
}

TEST_CASE("placement: survival of a failure domain's loss",
          "[coordinator][placement]") {
  // Four hosts of one GPU in two racks; tp=1,pp=2,dp=2.
  Cluster cluster = Cluster::Uniform(4, 1);
  cluster.hosts[0].domain = cluster.hosts[1].domain = "r1";
  cluster.hosts[2].domain = cluster.hosts[3].domain = "r2";
  const ModelSpec spec = Gpt();
  auto config = ParallelConfig::Parse("tp=1,pp=2,dp=2");
  REQUIRE(config.ok());
  auto layout = BuildLayout(spec, *config);
  REQUIRE(layout.ok());
  // Replica d's stage p on host 2d+p: each rack holds one whole replica.
  Placement by_replica, by_stage;
  for (int r = 0; r < config->world_size(); ++r) {
    const int p = config->IndexOn(config->CoordOf(r), "pp");
    const int d = config->IndexOn(config->CoordOf(r), "dp");
    by_replica.host.push_back(2 * d + p);
    by_stage.host.push_back(2 * p + d);  // rack r1: both copies of stage 0
    by_replica.device.push_back(0);
    by_stage.device.push_back(0);
  }
  SurvivalReport report = CheckSurvival(spec, *layout, by_replica, cluster);
  CHECK(report.hosts_lost.empty());
  CHECK(report.domains == std::vector<std::string>{"r1", "r2"});
  CHECK(report.domains_lost.empty());
  CHECK(report.Describe() ==
        "survives the loss of any one host; survives the loss of any one domain (r1, r2)");
  report = CheckSurvival(spec, *layout, by_stage, cluster);
  CHECK(report.hosts_lost.empty());
  REQUIRE(report.domains_lost.size() == 2);
  CHECK(report.domains_lost[0].domain == "r1");
  CHECK_THAT(report.Describe(),
             Catch::StartsWith("survives the loss of any one host; of domain r1 (tensor '") &&
                 Catch::EndsWith(": no"));
  // Placed at registration, each rack gets a whole replica (the hosts
  // listed rack by rack).
  PlacementRequest req;
  req.spec = &spec;
  req.cluster = &cluster;
  req.target = &*layout;
  req.hosts = {0, 1, 2, 3};
  auto placed = ChoosePlacement(req);
  REQUIRE(placed.ok());
  CHECK(placed->survival.hosts_lost.empty());
  CHECK(placed->survival.domains_lost.empty());
  // Without domains the same hosts take the stages in order.
  Cluster flat = Cluster::Uniform(4, 1);
  req.cluster = &flat;
  placed = ChoosePlacement(req);
  REQUIRE(placed.ok());
  CHECK(CheckSurvival(spec, *layout, placed->placement, cluster).domains_lost.size() == 2);
  req.cluster = &cluster;

  // A host outside every domain still holds copies: rack r1's loss is
  // survived when the hosts outside it hold a whole replica.
  Cluster partly = cluster;
  partly.hosts[2].domain = partly.hosts[3].domain = "";
  report = CheckSurvival(spec, *layout, by_replica, partly);
  CHECK(report.domains == std::vector<std::string>{"r1"});
  CHECK(report.domains_lost.empty());

  // A path: every prefix is a domain of its own.
  cluster.hosts[0].domain = cluster.hosts[1].domain = "dc1/r1";
  cluster.hosts[2].domain = cluster.hosts[3].domain = "dc1/r2";
  report = CheckSurvival(spec, *layout, by_replica, cluster);
  CHECK(report.domains == std::vector<std::string>{"dc1", "dc1/r1", "dc1/r2"});
  REQUIRE(report.domains_lost.size() == 1);
  CHECK(report.domains_lost[0].domain == "dc1");
}

TEST_CASE("placement: constraints: GPUs, taken devices, memory, colocation",
          "[coordinator][placement]") {
  auto s = MakePlanScenario(Gpt(), "tp=2,pp=1,dp=2", {0, 1}, "tp=2,pp=1,dp=3",
                            {0, 1, 2}, Cluster::Uniform(3, 2));
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, {0, 1, 2});
  // Another job uses GPU 0 of host2: a tp pair no longer fits there.
  req.taken = {{}, {}, {0}};
  auto r = ChoosePlacement(req);
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(r.status().message() ==
        "the job needs 6 GPUs as 3 groups of 2 ranks (tp) that share a host, "
        "but the 3 candidate hosts fit only 2 of them (GPUs other jobs use "
        "are taken); add hosts");
  // Without colocation the free GPU is used, and the tp pair is split.
  req.colocate = {};
  r = ChoosePlacement(req);
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);  // 5 free GPUs
  Cluster bigger = s->cluster;
  bigger.hosts.push_back({"host3", 2, 25e9});
  req.cluster = &bigger;
  req.taken = {{}, {}, {1}, {}};
  req.hosts = {0, 1, 2, 3};
  r = ChoosePlacement(req);
  REQUIRE(r.ok());
  for (int rank = 0; rank < 6; ++rank) {
    CHECK_FALSE((r->placement.host[rank] == 2 && r->placement.device[rank] == 1));
  }
  CHECK(ValidatePlacement(bigger, r->placement).ok());
  // Store memory: every host's share is about a third of the job.
  req = Request(*s, {0, 1, 2});
  req.memory = {1 << 10, 1 << 10, 1 << 10};
  r = ChoosePlacement(req);
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains("does not fit the candidate hosts' store memory") &&
                 Catch::Contains("host0 has 1024 bytes for the job"));
  // A unit larger than any host.
  auto wide = MakePlanScenario(Gpt(), "tp=2,dp=1", {0}, "tp=4,dp=1", {0, 1},
                               Cluster::Uniform(2, 2));
  REQUIRE(wide.ok());
  r = ChoosePlacement(Request(*wide, {0, 1}));
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("need 4 GPUs on one host"));
}

TEST_CASE("placement: hostile placement options are refused clearly",
          "[coordinator][placement]") {
  auto s = MakePlanScenario(Gpt(), "tp=2,dp=1", {0}, "tp=2,dp=2", {0, 1},
                            Cluster::Uniform(2, 2));
  REQUIRE(s.ok());
  PlacementRequest req = Request(*s, {0, 1});
  req.taken = {{1}, {}};
  const std::vector<std::string> names = {"host0", "host1"};
  auto place = [&](const std::string& text) {
    proto::PlacementOptions o;
    for (absl::string_view part : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(part, '=');
      if (kv.first == "strategy") {
        auto parsed = ParsePlacement(kv.second);
        if (!parsed.ok()) return absl::StatusOr<PlacementResult>(parsed.status());
        o.set_strategy(*parsed);
      }
      if (kv.first == "colocate") o.add_colocate(kv.second);
      if (kv.first == "rank") {
        std::pair<std::string, std::string> hd = absl::StrSplit(kv.second, ':');
        o.add_rank_hosts(hd.first);
        o.add_rank_devices(std::stoi(hd.second));
      }
    }
    return PlaceJob(o, req, names);
  };
  auto message = [&](const std::string& text) {
    return std::string(place(text).status().message());
  };
  CHECK_THAT(message("strategy=random"), Catch::Contains("placement 'random' is unknown"));
  CHECK_THAT(message("colocate=cp"), Catch::Contains("colocate axis 'cp' is not an axis"));
  CHECK_THAT(message("strategy=contiguous colocate=tp"),
             Catch::Contains("colocate applies to the ptc placement"));
  CHECK_THAT(message("strategy=explicit rank=host1:0"),
             Catch::Contains("the config has 4 ranks but 1 hosts"));
  CHECK_THAT(message("strategy=explicit rank=host9:0 rank=host1:0 rank=host1:1 rank=host0:0"),
             Catch::Contains("host 'host9', which is not registered"));
  CHECK_THAT(message("strategy=explicit rank=host1:0 rank=host1:1 rank=host0:0 rank=host0:-3"),
             Catch::Contains("GPU -3"));
  CHECK_THAT(message("strategy=explicit rank=host1:0 rank=host1:1 rank=host0:0 rank=host0:2000000000"),
             Catch::Contains("GPU 2000000000"));
  CHECK_THAT(message("strategy=explicit rank=host1:0 rank=host1:0 rank=host0:0 rank=host0:1"),
             Catch::Contains("shares GPU 0 of host1"));
  CHECK_THAT(message("strategy=explicit rank=host1:0 rank=host1:1 rank=host0:0 rank=host0:1"),
             Catch::Contains("GPU 1 of host0, which another job uses"));
  // host0 has one free GPU: contiguous order puts rank 1 on its taken one.
  CHECK_THAT(message("strategy=contiguous"), Catch::Contains("which another job uses"));
  // ptc's own choice fits: the tp pair whose GPU is free nowhere else is
  // split only when colocation is off.
  CHECK(place("").status().code() == absl::StatusCode::kResourceExhausted);
  auto loose = place("colocate=none");
  CHECK(loose.status().code() == absl::StatusCode::kResourceExhausted);  // 3 free GPUs, 4 ranks
  req.taken = {{}, {}};
  auto ok = place("strategy=explicit rank=host1:1 rank=host1:0 rank=host0:1 rank=host0:0");
  REQUIRE(ok.ok());
  CHECK(ok->placement.device == std::vector<int32_t>{1, 0, 1, 0});
}

// Every assignment of the target's units (tp groups) to the candidate
// hosts within their GPUs, by brute force: the least largest receive
// time T, the fewest bytes across hosts among the assignments whose
// largest receive time is within req.duration_slack of T, and among
// those the least that the plan's busiest sender sends. With
// req.survive, only among the assignments with the largest share of
// hosts whose loss alone loses nothing.
struct Best {
  double seconds = 0;
  int64_t bytes = 0;
  int64_t send = 0;
};
double SurvivingShare(const SurvivalReport& r) {
  return r.hosts <= 1
             ? 0.0
             : static_cast<double>(r.hosts - r.hosts_lost.size()) / r.hosts;
}
Best BruteForce(const PlacementRequest& req, int gpus) {
  const ParallelConfig& cfg = *req.target->config();
  const int world = cfg.world_size();
  const int tp = cfg.tp();
  const int units =
      world / tp;  // tp is the fastest axis: unit u = ranks u*tp..
  const int m = static_cast<int>(req.hosts.size());
  const int slots = gpus / tp;
  std::vector<std::pair<double, int64_t>> all;
  std::vector<Placement> placements;
  double most = -1;
  std::vector<int> pick(units, 0), used(m, 0);
  std::function<void(int)> rec = [&](int u) {
    if (u == units) {
      Placement p;
      std::vector<int> next(m, 0);
      std::vector<int> device_of_unit(units);
      for (int v = 0; v < units; ++v) device_of_unit[v] = next[pick[v]]++;
      for (int r = 0; r < world; ++r) {
        p.host.push_back(req.hosts[pick[r / tp]]);
        p.device.push_back(device_of_unit[r / tp] * tp + r % tp);
      }
      auto e = EvaluatePlacement(req, p);
      REQUIRE(e.ok());
      if (req.survive) {
        const double share = SurvivingShare(
            CheckSurvival(*req.spec, *req.target, p, *req.cluster));
        if (share < most - 1e-12) return;
        if (share > most + 1e-12) {
          most = share;
          all.clear();
          placements.clear();
        }
      }
      all.push_back({e->max_receive_seconds, e->cross_host_bytes});
      placements.push_back(std::move(p));
      return;
    }
    for (int c = 0; c < m; ++c) {
      if (used[c] == slots) continue;
      ++used[c];
      pick[u] = c;
      rec(u + 1);
      --used[c];
    }
  };
  rec(0);
  double least = 1e300;
  for (const auto& a : all) least = std::min(least, a.first);
  int64_t fewest = std::numeric_limits<int64_t>::max();
  for (const auto& a : all) {
    if (a.first <= least * (1 + req.duration_slack)) fewest = std::min(fewest, a.second);
  }
  int64_t send = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].first > least * (1 + req.duration_slack) ||
        all[i].second != fewest)
      continue;
    PlanInput in;
    in.spec = req.spec;
    in.cluster = req.cluster;
    in.source = req.source;
    in.source_placement = req.source_placement;
    in.target = req.target;
    in.target_placement = &placements[i];
    in.alive = req.alive;
    auto plan = PlanReconfiguration(in);
    if (plan.ok()) send = std::min(send, plan->summary.max_host_send_bytes);
  }
  return {least, fewest, send};
}

// Random small changes from `seed`, each placed and compared with brute
// force (above): movement alone, and recoverability first. Returns the
// cases checked; `proven` counts those whose recoverable placement the
// search proved best (and brute force checked).
int AgainstBruteForce(uint64_t seed, int iterations, int* proven) {
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  const ModelSpec spec = Gpt(4);
  const char* configs[] = {"tp=1,pp=1,dp=2", "tp=2,pp=1,dp=2", "tp=2,pp=2,dp=1",
                           "tp=1,pp=2,dp=2", "tp=2,pp=2,dp=2", "tp=1,pp=4,dp=1",
                           "tp=2,pp=4,dp=1", "tp=1,pp=2,dp=3", "tp=4,pp=1,dp=1",
                           "tp=1,pp=2,dp=1", "tp=1,pp=4,dp=2"};
  int checked = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    const int gpus = pick(0, 1) ? 2 : 4;
    const int n = pick(2, 6);
    Cluster cluster = Cluster::Uniform(n, gpus);
    for (Host& h : cluster.hosts) h.bandwidth = pick(0, 1) ? 1e9 : 2e9;
    const std::string from = configs[pick(0, 10)], to = configs[pick(0, 10)];
    const int from_world = ParallelConfig::Parse(from)->world_size();
    const int to_world = ParallelConfig::Parse(to)->world_size();
    std::vector<int> from_hosts = Range(n);
    std::shuffle(from_hosts.begin(), from_hosts.end(), rng);
    from_hosts.resize((from_world + gpus - 1) / gpus);
    if (static_cast<int>(from_hosts.size()) > n) continue;
    std::vector<bool> alive(n, true);
    if (pick(0, 2) == 0) alive[from_hosts[pick(0, from_hosts.size() - 1)]] = false;
    std::vector<int> cands;
    for (int h = 0; h < n; ++h)
      if (alive[h] && pick(0, 3) > 0) cands.push_back(h);
    if (cands.empty()) continue;
    // The scenario gives the layouts (its contiguous target placement on
    // every host is not used).
    auto s = MakePlanScenario(spec, from, from_hosts, to, Range(n), cluster, alive);
    if (!s.ok()) continue;
    // Brute force below weighs movement alone: compare with that
    // (`survive` puts recoverability first).
    PlacementRequest req = Request(*s, cands);
    req.survive = false;
    const int tp = s->target().config()->tp();
    auto chosen = ChoosePlacement(req);
    if (tp > gpus || (to_world + gpus - 1) / gpus > static_cast<int>(cands.size())) {
      CHECK_FALSE(chosen.ok());
      continue;
    }
    INFO(from << " on " << from_hosts.size() << " hosts -> " << to << " on "
              << cands.size() << " of " << n << " hosts of " << gpus << " GPUs");
    REQUIRE(chosen.ok());
    // Constraints: devices valid and distinct, tp groups on one host.
    REQUIRE(ValidatePlacement(cluster, chosen->placement).ok());
    const ParallelConfig& cfg = *s->target().config();
    for (int r = 0; r < to_world; ++r) {
      MeshCoord c = cfg.CoordOf(r);
      c.index[cfg.AxisIndex("tp")] = 0;
      CHECK(chosen->placement.host[r] == chosen->placement.host[cfg.RankOf(c)]);
      CHECK(std::find(cands.begin(), cands.end(), chosen->placement.host[r]) !=
            cands.end());
    }
    double assignments = 1;
    for (int u = 0; u < to_world / tp; ++u) assignments *= cands.size();
    const Best best = BruteForce(req, gpus);
    CHECK(chosen->max_receive_seconds <=
          best.seconds * (1 + req.duration_slack));
    CHECK(chosen->cross_host_bytes == best.bytes);
    auto planned = PlanInput(s->input());
    planned.target_placement = &chosen->placement;
    auto plan = PlanReconfiguration(planned);
    if (plan.ok()) {
      CHECK(plan->summary.cross_host_bytes == chosen->cross_host_bytes);
      // Among the placements equal by receive time and bytes, the least
      // largest send (of those the search saw: all, where it tried every
      // assignment).
      if (chosen->proven_best)
        CHECK(plan->summary.max_host_send_bytes == best.send);
    }
    req.survive = true;
    auto survivable = ChoosePlacement(req);
    REQUIRE(survivable.ok());
    REQUIRE(ValidatePlacement(cluster, survivable->placement).ok());
    if (assignments <= 4096 && survivable->proven_best) {
      // The same among the most recoverable assignments, where the search
      // tried every one (they are few, and judged each as a whole; beyond
      // its budget it descends from its groupings' placements, and can
      // end slower: seed 144 found one twice as slow as the best).
      ++*proven;
      const Best most = BruteForce(req, gpus);
      CHECK(survivable->max_receive_seconds <=
            most.seconds * (1 + req.duration_slack));
      CHECK(survivable->cross_host_bytes == most.bytes);
      planned.target_placement = &survivable->placement;
      auto splan = PlanReconfiguration(planned);
      if (splan.ok()) CHECK(splan->summary.max_host_send_bytes == most.send);
    }
    // The report from the blocks' regions equals one from every shard.
    CHECK(CheckSurvival(spec, s->target(), survivable->placement, cluster)
              .Describe() == survivable->survival.Describe());
    // Recoverability first: never a smaller share of hosts whose loss
    // leaves a copy of everything; with as large a share, never a longer
    // change or more bytes.
    auto share = SurvivingShare;
    CHECK(share(survivable->survival) >= share(chosen->survival));
    if (share(survivable->survival) == share(chosen->survival)) {
      CHECK(survivable->max_receive_seconds <=
            chosen->max_receive_seconds * (1 + req.duration_slack));
      CHECK(survivable->cross_host_bytes <= chosen->cross_host_bytes);
    }
    ++checked;
  }
  return checked;
}

TEST_CASE("placement: equal to brute force over every grouping of tp groups",
          "[coordinator][placement][property]") {
  // PTC_PROPERTY_SEED reruns a failure's seed (its messages name it).
  const char* seed = std::getenv("PTC_PROPERTY_SEED");
  int proven = 0;
  CHECK(AgainstBruteForce(seed != nullptr ? std::strtoul(seed, nullptr, 10)
                                          : std::random_device{}(),
                          80, &proven) >= 20);
  // Most small changes are searched whole (45-51 of 80 in seeds tried).
  CHECK(proven >= 10);
}

TEST_CASE("placement: the hosts a placement uses, in the candidates' order",
          "[placement]") {
  const std::vector<std::string> names = {"h0", "h1", "h2", "h3", "h4"};
  PlacementResult result;
  // Ranks on h3, h1, h1, h4; h4 was not a candidate (an explicit
  // placement may name it), h0 and h2 were and get no rank.
  result.placement.host = {3, 1, 1, 4};
  result.placement.device = {0, 0, 1, 0};
  CHECK(UsedHosts(result, {0, 1, 2, 3}, names) ==
        std::vector<std::string>{"h1", "h3", "h4"});
  CHECK(UsedHosts(result, {3, 2, 1}, names) ==
        std::vector<std::string>{"h3", "h1", "h4"});
  CHECK(UsedHosts(result, {}, names) ==
        std::vector<std::string>{"h3", "h1", "h4"});
}

}  // namespace
}  // namespace ptc
