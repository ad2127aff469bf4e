#include "plan/internal/cover.h"

#include <limits>

#include "plan/internal/grid.h"

namespace ptc::plan_internal {

std::map<int32_t, std::vector<Region>> DisjointCover(
    int rank, const std::vector<std::pair<int32_t, Region>>& held,
    std::map<int32_t, int64_t>* load) {
  Grid grid;
  grid.Reset(rank);
  for (const auto& [h, r] : held) grid.AddCuts(r);
  grid.Finalize();
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  auto assigned = [&](int32_t h) -> int64_t {
    if (load == nullptr) return 0;
    auto it = load->find(h);
    return it == load->end() ? 0 : it->second;
  };
  // Whether holder `a` is preferred to the cell's owner so far, `b`.
  auto preferred = [&](int32_t a, int32_t b) {
    if (b == kNone) return true;
    const int64_t la = assigned(a), lb = assigned(b);
    return la != lb ? la < lb : a < b;
  };
  std::vector<int32_t> owner(grid.num_cells(), kNone);
  for (const auto& [host, r] : held) {
    const int32_t h = host;  // a lambda cannot capture a structured binding
    grid.ForEachCell(r, [&](int64_t c) {
      if (preferred(h, owner[c])) owner[c] = h;
    });
  }
  std::map<int32_t, std::vector<Region>> out;
  for (int64_t c = 0; c < grid.num_cells(); ++c) {
    if (owner[c] == kNone) continue;
    Region cell = grid.CellRegion(c);
    if (load != nullptr) (*load)[owner[c]] += cell.volume();
    out[owner[c]].push_back(std::move(cell));
  }
  for (auto& [h, boxes] : out) CoalesceBoxes(&boxes);
  return out;
}

}  // namespace ptc::plan_internal
