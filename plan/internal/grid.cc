#include "plan/internal/grid.h"

namespace ptc::plan_internal {

void CoalesceBoxes(std::vector<Region>* boxes) {
  if (boxes->size() < 2) return;
  const int rank = boxes->front().rank();
  for (int d = rank - 1; d >= 0; --d) {
    // Sort by every other dimension, then by begin along d.
    auto key_less = [d, rank](const Region& a, const Region& b) {
      for (int k = 0; k < rank; ++k) {
        if (k == d) continue;
        if (a.dim(k).begin != b.dim(k).begin)
          return a.dim(k).begin < b.dim(k).begin;
        if (a.dim(k).end != b.dim(k).end) return a.dim(k).end < b.dim(k).end;
      }
      return a.dim(d).begin < b.dim(d).begin;
    };
    std::sort(boxes->begin(), boxes->end(), key_less);
    std::vector<Region> out;
    out.reserve(boxes->size());
    for (const Region& b : *boxes) {
      if (!out.empty()) {
        Region& last = out.back();
        bool same = last.dim(d).end == b.dim(d).begin;
        for (int k = 0; same && k < rank; ++k) {
          if (k != d && last.dim(k) != b.dim(k)) same = false;
        }
        if (same) {
          last.mutable_dim(d).end = b.dim(d).end;
          continue;
        }
      }
      out.push_back(b);
    }
    boxes->swap(out);
  }
}

}  // namespace ptc::plan_internal
