#include <catch2/catch.hpp>
#include <random>

#include "plan/internal/cover.h"
#include "plan/internal/grid.h"
#include "plan/internal/max_flow.h"

namespace ptc::plan_internal {
namespace {

// Every element of `whole` in exactly one of the cover's regions.
void CheckCoversOnce(const std::map<int32_t, std::vector<Region>>& cover,
                     const Region& whole) {
  std::vector<Region> all;
  int64_t volume = 0;
  for (const auto& [h, regions] : cover) {
    for (const Region& r : regions) {
      CHECK(whole.Intersect(r) == r);
      for (const Region& o : all) CHECK(o.Intersect(r).empty());
      all.push_back(r);
      volume += r.volume();
    }
  }
  CHECK(volume == whole.volume());
}

TEST_CASE(
    "disjoint cover: each element once; with a load, replicas share the "
    "work",
    "[coordinator][cover]") {
  // Hosts 0 and 1 each hold a whole replica of 8 tensors [0, 1000) x [0,
  // 64); host 2 holds rows [0, 500) of each as well (a third, partial
  // replica).
  const Region whole{{0, 1000}, {0, 64}};
  const Region half{{0, 500}, {0, 64}};
  const std::vector<std::pair<int32_t, Region>> held = {
      {1, whole}, {0, whole}, {2, half}};
  SECTION("without a load, the lowest id holding it takes every element") {
    for (int t = 0; t < 8; ++t) {
      const auto cover = DisjointCover(2, held);
      CheckCoversOnce(cover, whole);
      REQUIRE(cover.size() == 1);
      CHECK(cover.begin()->first == 0);
    }
  }
  SECTION("with a load kept across tensors, every holder gets a share") {
    std::map<int32_t, int64_t> load;
    for (int t = 0; t < 8; ++t) {
      const auto cover = DisjointCover(2, held, &load);
      CheckCoversOnce(cover, whole);
      // Host 2 is only ever given rows it holds.
      if (cover.count(2)) {
        for (const Region& r : cover.at(2)) CHECK(half.Intersect(r) == r);
      }
    }
    int64_t total = 0, most = 0;
    for (const auto& [h, n] : load) {
      total += n;
      most = std::max(most, n);
    }
    CHECK(total == 8 * whole.volume());
    CHECK(load.size() == 3);
    // An even split is 1/3 each; the cells are half a tensor, so within one.
    CHECK(most <= total / 3 + half.volume());
  }
}

TEST_CASE("grid: cells of a region are exactly the cells inside it",
          "[coordinator][grid]") {
  Grid g;
  g.Reset(2);
  const Region a{{0, 10}, {0, 6}}, b{{3, 7}, {2, 6}};
  g.AddCuts(a);
  g.AddCuts(b);
  g.Finalize();
  CHECK(g.num_cells() == 3 * 2);
  int64_t volume = 0;
  g.ForEachCell(b, [&](int64_t c) {
    CHECK(b.Contains(g.CellRegion(c)));
    volume += g.CellRegion(c).volume();
  });
  CHECK(volume == b.volume());
  volume = 0;
  g.ForEachCell(a, [&](int64_t c) { volume += g.CellRegion(c).volume(); });
  CHECK(volume == a.volume());
}

TEST_CASE("grid: coalescing merges abutting boxes into the whole",
          "[coordinator][grid]") {
  std::vector<Region> boxes;
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j)
      boxes.push_back(Region{{i, i + 1}, {2 * j, 2 * j + 2}});
  }
  std::shuffle(boxes.begin(), boxes.end(), std::mt19937(4));
  CoalesceBoxes(&boxes);
  REQUIRE(boxes.size() == 1);
  CHECK(boxes[0] == Region{{0, 4}, {0, 6}});
}

TEST_CASE("max flow: finds the maximum and respects capacities",
          "[coordinator][flow]") {
  // Classic example: max flow 23.
  MaxFlow f(6);
  f.AddEdge(0, 1, 16);
  f.AddEdge(0, 2, 13);
  f.AddEdge(1, 2, 10);
  f.AddEdge(2, 1, 4);
  const int e13 = f.AddEdge(1, 3, 12);
  f.AddEdge(3, 2, 9);
  f.AddEdge(2, 4, 14);
  f.AddEdge(4, 3, 7);
  f.AddEdge(3, 5, 20);
  f.AddEdge(4, 5, 4);
  CHECK(f.Solve(0, 5) == 23);
  CHECK(f.Flow(e13) <= 12);
  f.Reset();
  CHECK(f.Solve(0, 5) == 23);
}

}  // namespace
}  // namespace ptc::plan_internal
