#include "plan/snapshot_plan.h"

#include <set>

#include "catch2/catch.hpp"
#include "plan/internal/plan_testing.h"

namespace ptc {
namespace {

constexpr char kGpt[] =
    "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=256,positions=16";

// Every element of every tensor written exactly once, each part inside a
// region its writer's ranks hold, and the bytes add up.
void CheckWriters(const testing::TestJob& job, const SnapshotWriters& w) {
  const Layout& layout = job.source();
  for (int t = 0; t < layout.num_tensors(); ++t) {
    INFO("tensor " << job.spec.tensors[t].key);
    std::vector<Region> parts;
    for (const auto& [host, regions] : w.regions) {
      for (const auto& [tensor, region] : regions) {
        if (tensor != t) continue;
        bool inside = false;
        for (const Shard& s : layout.shards(t)) {
          if (job.source_placement.host[s.rank] == host &&
              region.Intersect(s.region) == region)
            inside = true;
        }
        CHECK(inside);
        for (const Region& p : parts) CHECK(p.Intersect(region).empty());
        parts.push_back(region);
      }
    }
    int64_t volume = 0;
    for (const Region& p : parts) volume += p.volume();
    CHECK(volume == NumElements(job.spec.tensors[t].shape));
  }
  for (const auto& [host, regions] : w.regions) {
    int64_t bytes = 0;
    for (const auto& [tensor, region] : regions)
      bytes += region.volume() * ElementSize(job.spec.tensors[tensor].dtype);
    CHECK(w.bytes.at(host) == bytes);
  }
}

TEST_CASE("snapshot writers: replicas share the writing, each region once",
          "[snapshot]") {
  auto job = testing::MakeJob(kGpt, "tp=1,dp=2", {0, 1}, "tp=1,dp=2", {0, 1},
                              Cluster::Uniform(2, 1));
  REQUIRE(job.ok());
  auto w = AssignSnapshotWriters(job->spec, job->source(),
                                 job->source_placement.host, {true, true}, 7);
  REQUIRE(w.ok());
  CheckWriters(*job, *w);
  // Both replicas write, within the largest tensor of each other.
  REQUIRE(w->bytes.size() == 2);
  int64_t largest = 0;
  for (const TensorSpec& t : job->spec.tensors)
    largest = std::max(largest, NumElements(t.shape) * ElementSize(t.dtype));
  CHECK(std::abs(w->bytes.at(0) - w->bytes.at(1)) <= largest);

  SECTION("a dead replica leaves the whole version to the other") {
    auto one = AssignSnapshotWriters(
        job->spec, job->source(), job->source_placement.host, {false, true}, 7);
    REQUIRE(one.ok());
    CheckWriters(*job, *one);
    CHECK(one->regions.count(0) == 0);
  }
}

TEST_CASE("snapshot writers: a region without a live holder is named",
          "[snapshot]") {
  auto job = testing::MakeJob(kGpt, "tp=2", {0, 1}, "tp=2", {0, 1},
                              Cluster::Uniform(2, 1));
  REQUIRE(job.ok());
  auto w = AssignSnapshotWriters(job->spec, job->source(),
                                 job->source_placement.host, {true, false}, 7);
  REQUIRE(w.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(w.status().message()),
             Catch::Contains("no live holder of version 7"));
  // A rank on a host the coordinator does not know holds nothing either.
  std::vector<int32_t> unknown = job->source_placement.host;
  unknown[1] = -1;
  CHECK(
      AssignSnapshotWriters(job->spec, job->source(), unknown, {true, true}, 7)
          .status()
          .code() == absl::StatusCode::kFailedPrecondition);
  CHECK(AssignSnapshotWriters(job->spec, job->source(), {0}, {true, true}, 7)
            .status()
            .code() == absl::StatusCode::kInternal);
}

TEST_CASE(
    "snapshot writers: overlapping regions (ZeRO-1 of tp-replicated "
    "tensors) are written once, each part from a region its writer holds",
    "[snapshot]") {
  // Sizes that the tp ranks' buffers cut differently.
  const char* model =
      "gpt:layers=2,hidden=72,heads=4,ffn=136,vocab=250,positions=16,adam=1";
  const std::vector<int> hosts = {0, 1, 2, 3, 4, 5, 6, 7};
  auto job = testing::MakeJob(model, "tp=4,dp=2,zero=1", hosts,
                              "tp=4,dp=2,zero=1", hosts,
                              Cluster::Uniform(8, 1));
  REQUIRE(job.ok());
  // Some tensor's distinct regions overlap in this layout.
  int overlapping = 0;
  for (int t = 0; t < job->source().num_tensors(); ++t) {
    std::set<Region> distinct;
    for (const Shard& s : job->source().shards(t)) distinct.insert(s.region);
    int64_t volume = 0;
    for (const Region& r : distinct) volume += r.volume();
    if (volume > NumElements(job->spec.tensors[t].shape)) ++overlapping;
  }
  REQUIRE(overlapping > 0);
  auto w = AssignSnapshotWriters(job->spec, job->source(),
                                 job->source_placement.host,
                                 std::vector<bool>(8, true), 7);
  REQUIRE(w.ok());
  CheckWriters(*job, *w);
  CHECK(w->regions.size() == 8);
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

TEST_CASE("snapshot writers: a failed writer's parts go to other holders",
          "[snapshot]") {
  auto job = testing::MakeJob(kGpt, "tp=2,dp=2", {0, 1}, "tp=2,dp=2", {0, 1},
                              Cluster::Uniform(2, 2));
  REQUIRE(job.ok());
  const std::vector<int32_t>& hosts = job->source_placement.host;
  auto w =
      AssignSnapshotWriters(job->spec, job->source(), hosts, {true, true}, 7);
  REQUIRE(w.ok());
  REQUIRE(w->regions.count(1) == 1);
  // Host 1 died while writing: host 0 holds every part of it.
  auto again = ReassignSnapshotParts(job->spec, job->source(), hosts,
                                     {true, false}, w->regions.at(1), 7);
  REQUIRE(again.ok());
  CHECK(again->regions.size() == 1);
  CHECK(again->regions.at(0) == w->regions.at(1));
  // Without a replica there is no one to take them.
  auto none = ReassignSnapshotParts(job->spec, job->source(), hosts,
                                    {false, false}, w->regions.at(1), 7);
  REQUIRE(none.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(none.status().message()),
             Catch::Contains("has no other live holder of version 7"));
}

}  // namespace
}  // namespace ptc
