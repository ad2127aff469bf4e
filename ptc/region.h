// Regions: hyper-rectangles of a tensor's global index space, [begin, end)
// per dimension, and the strided copy between dense row-major buffers that
// every component uses to move them.
//
//   Region w = Region::Full({4096, 1024});          // [0:4096, 0:1024]
//   Region mine = Region({{0, 4096}, {512, 1024}}); // a column slice
//   Region both = w.Intersect(mine);
//   CopyRegion(src, w, dst, mine, both, ElementSize(DType::kBFloat16));
#ifndef PTC_PTC_REGION_H_
#define PTC_PTC_REGION_H_

#include <cassert>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ptc {

// A half-open range [begin, end) of one dimension.
struct Interval {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end > begin ? end - begin : 0; }
  bool operator==(const Interval& o) const {
    return begin == o.begin && end == o.end;
  }
  bool operator!=(const Interval& o) const { return !(*this == o); }
};

using Shape = absl::InlinedVector<int64_t, 4>;

// A hyper-rectangle: one Interval per dimension. A region of rank 0 is the
// single element of a scalar (volume 1). Regions are values; cheap to copy
// for rank <= 4.
class Region {
 public:
  Region() = default;
  Region(std::initializer_list<Interval> dims) : dims_(dims) {}
  explicit Region(absl::Span<const Interval> dims)
      : dims_(dims.begin(), dims.end()) {}

  // [0, shape[d]) in every dimension.
  static Region Full(absl::Span<const int64_t> shape);

  int rank() const { return static_cast<int>(dims_.size()); }
  const Interval& dim(int d) const { return dims_[d]; }
  Interval& mutable_dim(int d) { return dims_[d]; }
  absl::Span<const Interval> dims() const { return dims_; }

  // Extent per dimension.
  Shape shape() const;
  // Number of elements; 0 if any dimension is empty.
  int64_t volume() const;
  bool empty() const { return volume() == 0; }

  // Whether `other` (same rank) lies inside this region. An empty `other`
  // is contained in everything.
  bool Contains(const Region& other) const;
  // The common part (possibly empty) of two regions of the same rank.
  Region Intersect(const Region& other) const;
  bool Intersects(const Region& other) const;
  // This region minus `other`, as at most 2*rank disjoint regions.
  std::vector<Region> Difference(const Region& other) const;

  // "[0:4096, 512:1024]"; a scalar is "[]".
  std::string ToString() const;

  bool operator==(const Region& o) const { return dims_ == o.dims_; }
  bool operator!=(const Region& o) const { return !(*this == o); }
  // Lexicographic by (begin, end) per dimension; for sorting and dedup.
  bool operator<(const Region& o) const;

  template <typename H>
  friend H AbslHashValue(H h, const Region& r) {
    for (const Interval& d : r.dims_) h = H::combine(std::move(h), d.begin, d.end);
    return H::combine(std::move(h), r.dims_.size());
  }

 private:
  absl::InlinedVector<Interval, 4> dims_;
};

// Checks that `region` is a well-formed part of a tensor of `shape`: same
// rank, 0 <= begin <= end <= shape[d]. INVALID_ARGUMENT says which
// dimension is wrong and how.
absl::Status ValidateRegion(const Region& region,
                            absl::Span<const int64_t> shape);

// Product of `shape` (1 for a scalar).
int64_t NumElements(absl::Span<const int64_t> shape);

// Decomposes the flat row-major range [begin, end) of a tensor of `shape`
// into at most 2*rank-1 disjoint regions, in row-major order. Used for
// ZeRO-style optimizer partitions that ignore tensor boundaries.
std::vector<Region> FlatRangeToRegions(absl::Span<const int64_t> shape,
                                       int64_t begin, int64_t end);

// The same for the elements [begin, end) of `region` of a tensor, in the
// region's row-major order: the boxes are in the tensor's coordinates.
std::vector<Region> FlatRangeOfRegion(const Region& region, int64_t begin,
                                      int64_t end);

// Calls fn(src_offset, dst_offset, bytes) for every contiguous run of
// `what` (inside both boxes) in row-major order, with the runs' byte
// offsets in dense row-major buffers holding exactly `src_box` and
// `dst_box`. Trailing dimensions that both boxes hold in full are merged
// into one run. CopyRegion is a memcpy per run; a transport may turn each
// run into one remote read instead.
template <typename Fn>
void ForEachRun(const Region& src_box, const Region& dst_box,
                const Region& what, int64_t element_size, Fn&& fn) {
  assert(src_box.Contains(what) && dst_box.Contains(what));
  if (what.empty()) return;
  const int rank = what.rank();
  if (rank == 0) {
    fn(int64_t{0}, int64_t{0}, element_size);
    return;
  }
  // Merge trailing dimensions that are whole in src, dst and what into one
  // contiguous run: dimension `split` and everything after it is one run.
  int64_t run = element_size * what.dim(rank - 1).size();
  int split = rank - 1;
  while (split > 0 && what.dim(split) == src_box.dim(split) &&
         what.dim(split) == dst_box.dim(split)) {
    --split;
    run *= what.dim(split).size();
  }
  // Byte strides of every dimension in both buffers.
  absl::InlinedVector<int64_t, 4> src_stride(rank), dst_stride(rank);
  int64_t s = element_size, t = element_size;
  for (int d = rank - 1; d >= 0; --d) {
    src_stride[d] = s;
    dst_stride[d] = t;
    s *= src_box.dim(d).size();
    t *= dst_box.dim(d).size();
  }
  // Offsets of what's first element.
  int64_t src_off = 0, dst_off = 0;
  for (int d = 0; d < rank; ++d) {
    src_off += (what.dim(d).begin - src_box.dim(d).begin) * src_stride[d];
    dst_off += (what.dim(d).begin - dst_box.dim(d).begin) * dst_stride[d];
  }
  // Odometer over dimensions [0, split).
  absl::InlinedVector<int64_t, 4> idx(split, 0);
  while (true) {
    fn(src_off, dst_off, run);
    int d = split - 1;
    for (; d >= 0; --d) {
      src_off += src_stride[d];
      dst_off += dst_stride[d];
      if (++idx[d] < what.dim(d).size()) break;
      src_off -= src_stride[d] * idx[d];
      dst_off -= dst_stride[d] * idx[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Copies the elements of `what` from `src` (a dense row-major buffer
// holding exactly `src_box`) into `dst` (dense row-major, holding exactly
// `dst_box`). `what` must lie inside both boxes (checked in debug builds).
// Contiguous runs are copied with one memcpy each; trailing dimensions that
// both boxes hold in full are merged into one run. No temporary buffers.
void CopyRegion(const void* src, const Region& src_box, void* dst,
                const Region& dst_box, const Region& what,
                int64_t element_size);

// Distinct regions (of one tensor), numbered in order of first
// appearance. Layouts repeat few regions across many ranks (every dp
// replica holds the same tp shards), so most lookups hit the previous
// region or a short list; past 16 regions a hash map takes over.
class RegionIds {
 public:
  void Clear() {
    regions_.clear();
    index_.clear();
    last_ = -1;
  }
  int32_t Id(const Region& r) {
    if (last_ >= 0 && last_ < static_cast<int32_t>(regions_.size()) &&
        regions_[last_] == r) {
      return last_;
    }
    if (regions_.size() <= kLinear) {
      for (size_t i = 0; i < regions_.size(); ++i) {
        if (regions_[i] == r) return last_ = static_cast<int32_t>(i);
      }
    } else {
      auto it = index_.find(r);
      if (it != index_.end()) return last_ = it->second;
    }
    last_ = static_cast<int32_t>(regions_.size());
    regions_.push_back(r);
    if (regions_.size() == kLinear + 1) {
      for (size_t i = 0; i < regions_.size(); ++i)
        index_.emplace(regions_[i], static_cast<int32_t>(i));
    } else if (regions_.size() > kLinear + 1) {
      index_.emplace(r, last_);
    }
    return last_;
  }
  const Region& operator[](int32_t id) const { return regions_[id]; }
  int32_t size() const { return static_cast<int32_t>(regions_.size()); }
  // The distinct regions, by id; leaves this empty.
  std::vector<Region> Release() {
    std::vector<Region> out = std::move(regions_);
    Clear();
    return out;
  }

 private:
  static constexpr size_t kLinear = 16;
  std::vector<Region> regions_;
  absl::flat_hash_map<Region, int32_t> index_;
  int32_t last_ = -1;
};


}  // namespace ptc

#endif  // PTC_PTC_REGION_H_
