#include "ptc/layout_cache.h"

#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "ptc/families.h"

namespace ptc {
namespace {

std::shared_ptr<const ModelSpec> Spec() {
  auto spec =
      SpecForModel("gpt:layers=2,hidden=16,heads=2,vocab=64,positions=8");
  REQUIRE(spec.ok());
  return std::make_shared<const ModelSpec>(*std::move(spec));
}

int64_t Shards(const Layout& l) {
  int64_t n = 0;
  for (int t = 0; t < l.num_tensors(); ++t) n += l.shards(t).size();
  return n;
}

TEST_CASE(
    "layout cache: one build per spec and config, the same layout as a build") {
  const auto spec = Spec();
  LayoutCache cache;
  auto a = cache.Get(spec, "tp=2,dp=2");
  REQUIRE(a.ok());
  // The same config written another way is the same entry.
  auto b = cache.Get(spec, "dp=2,tp=2");
  REQUIRE(b.ok());
  CHECK(a->get() == b->get());
  CHECK(cache.builds() == 1);
  auto built = BuildLayout(*spec, *spec->ParseConfig("tp=2,dp=2"));
  REQUIRE(built.ok());
  REQUIRE((*a)->num_tensors() == built->num_tensors());
  for (int t = 0; t < built->num_tensors(); ++t) {
    REQUIRE((*a)->shards(t).size() == built->shards(t).size());
    for (size_t i = 0; i < built->shards(t).size(); ++i) {
      CHECK((*a)->shards(t)[i].rank == built->shards(t)[i].rank);
      CHECK((*a)->shards(t)[i].region == built->shards(t)[i].region);
    }
  }
  // Another config, and an equal spec that is another object (another job,
  // or a job registered again): entries of their own.
  REQUIRE(cache.Get(spec, "tp=2").ok());
  const auto other = Spec();
  auto c = cache.Get(other, "tp=2,dp=2");
  REQUIRE(c.ok());
  CHECK(c->get() != a->get());
  CHECK(cache.builds() == 3);
}

TEST_CASE("layout cache: errors are the config's and are not kept") {
  const auto spec = Spec();
  LayoutCache cache;
  auto bad = cache.Get(spec, "tp=3");  // 2 heads do not split 3 ways
  CHECK_FALSE(bad.ok());
  CHECK(cache.Get(spec, "tp=").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(cache.Get(nullptr, "tp=2").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(cache.size() == 0);
}

TEST_CASE(
    "layout cache: the least recently used leave beyond the budget; holders "
    "keep theirs") {
  const auto spec = Spec();
  auto probe = BuildLayout(*spec, *spec->ParseConfig("dp=2"));
  REQUIRE(probe.ok());
  // Room for about two layouts of this size.
  LayoutCache cache(2 * Shards(*probe) + 1);
  auto dp2 = cache.Get(spec, "dp=2");
  REQUIRE(dp2.ok());
  REQUIRE(cache.Get(spec, "pp=2").ok());
  REQUIRE(cache.Get(spec, "dp=2").ok());  // used again: the newest
  CHECK(cache.builds() == 2);
  REQUIRE(cache.Get(spec, "tp=2").ok());  // pp=2 leaves, not dp=2
  CHECK(cache.Get(spec, "dp=2").ok());
  CHECK(cache.builds() == 3);
  CHECK(cache.Get(spec, "pp=2").ok());
  CHECK(cache.builds() == 4);
  CHECK(cache.size() <= 3);
  // A layout handed out stays whole after it left the cache.
  LayoutCache tiny(1);
  auto held = tiny.Get(spec, "dp=2");
  REQUIRE(held.ok());
  REQUIRE(tiny.Get(spec, "tp=2").ok());
  CHECK(tiny.size() == 1);
  CHECK(Shards(**held) == Shards(*probe));
}

TEST_CASE("layout cache: callers on many threads share one build") {
  const auto spec = Spec();
  LayoutCache cache;
  std::vector<std::shared_ptr<const Layout>> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto l = cache.Get(spec, "tp=2,dp=2");
      if (l.ok()) got[i] = *l;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& l : got) CHECK(l.get() == got[0].get());
  CHECK(got[0] != nullptr);
  CHECK(cache.builds() == 1);
}

}  // namespace
}  // namespace ptc
