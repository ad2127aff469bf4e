#include "ptc/layout.h"

#include "ptc/families.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>

namespace ptc {
namespace {

// Counts how many ranks hold each element of tensor t (by brute force over
// its elements; shapes here are tiny).
std::map<int64_t, int> Coverage(const ModelSpec& spec, const Layout& layout,
                                int t) {
  std::map<int64_t, int> count;
  const Shape& shape = spec.tensors[t].shape;
  for (const Shard& s : layout.shards(t)) {
    const int64_t n = s.region.volume();
    std::vector<int64_t> idx(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) idx[d] = s.region.dim(d).begin;
    for (int64_t k = 0; k < n; ++k) {
      int64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
      ++count[flat];
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        if (++idx[d] < s.region.dim(d).end) break;
        idx[d] = s.region.dim(d).begin;
      }
    }
  }
  return count;
}

TEST_CASE("layout: every element is held dp times (or once per dp with ZeRO)",
          "[ptc][layout]") {
  auto arch = ParseArchitecture(
      "gpt:layers=3,hidden=16,heads=4,vocab=50,positions=8,pad=4");
  REQUIRE(arch.ok());
  auto spec = BuildModelSpec(*arch);
  REQUIRE(spec.ok());
  for (const char* cfg :
       {"tp=2,pp=3,dp=2", "tp=4,pp=2,dp=3,zero=1", "tp=1,pp=1,dp=5,zero=1"}) {
    const ParallelConfig c = *ParallelConfig::Parse(cfg);
    auto layout = BuildLayout(*spec, c);
    REQUIRE(layout.ok());
    for (int t = 0; t < layout->num_tensors(); ++t) {
      const TensorSpec& ts = spec->tensors[t];
      int stages = 0;
      for (int s = 0; s < c.pp(); ++s)
        stages += ts.stage.HeldBy(s, c, spec->num_layers);
      const int tp_copies = ts.placements.empty() ? c.tp() : 1;
      const int copies =
          (c.zero1 && ts.buffer >= 0 ? 1 : c.dp()) * stages * tp_copies;
      const auto cov = Coverage(*spec, *layout, t);
      INFO(cfg << " tensor " << ts.key);
      REQUIRE(static_cast<int64_t>(cov.size()) == NumElements(ts.shape));
      for (const auto& [flat, n] : cov) {
        if (n != copies) FAIL("element " << flat << " held " << n << " times");
      }
    }
  }
}

TEST_CASE("layout: ZeRO-1 splits each stage's buffer evenly over dp",
          "[ptc][layout]") {
  auto spec = BuildModelSpec(*ParseArchitecture(
      "gpt:layers=2,hidden=16,heads=4,vocab=50,positions=8"));
  REQUIRE(spec.ok());
  const ParallelConfig c = *ParallelConfig::Parse("tp=2,pp=1,dp=3,zero=1");
  auto layout = BuildLayout(*spec, c);
  REQUIRE(layout.ok());
  // Within one tp rank's buffer, the dp ranks' optimizer bytes differ by at
  // most one element per slot (3 * 4 bytes). (Buffers of different tp ranks
  // differ: vocabulary padding leaves tp rank 1 no embedding rows here.)
  std::vector<int64_t> optim(c.world_size(), 0);
  for (int t = 0; t < layout->num_tensors(); ++t) {
    if (spec->tensors[t].role != Role::kOptimizerState) continue;
    for (const Shard& s : layout->shards(t))
      optim[s.rank] += s.region.volume() * 4;
  }
  for (int tp = 0; tp < c.tp(); ++tp) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int r = 0; r < c.world_size(); ++r) {
      if (c.IndexOn(c.CoordOf(r), "tp") != tp) continue;
      lo = std::min(lo, optim[r]);
      hi = std::max(hi, optim[r]);
    }
    CHECK(hi - lo <= 12);
    CHECK(lo > 0);
  }
}

TEST_CASE("layout: a buffer's view agrees with the ranges its members hold",
          "[ptc][layout]") {
  // Megatron-core's distributed optimizer: reverse order, align 64,
  // buckets of ~300 elements padded to lcm(dp, 128), the shared embedding
  // in a bucket of its own under a pipeline.
  auto spec = BuildModelSpec(*ParseArchitecture(
      "gpt:layers=2,hidden=16,heads=4,vocab=50,positions=8,mcore=1,"
      "bucket=300"));
  REQUIRE(spec.ok());
  const int b = 0;
  const FlatBuffer& buf = spec->buffers[b];
  for (const char* cfg : {"tp=2,pp=2,dp=2,zero=1", "tp=1,pp=1,dp=3,zero=1"}) {
    INFO(cfg);
    const ParallelConfig c = *spec->ParseConfig(cfg);
    auto layout = BuildLayout(*spec, c);
    REQUIRE(layout.ok());
    for (int rank = 0; rank < c.world_size(); ++rank) {
      auto view = ViewBuffer(*spec, c, buf.name, rank);
      REQUIRE(view.ok());
      CHECK(view->in_use);
      CHECK(view->shards == c.dp());
      REQUIRE(view->chunks.size() == view->buckets.size());
      int64_t end = 0;
      for (size_t k = 0; k < view->buckets.size(); ++k) {
        const auto [bs, be] = view->buckets[k];
        CHECK(bs == end);
        CHECK((be - bs) % std::lcm<int64_t>(c.dp(), 128) == 0);
        CHECK(view->chunks[k].second - view->chunks[k].first ==
              (be - bs) / c.dp());
        end = be;
      }
      // Elements of each entry inside this rank's chunks = elements of its
      // members on this rank.
      // In buffer order (on stages after the first the tied embedding
      // leads: first_on_later_stages).
      std::vector<BufferView::Entry> placed;
      for (const BufferView::Entry& e : view->entries)
        if (e.offset >= 0) placed.push_back(e);
      std::sort(placed.begin(), placed.end(),
                [](const BufferView::Entry& a, const BufferView::Entry& b) {
                  return a.offset < b.offset;
                });
      int64_t last = 0;
      for (const BufferView::Entry& e : placed) {
        CHECK(e.offset % 64 == 0);
        CHECK(e.offset >= last);
        last = e.offset + e.size;
        // The embedding's padded rows (with_padding) follow its real ones;
        // no member holds them.
        CHECK(e.real <= e.size);
        int64_t owned = 0;
        for (const auto& [lo, hi] : view->chunks) {
          owned += std::max<int64_t>(
              0, std::min(hi, e.offset + e.real) - std::max(lo, e.offset));
        }
        for (size_t t = 0; t < spec->tensors.size(); ++t) {
          if (spec->tensors[t].slot != e.tensor) continue;
          int64_t held = 0;
          for (const Shard& s : layout->shards(t))
            if (s.rank == rank) held += s.region.volume();
          INFO("rank " << rank << " " << spec->tensors[t].key);
          CHECK(held == owned);
        }
      }
      CHECK(last <= end);
    }
  }
  // The embedding takes padded_vocab / tp rows (with_padding): 50 rows
  // padded to 256 at tp=2, all real ones on tp rank 0.
  const ParallelConfig tp2 = *spec->ParseConfig("tp=2,zero=1");
  const int word = spec->FindTensor("embedding.word.weight");
  for (int rank = 0; rank < 2; ++rank) {
    auto view = ViewBuffer(*spec, tp2, buf.name, rank);
    REQUIRE(view.ok());
    for (const BufferView::Entry& e : view->entries) {
      if (e.tensor != word) continue;
      CHECK(e.size == 128 * 16);
      CHECK(e.real == (rank == 0 ? 50 * 16 : 0));
    }
  }
  const ParallelConfig c = *spec->ParseConfig("tp=1,pp=1,dp=2");
  CHECK_FALSE(ViewBuffer(*spec, c, buf.name, 0)->in_use);
  CHECK(ViewBuffer(*spec, c, "nope", 0).status().message() ==
        "the layout has no flat buffer 'nope' (it has: " + buf.name + ")");
  CHECK(ViewBuffer(*spec, c, buf.name, 2).status().message() ==
        "rank 2 is outside the 2 ranks of " + c.ToString());
}

TEST_CASE("layout: placements fill hosts in order and reject too few GPUs",
          "[ptc][layout]") {
  const Cluster cluster = Cluster::Uniform(3, 4);
  auto p = ContiguousPlacement(cluster, {2, 0}, 6);
  REQUIRE(p.ok());
  CHECK(p->host == std::vector<int32_t>{2, 2, 2, 2, 0, 0});
  CHECK(p->device == std::vector<int32_t>{0, 1, 2, 3, 0, 1});
  auto too_many = ContiguousPlacement(cluster, {0}, 5);
  CHECK(too_many.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_many.status().message().find("needs 5 GPUs") != std::string::npos);
  Placement shared{{0, 0}, {1, 1}};
  CHECK(ValidatePlacement(cluster, shared).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("layout: an explicit layout with a region out of bounds is rejected",
          "[ptc][layout]") {
  auto spec = BuildModelSpec(*ParseArchitecture(
      "gpt:layers=1,hidden=8,heads=2,vocab=10,positions=4,adam=0"));
  REQUIRE(spec.ok());
  std::vector<std::vector<Shard>> shards(spec->tensors.size());
  shards[0].push_back({0, Region{{0, 11}, {0, 8}}});
  auto bad = ExplicitLayout(*spec, 1, shards);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("embedding.word.weight") !=
        std::string::npos);
  shards[0][0].rank = 3;
  CHECK(!ExplicitLayout(*spec, 1, shards).ok());
}

}  // namespace
}  // namespace ptc

namespace ptc {
namespace {

TEST_CASE(
    "layout: one rank's regions, built alone, are exactly its shards of the "
    "whole layout",
    "[ptc][layout]") {
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {"gpt:layers=3,hidden=16,heads=4,vocab=50,positions=8,pad=4",
       {"tp=2,pp=3,dp=2", "tp=4,pp=2,dp=3,zero=1", "tp=1,pp=1,dp=5,zero=1"}},
      // Megatron-core's distributed optimizer: buckets, alignment, the
      // shared embedding in a bucket of its own under a pipeline.
      {"gpt:layers=2,hidden=16,heads=4,vocab=50,positions=8,mcore=1,"
       "bucket=300",
       {"tp=2,pp=2,dp=2,zero=1", "tp=1,pp=1,dp=3,zero=1", "tp=2,pp=2,dp=3"}},
      {"llama:layers=3,hidden=32,heads=8,kv_heads=4,ffn=40,vocab=77,mcore=1,"
       "bucket=300",
       {"tp=2,pp=2,dp=2,zero=1", "tp=1,pp=3,dp=1"}},
      {"moe:layers=2,hidden=16,heads=4,kv_heads=2,ffn=12,experts=4,"
       "shared_ffn=8,stacked=0",
       {"tp=2,pp=2,dp=2,zero=1", "tp=1,pp=1,dp=4,ep=2", "tp=1,pp=1,dp=3"}},
  };
  for (const auto& [model, configs] : cases) {
    auto spec = SpecForModel(model);
    REQUIRE(spec.ok());
    for (const char* cfg : configs) {
      INFO(model << " " << cfg);
      auto c = spec->ParseConfig(cfg);
      REQUIRE(c.ok());
      auto layout = BuildLayout(*spec, *c);
      REQUIRE(layout.ok());
      for (int rank = 0; rank < c->world_size(); ++rank) {
        auto mine = BuildRankRegions(*spec, *c, rank);
        REQUIRE(mine.ok());
        REQUIRE(static_cast<int>(mine->size()) == layout->num_tensors());
        for (int t = 0; t < layout->num_tensors(); ++t) {
          std::vector<Region> want;
          for (const Shard& s : layout->shards(t))
            if (s.rank == rank) want.push_back(s.region);
          INFO("rank " << rank << " tensor " << spec->tensors[t].key);
          CHECK((*mine)[t] == want);
        }
      }
    }
  }
  auto spec = SpecForModel(cases[0].first);
  auto c = spec->ParseConfig("tp=2,pp=3,dp=2");
  CHECK(BuildRankRegions(*spec, *c, 12).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(BuildRankRegions(*spec, *c, -1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ptc
