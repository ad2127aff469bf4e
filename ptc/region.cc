#include "ptc/region.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {

Region Region::Full(absl::Span<const int64_t> shape) {
  Region r;
  for (int64_t extent : shape) r.dims_.push_back({0, extent});
  return r;
}

Shape Region::shape() const {
  Shape s;
  for (const Interval& i : dims_) s.push_back(i.size());
  return s;
}

int64_t Region::volume() const {
  int64_t v = 1;
  for (const Interval& i : dims_) v *= i.size();
  return v;
}

bool Region::Contains(const Region& other) const {
  if (other.rank() != rank()) return false;
  if (other.empty()) return true;
  for (int d = 0; d < rank(); ++d) {
    if (other.dims_[d].begin < dims_[d].begin ||
        other.dims_[d].end > dims_[d].end) {
      return false;
    }
  }
  return true;
}

Region Region::Intersect(const Region& other) const {
  assert(other.rank() == rank());
  Region r = *this;
  for (int d = 0; d < rank(); ++d) {
    r.dims_[d].begin = std::max(dims_[d].begin, other.dims_[d].begin);
    r.dims_[d].end = std::min(dims_[d].end, other.dims_[d].end);
    if (r.dims_[d].end < r.dims_[d].begin) r.dims_[d].end = r.dims_[d].begin;
  }
  return r;
}

bool Region::Intersects(const Region& other) const {
  return !Intersect(other).empty();
}

std::vector<Region> Region::Difference(const Region& other) const {
  std::vector<Region> out;
  Region overlap = Intersect(other);
  if (overlap.empty()) {
    if (!empty()) out.push_back(*this);
    return out;
  }
  // Peel off slabs dimension by dimension: below and above the overlap in
  // dimension d, with dimensions < d already narrowed to the overlap.
  Region rest = *this;
  for (int d = 0; d < rank(); ++d) {
    Region below = rest;
    below.dims_[d].end = overlap.dims_[d].begin;
    if (!below.empty()) out.push_back(below);
    Region above = rest;
    above.dims_[d].begin = overlap.dims_[d].end;
    if (!above.empty()) out.push_back(above);
    rest.dims_[d] = overlap.dims_[d];
  }
  return out;
}

std::string Region::ToString() const {
  return absl::StrCat("[",
                      absl::StrJoin(dims_, ", ",
                                    [](std::string* out, const Interval& i) {
                                      absl::StrAppend(out, i.begin, ":", i.end);
                                    }),
                      "]");
}

bool Region::operator<(const Region& o) const {
  if (rank() != o.rank()) return rank() < o.rank();
  for (int d = 0; d < rank(); ++d) {
    if (dims_[d].begin != o.dims_[d].begin) {
      return dims_[d].begin < o.dims_[d].begin;
    }
    if (dims_[d].end != o.dims_[d].end) return dims_[d].end < o.dims_[d].end;
  }
  return false;
}

absl::Status ValidateRegion(const Region& region,
                            absl::Span<const int64_t> shape) {
  if (region.rank() != static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", region.ToString(), " has rank ", region.rank(),
                     " but the tensor has rank ", shape.size(), " (shape [",
                     absl::StrJoin(shape, ", "), "])"));
  }
  for (int d = 0; d < region.rank(); ++d) {
    const Interval& i = region.dim(d);
    if (i.begin < 0 || i.begin > i.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region ", region.ToString(), ": dimension ", d, " has begin ",
          i.begin, " and end ", i.end, "; need 0 <= begin <= end"));
    }
    if (i.end > shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region ", region.ToString(), " is out of bounds: dimension ", d,
          " ends at ", i.end, " but the tensor's extent is ", shape[d],
          " (shape [", absl::StrJoin(shape, ", "), "])"));
    }
  }
  return absl::OkStatus();
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

namespace {

// Appends the regions of flat range [begin, end) of the sub-tensor
// shape[d:], with dimensions < d fixed by `prefix`.
void AppendFlatRange(absl::Span<const int64_t> shape, int d, int64_t begin,
                     int64_t end, Region prefix, std::vector<Region>* out) {
  if (begin >= end) return;
  const int rank = static_cast<int>(shape.size());
  if (d == rank - 1) {
    prefix.mutable_dim(d) = {begin, end};
    out->push_back(prefix);
    return;
  }
  const int64_t inner = NumElements(shape.subspan(d + 1));
  if (inner == 0) return;
  const int64_t first_row = begin / inner;
  const int64_t last_row = end / inner;  // row holding `end` (exclusive)
  if (first_row == last_row) {
    prefix.mutable_dim(d) = {first_row, first_row + 1};
    AppendFlatRange(shape, d + 1, begin % inner, end % inner, prefix, out);
    return;
  }
  int64_t full_begin = first_row;
  if (begin % inner != 0) {
    prefix.mutable_dim(d) = {first_row, first_row + 1};
    AppendFlatRange(shape, d + 1, begin % inner, inner, prefix, out);
    full_begin = first_row + 1;
  }
  if (full_begin < last_row) {
    Region full = prefix;
    full.mutable_dim(d) = {full_begin, last_row};
    for (int k = d + 1; k < rank; ++k) full.mutable_dim(k) = {0, shape[k]};
    out->push_back(full);
  }
  if (end % inner != 0) {
    prefix.mutable_dim(d) = {last_row, last_row + 1};
    AppendFlatRange(shape, d + 1, 0, end % inner, prefix, out);
  }
}

}  // namespace

std::vector<Region> FlatRangeToRegions(absl::Span<const int64_t> shape,
                                       int64_t begin, int64_t end) {
  std::vector<Region> out;
  if (begin >= end) return out;
  if (shape.empty()) {  // a scalar: its single element
    out.push_back(Region());
    return out;
  }
  AppendFlatRange(shape, 0, begin, end, Region::Full(shape), &out);
  return out;
}

std::vector<Region> FlatRangeOfRegion(const Region& region, int64_t begin,
                                      int64_t end) {
  std::vector<Region> boxes = FlatRangeToRegions(region.shape(), begin, end);
  for (Region& box : boxes) {
    for (int d = 0; d < box.rank(); ++d) {
      box.mutable_dim(d).begin += region.dim(d).begin;
      box.mutable_dim(d).end += region.dim(d).begin;
    }
  }
  return boxes;
}

void CopyRegion(const void* src, const Region& src_box, void* dst,
                const Region& dst_box, const Region& what,
                int64_t element_size) {
  const char* sp = static_cast<const char*>(src);
  char* dp = static_cast<char*>(dst);
  ForEachRun(src_box, dst_box, what, element_size,
             [&](int64_t src_off, int64_t dst_off, int64_t n) {
               std::memcpy(dp + dst_off, sp + src_off, n);
             });
}

}  // namespace ptc
