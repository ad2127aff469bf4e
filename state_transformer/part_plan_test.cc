// The part plan driven by hand: fragments written out in full, no store,
// transport or thread.
#include "state_transformer/part_plan.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

// A fragment of host 0 over one int32 tensor "w" of 1024 elements (and a
// 2-D fp32 tensor "m" of 64x64 for the wire parts).
FragmentJob OneTensor() {
  FragmentJob job;
  job.job = "j";
  job.host = 0;
  job.tensors = {{"w", DType::kInt32, {1024}}};
  return job;
}

std::vector<int32_t> Pieces(const FragmentPart& part) { return part.pieces; }

TEST_CASE(
    "part plan: a region stored as it is and kept in place is linked and "
    "moves nothing",
    "[transformer][part_plan]") {
  FragmentJob job = OneTensor();
  job.holds = {{0, Region{{0, 512}}}};
  job.pieces = {{0, Region{{0, 512}}, /*source_host=*/0}};
  const FragmentPartPlan plan = PlanFragmentParts(job, {true});
  CHECK(plan.linked == std::vector<int32_t>{0});
  CHECK(plan.staged.empty());
  CHECK(plan.in_place == std::vector<int32_t>{0});
  CHECK(plan.parts.empty());
  CHECK(plan.bytes_total == 512 * 4);
  CHECK(plan.bytes_in_place == 512 * 4);
}

TEST_CASE(
    "part plan: a region kept on this host but stored in other pieces is "
    "staged and copied",
    "[transformer][part_plan]") {
  FragmentJob job = OneTensor();
  job.holds = {{0, Region{{0, 512}}}};
  job.pieces = {{0, Region{{0, 512}}, 0}};
  const FragmentPartPlan plan = PlanFragmentParts(job, {false});
  CHECK(plan.linked.empty());
  CHECK(plan.staged == std::vector<int32_t>{0});
  REQUIRE(plan.parts.size() == 1);
  CHECK(plan.parts[0].method == PartMethod::kCopy);
  CHECK(plan.parts[0].source_host == 0);
  CHECK(plan.lands_in[0] == std::vector<int32_t>{0});
  CHECK(plan.bytes_in_place == 0);
}

TEST_CASE(
    "part plan: a linked region that overlaps a staged one is still copied "
    "into it",
    "[transformer][part_plan]") {
  // Holds [0:4] (stored as is: linked) and [2:6]; pieces [0:4] kept in
  // place and [4:6] copied. [0:4] must also fill [2:4] of the staged one.
  FragmentJob job = OneTensor();
  job.holds = {{0, Region{{0, 4}}}, {0, Region{{2, 6}}}};
  job.pieces = {{0, Region{{0, 4}}, 0}, {0, Region{{4, 6}}, 0}};
  const FragmentPartPlan plan = PlanFragmentParts(job, {true, false});
  CHECK(plan.linked == std::vector<int32_t>{0});
  CHECK(plan.staged == std::vector<int32_t>{1});
  CHECK(plan.in_place.empty());
  CHECK(plan.lands_in[0] == std::vector<int32_t>{0});  // index into staged
  CHECK(plan.lands_in[1] == std::vector<int32_t>{0});
  REQUIRE(plan.parts.size() == 2);
  for (const FragmentPart& p : plan.parts) {
    CHECK(p.method == PartMethod::kCopy);
    CHECK(p.pieces.size() == 1);
  }
}

TEST_CASE("part plan: a piece lands in every staged region it touches",
          "[transformer][part_plan]") {
  FragmentJob job = OneTensor();
  job.holds = {{0, Region{{0, 100}}}, {0, Region{{100, 200}}},
               {0, Region{{300, 400}}}};
  job.pieces = {{0, Region{{50, 150}}, 1}, {0, Region{{0, 50}}, 1},
                {0, Region{{150, 200}}, 1}, {0, Region{{300, 400}}, 2}};
  const FragmentPartPlan plan =
      PlanFragmentParts(job, {false, false, false});
  CHECK(plan.lands_in[0] == std::vector<int32_t>{0, 1});
  CHECK(plan.lands_in[1] == std::vector<int32_t>{0});
  CHECK(plan.lands_in[2] == std::vector<int32_t>{1});
  CHECK(plan.lands_in[3] == std::vector<int32_t>{2});
}

TEST_CASE(
    "part plan: remote pieces are batched per source and dealt round-robin "
    "over the sources",
    "[transformer][part_plan]") {
  // 48 MiB pieces: two never share a 64 MiB batch. Host 1 has three,
  // host 2 one, the snapshot one.
  FragmentJob job;
  job.host = 4;
  const int64_t n = int64_t{12} << 20;  // int32 elements per piece
  job.tensors = {{"w", DType::kInt32, {8 * n}}};
  auto piece = [&](int k, int32_t source) {
    return FragmentPiece{0, Region{{k * n, (k + 1) * n}}, source};
  };
  job.pieces = {piece(0, 1), piece(1, 1), piece(2, 2), piece(3, 1),
                piece(4, kFromSnapshot)};
  job.holds = {{0, Region{{0, 5 * n}}}};
  const FragmentPartPlan plan = PlanFragmentParts(job, {false});
  REQUIRE(plan.parts.size() == 5);
  // Sources in id order: -1 (snapshot), 1, 2; host 4 starts at 4 % 3 = 1.
  std::vector<int32_t> sources;
  for (const FragmentPart& p : plan.parts) sources.push_back(p.source_host);
  CHECK(sources == std::vector<int32_t>{1, 2, -1, 1, 1});
  CHECK(plan.parts[0].method == PartMethod::kPull);
  CHECK(plan.parts[2].method == PartMethod::kSnapshot);
  CHECK(Pieces(plan.parts[0]) == std::vector<int32_t>{0});
  CHECK(Pieces(plan.parts[3]) == std::vector<int32_t>{1});
  CHECK(Pieces(plan.parts[4]) == std::vector<int32_t>{3});
  for (const FragmentPart& p : plan.parts) CHECK(p.bytes == 4 * n);
}

TEST_CASE(
    "part plan: small pieces of one source share batches up to the piece "
    "cap",
    "[transformer][part_plan]") {
  FragmentJob job = OneTensor();
  job.tensors[0].shape = {1000};
  job.holds = {{0, Region{{0, 1000}}}};
  for (int64_t i = 0; i < 300; ++i)
    job.pieces.push_back({0, Region{{i, i + 1}}, 3});
  job.pieces.push_back({0, Region{{300, 1000}}, 0});  // a local copy
  const FragmentPartPlan plan = PlanFragmentParts(job, {false});
  REQUIRE(plan.parts.size() == 3);
  size_t remote = 0, local = 0;
  for (const FragmentPart& p : plan.parts) {
    if (p.method == PartMethod::kCopy) {
      ++local;
      CHECK(p.pieces == std::vector<int32_t>{300});
    } else {
      remote += p.pieces.size();
      CHECK(p.pieces.size() <= kMaxBatchPieces);
    }
  }
  CHECK(local == 1);
  CHECK(remote == 300);
  CHECK(plan.bytes_total == 1000 * 4);
}

}  // namespace
}  // namespace ptc
