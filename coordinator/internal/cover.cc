#include "coordinator/internal/cover.h"

#include <limits>

#include "coordinator/internal/grid.h"

namespace ptc::coordinator_internal {

std::map<int32_t, std::vector<Region>> DisjointCover(
    int rank, const std::vector<std::pair<int32_t, Region>>& held,
    std::map<int32_t, int64_t>* load) {
  Grid grid;
  grid.Reset(rank);
  for (const auto& [h, r] : held) grid.AddCuts(r);
  grid.Finalize();
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> owner(grid.num_cells(), kNone);
  if (load == nullptr) {
    for (const auto& [host, r] : held) {
      const int32_t h = host;  // a lambda cannot capture a structured binding
      grid.ForEachCell(r, [&](int64_t c) { owner[c] = std::min(owner[c], h); });
    }
  } else {
    std::vector<std::vector<int32_t>> holders(grid.num_cells());
    for (const auto& [host, r] : held) {
      const int32_t h = host;
      grid.ForEachCell(r, [&](int64_t c) { holders[c].push_back(h); });
    }
    for (int64_t c = 0; c < grid.num_cells(); ++c) {
      for (int32_t h : holders[c]) {
        if (owner[c] == kNone || (*load)[h] < (*load)[owner[c]] ||
            ((*load)[h] == (*load)[owner[c]] && h < owner[c])) {
          owner[c] = h;
        }
      }
      if (owner[c] != kNone) (*load)[owner[c]] += grid.CellRegion(c).volume();
    }
  }
  std::map<int32_t, std::vector<Region>> out;
  for (int64_t c = 0; c < grid.num_cells(); ++c) {
    if (owner[c] != std::numeric_limits<int32_t>::max()) {
      out[owner[c]].push_back(grid.CellRegion(c));
    }
  }
  for (auto& [h, boxes] : out) CoalesceBoxes(&boxes);
  return out;
}

}  // namespace ptc::coordinator_internal
