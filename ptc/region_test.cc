#include "ptc/region.h"

#include <array>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>

namespace ptc {
namespace {

TEST_CASE("region: volume, containment and intersection", "[ptc][region]") {
  const Region a{{0, 4}, {0, 8}};
  const Region b{{2, 6}, {4, 10}};
  CHECK(a.volume() == 32);
  CHECK(a.Intersect(b) == Region{{2, 4}, {4, 8}});
  CHECK(a.Contains(Region{{1, 3}, {0, 8}}));
  CHECK(!a.Contains(b));
  CHECK(a.Intersect(Region{{4, 6}, {0, 8}}).empty());
  CHECK(!a.Intersects(Region{{4, 6}, {0, 8}}));
  CHECK(Region().volume() == 1);  // a scalar
  CHECK(a.ToString() == "[0:4, 0:8]");
}

TEST_CASE("region: difference is disjoint and covers exactly the rest",
          "[ptc][region]") {
  std::mt19937 rng(1);
  for (int iter = 0; iter < 300; ++iter) {
    auto random_region = [&] {
      Region r;
      r = Region::Full({6, 5, 4});
      for (int d = 0; d < 3; ++d) {
        int64_t x = rng() % 7, y = rng() % 7;
        r.mutable_dim(d) = {std::min(x, y), std::max(x, y)};
      }
      return r;
    };
    const Region a = random_region(), b = random_region();
    const std::vector<Region> diff = a.Difference(b);
    CHECK(diff.size() <= 6);
    int64_t total = 0;
    for (size_t i = 0; i < diff.size(); ++i) {
      CHECK(a.Contains(diff[i]));
      CHECK(!diff[i].Intersects(b));
      for (size_t j = i + 1; j < diff.size(); ++j) {
        CHECK(!diff[i].Intersects(diff[j]));
      }
      total += diff[i].volume();
    }
    CHECK(total == a.volume() - a.Intersect(b).volume());
  }
}

TEST_CASE("region: validation names the bad dimension", "[ptc][region]") {
  CHECK(ValidateRegion(Region{{0, 4}, {2, 8}}, {4, 8}).ok());
  auto out = ValidateRegion(Region{{0, 4}, {2, 9}}, {4, 8});
  CHECK(out.code() == absl::StatusCode::kInvalidArgument);
  CHECK(out.message().find("dimension 1 ends at 9") != std::string::npos);
  CHECK(ValidateRegion(Region{{3, 2}, {0, 8}}, {4, 8}).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Region{{0, 4}}, {4, 8}).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "region: a flat range of a region is that region's range, placed in the "
    "tensor",
    "[ptc][region]") {
  const Region region{{2, 5}, {10, 14}};  // 3 x 4 of a larger tensor
  for (int64_t b = 0; b <= 12; ++b) {
    for (int64_t e = b; e <= 12; ++e) {
      const std::vector<Region> local = FlatRangeToRegions({3, 4}, b, e);
      const std::vector<Region> placed = FlatRangeOfRegion(region, b, e);
      REQUIRE(placed.size() == local.size());
      for (size_t i = 0; i < placed.size(); ++i) {
        CHECK(placed[i] ==
              Region{{local[i].dim(0).begin + 2, local[i].dim(0).end + 2},
                     {local[i].dim(1).begin + 10, local[i].dim(1).end + 10}});
        CHECK(region.Contains(placed[i]));
      }
    }
  }
}

TEST_CASE("region: a flat range becomes at most 2n-1 rectangles in order",
          "[ptc][region]") {
  const Shape shapes[] = {{7}, {3, 5}, {4, 3, 5}, {2, 3, 2, 4}};
  std::mt19937 rng(2);
  for (const Shape& shape : shapes) {
    const int64_t n = NumElements(shape);
    for (int iter = 0; iter < 200; ++iter) {
      int64_t b = rng() % (n + 1), e = rng() % (n + 1);
      if (b > e) std::swap(b, e);
      const std::vector<Region> parts = FlatRangeToRegions(shape, b, e);
      CHECK(parts.size() <= 2 * shape.size() - 1);
      // Walk the parts' elements in row-major order: they must be exactly
      // the flat indices b, b+1, ..., e-1.
      int64_t next = b;
      for (const Region& p : parts) {
        REQUIRE(ValidateRegion(p, shape).ok());
        std::vector<int64_t> idx(shape.size());
        for (size_t d = 0; d < shape.size(); ++d) idx[d] = p.dim(d).begin;
        for (int64_t k = 0; k < p.volume(); ++k) {
          int64_t flat = 0;
          for (size_t d = 0; d < shape.size(); ++d)
            flat = flat * shape[d] + idx[d];
          CHECK(flat == next);
          ++next;
          for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
            if (++idx[d] < p.dim(d).end) break;
            idx[d] = p.dim(d).begin;
          }
        }
      }
      CHECK(next == e);
    }
  }
}

TEST_CASE("region: copy moves exactly the requested elements between boxes",
          "[ptc][region]") {
  // Global tensor [6, 7, 5] of int32 whose values are their flat indices.
  const Shape shape = {6, 7, 5};
  std::mt19937 rng(3);
  auto random_box = [&](const Region& inside) {
    Region r = inside;
    for (int d = 0; d < 3; ++d) {
      const Interval i = inside.dim(d);
      int64_t x = i.begin + rng() % (i.size() + 1),
              y = i.begin + rng() % (i.size() + 1);
      r.mutable_dim(d) = {std::min(x, y), std::max(x, y)};
    }
    return r;
  };
  for (int iter = 0; iter < 300; ++iter) {
    const Region src_box = random_box(Region::Full(shape));
    const Region dst_box = random_box(Region::Full(shape));
    const Region what = src_box.Intersect(dst_box);
    std::vector<int32_t> src(src_box.volume());
    {
      int64_t k = 0;
      for (int64_t i = src_box.dim(0).begin; i < src_box.dim(0).end; ++i)
        for (int64_t j = src_box.dim(1).begin; j < src_box.dim(1).end; ++j)
          for (int64_t l = src_box.dim(2).begin; l < src_box.dim(2).end; ++l)
            src[k++] = static_cast<int32_t>((i * 7 + j) * 5 + l);
    }
    std::vector<int32_t> dst(dst_box.volume(), -1);
    CopyRegion(src.data(), src_box, dst.data(), dst_box, what, 4);
    int64_t k = 0;
    for (int64_t i = dst_box.dim(0).begin; i < dst_box.dim(0).end; ++i)
      for (int64_t j = dst_box.dim(1).begin; j < dst_box.dim(1).end; ++j)
        for (int64_t l = dst_box.dim(2).begin; l < dst_box.dim(2).end; ++l) {
          const bool inside =
              what.Contains(Region{{i, i + 1}, {j, j + 1}, {l, l + 1}});
          const int32_t want =
              inside ? static_cast<int32_t>((i * 7 + j) * 5 + l) : -1;
          CHECK(dst[k++] == want);
        }
  }
}

TEST_CASE("region: copy of a scalar and of whole rows uses the full run",
          "[ptc][region]") {
  int64_t a = 42, b = 0;
  CopyRegion(&a, Region(), &b, Region(), Region(), 8);
  CHECK(b == 42);
  std::vector<uint8_t> src(4 * 1000), dst(4 * 1000, 0);
  std::iota(src.begin(), src.end(), 0);
  const Region full{{0, 4}, {0, 1000}};
  CopyRegion(src.data(), full, dst.data(), full, full, 1);
  CHECK(src == dst);
}

TEST_CASE("region: runs merge whole trailing dimensions and come in order",
          "[ptc][region]") {
  std::vector<std::array<int64_t, 3>> runs;
  auto record = [&](int64_t src, int64_t dst, int64_t n) {
    runs.push_back({src, dst, n});
  };
  // Whole rows in both boxes: one run for the whole block.
  ForEachRun(Region{{0, 8}, {0, 16}}, Region{{2, 6}, {0, 16}},
             Region{{2, 6}, {0, 16}}, 4, record);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == std::array<int64_t, 3>{2 * 16 * 4, 0, 4 * 16 * 4});
  // A column slice: one run per row, offsets advancing by each box's row.
  runs.clear();
  ForEachRun(Region{{0, 8}, {0, 16}}, Region{{0, 8}, {4, 12}},
             Region{{1, 4}, {4, 12}}, 2, record);
  REQUIRE(runs.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(runs[i] == std::array<int64_t, 3>{((1 + i) * 16 + 4) * 2,
                                            (1 + i) * 8 * 2, 8 * 2});
  }
}

}  // namespace
}  // namespace ptc
