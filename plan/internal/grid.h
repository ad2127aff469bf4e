// The common refinement of a set of regions of one tensor: the grid whose
// lines are every region's boundaries. Each cell lies wholly inside or
// wholly outside every region that contributed cuts, so per-cell facts
// (who holds it, who needs it) decide everything the planner and the
// validator need. Cost is linear in the cells the regions cover, never
// all-pairs region intersection.
//
//   Grid g;
//   g.Reset(rank);
//   for (const Region& r : regions) g.AddCuts(r);
//   g.Finalize();
//   g.ForEachCell(region, [&](int64_t cell) { ... });
#ifndef PTC_PLAN_INTERNAL_GRID_H_
#define PTC_PLAN_INTERNAL_GRID_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "ptc/region.h"

namespace ptc::plan_internal {

class Grid {
 public:
  void Reset(int rank) {
    cuts_.assign(rank, {});
    stride_.assign(rank, 0);
  }
  void AddCuts(const Region& r) {
    for (int d = 0; d < r.rank(); ++d) {
      cuts_[d].push_back(r.dim(d).begin);
      cuts_[d].push_back(r.dim(d).end);
    }
  }
  // Sorts the cuts; afterwards cells can be enumerated.
  void Finalize() {
    num_cells_ = 1;
    for (int d = static_cast<int>(cuts_.size()) - 1; d >= 0; --d) {
      auto& c = cuts_[d];
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
      stride_[d] = num_cells_;
      num_cells_ *= std::max<int64_t>(static_cast<int64_t>(c.size()) - 1, 0);
    }
  }

  int64_t num_cells() const { return num_cells_; }

  Region CellRegion(int64_t cell) const {
    Region r = Region::Full(Shape(cuts_.size(), 0));
    for (size_t d = 0; d < cuts_.size(); ++d) {
      const int64_t i = cell / stride_[d];
      cell %= stride_[d];
      r.mutable_dim(d) = {cuts_[d][i], cuts_[d][i + 1]};
    }
    return r;
  }

  // Calls fn(cell) for every cell inside `r`, whose boundaries must be
  // among the cuts. Cells come in row-major order.
  template <typename Fn>
  void ForEachCell(const Region& r, Fn&& fn) const {
    if (r.empty()) return;
    const int rank = r.rank();
    if (rank == 0) {
      fn(int64_t{0});
      return;
    }
    absl::InlinedVector<int64_t, 4> lo(rank), hi(rank), idx(rank);
    int64_t cell = 0;
    for (int d = 0; d < rank; ++d) {
      const auto& c = cuts_[d];
      lo[d] = std::lower_bound(c.begin(), c.end(), r.dim(d).begin) - c.begin();
      hi[d] = std::lower_bound(c.begin(), c.end(), r.dim(d).end) - c.begin();
      idx[d] = lo[d];
      cell += lo[d] * stride_[d];
    }
    while (true) {
      fn(cell);
      int d = rank - 1;
      for (; d >= 0; --d) {
        cell += stride_[d];
        if (++idx[d] < hi[d]) break;
        cell -= stride_[d] * (idx[d] - lo[d]);
        idx[d] = lo[d];
      }
      if (d < 0) return;
    }
  }

 private:
  std::vector<std::vector<int64_t>> cuts_;
  std::vector<int64_t> stride_;
  int64_t num_cells_ = 0;
};

// Merges boxes that abut along one dimension and agree on all others,
// dimension by dimension from the last; fewer, larger pieces.
void CoalesceBoxes(std::vector<Region>* boxes);

}  // namespace ptc::plan_internal

#endif  // PTC_PLAN_INTERNAL_GRID_H_
