#include <catch2/catch.hpp>
#include <random>

#include "coordinator/internal/grid.h"
#include "coordinator/internal/max_flow.h"

namespace ptc::coordinator_internal {
namespace {

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
}  // namespace ptc::coordinator_internal
