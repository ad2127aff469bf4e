#include "coordinator/save_proof.h"

#include <catch2/catch.hpp>

#include "ptc/families.h"

namespace ptc {
namespace {

constexpr char kModel[] =
    "gpt:layers=2,hidden=64,heads=4,ffn=128,vocab=64,positions=8,pad=8";

TEST_CASE(
    "save proof: each host expects its ranks' distinct regions once, and "
    "copies on two hosts that disagree are named",
    "[saves]") {
  auto spec = SpecForModel(kModel);
  REQUIRE(spec.ok());
  auto config = spec->ParseConfig("tp=1,pp=1,dp=4");
  REQUIRE(config.ok());
  auto layout = BuildLayout(*spec, *config);
  REQUIRE(layout.ok());
  // Two replicas on each host.
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  auto shares = SharesOf("j", *spec, *layout, hosts);
  REQUIRE(shares.ok());
  REQUIRE(shares->size() == 2);
  const HostShare& a = shares->at("a");
  CHECK(a.ranks == std::vector<int32_t>{0, 1});
  CHECK(a.expected.size() == static_cast<size_t>(layout->num_tensors()));
  const proto::CommitVersionRequest whole =
      ShareRequest("j", 7, *spec, *layout, a, /*whole=*/true);
  CHECK(whole.job() == "j");
  CHECK(whole.version() == 7);
  CHECK(whole.expectations_id() == a.id);
  CHECK(whole.expect_regions_size() == layout->num_tensors());
  CHECK(whole.expect_small_objects_size() ==
        2 * static_cast<int>(spec->small_objects.size()));
  // By id: the same request without its lists.
  const proto::CommitVersionRequest by_id =
      ShareRequest("j", 8, *spec, *layout, a, /*whole=*/false);
  CHECK(by_id.expectations_id() == a.id);
  CHECK(by_id.version() == 8);
  CHECK(by_id.expect_regions().empty());
  CHECK(by_id.expect_small_objects().empty());
  // The id names the content: the same regions for other ranks (b holds
  // the same replicas) are other expectations; the same placement built
  // again gives the same ids.
  CHECK(a.id != 0);
  CHECK(a.id != shares->at("b").id);
  CHECK(SharesOf("j", *spec, *layout, hosts)->at("a").id == a.id);

  std::map<std::string, proto::CommitVersionResponse> answers;
  for (const auto& [host, share] : *shares) {
    for (const HostShare::Expected& e : share.expected)
      answers[host].add_checksums(1000 * e.tensor + e.region);
  }
  CHECK(CheckReplicas(*spec, *layout, *shares, answers).ok());

  SECTION("a copy that disagrees") {
    answers["b"].set_checksums(3, 1);
    const absl::Status s = CheckReplicas(*spec, *layout, *shares, answers);
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains(absl::StrCat("replicas of tensor '",
                                            spec->tensors[3].key, "'")) &&
                   Catch::Contains("ranks 0,1 on a saved other bytes than "
                                   "ranks 2,3 on b"));
  }
  SECTION("an answer with too few checksums, or none") {
    answers["b"].mutable_checksums()->RemoveLast();
    CHECK(CheckReplicas(*spec, *layout, *shares, answers).code() ==
          absl::StatusCode::kInternal);
    answers.erase("b");
    CHECK(CheckReplicas(*spec, *layout, *shares, answers).code() ==
          absl::StatusCode::kInternal);
  }
  SECTION("a placement that misses a rank") {
    const auto short_shares = SharesOf("j", *spec, *layout, {"a", "a", "b"});
    CHECK(short_shares.status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE(
    "save proof: a job's shares are built once per placement, and which "
    "hosts keep them is remembered until it changes",
    "[saves]") {
  auto spec = SpecForModel(kModel);
  REQUIRE(spec.ok());
  auto shared = std::make_shared<const ModelSpec>(*spec);
  auto layout = BuildLayout(*spec, *spec->ParseConfig("tp=1,pp=1,dp=4"));
  REQUIRE(layout.ok());
  ShareCache cache;
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  auto first = cache.Get("j", shared, "tp=1,pp=1,dp=4", *layout, hosts);
  REQUIRE(first.ok());
  auto again = cache.Get("j", shared, "tp=1,pp=1,dp=4", *layout, hosts);
  REQUIRE(again.ok());
  CHECK(first->get() == again->get());
  const uint64_t id = (*first)->at("a").id;
  CHECK_FALSE(cache.Sent("j", "a", id));
  cache.MarkSent("j", "a", id, true);
  CHECK(cache.Sent("j", "a", id));
  CHECK_FALSE(cache.Sent("j", "b", id));
  cache.MarkSent("j", "a", id, false);  // the host said it does not keep it
  CHECK_FALSE(cache.Sent("j", "a", id));
  cache.MarkSent("j", "a", id, true);

  // Another placement: built again, and nothing is known to be kept.
  auto moved =
      cache.Get("j", shared, "tp=1,pp=1,dp=4", *layout, {"a", "b", "b", "a"});
  REQUIRE(moved.ok());
  CHECK(moved->get() != first->get());
  CHECK_FALSE(cache.Sent("j", "a", (*moved)->at("a").id));
  CHECK_FALSE(cache.Sent("j", "a", id));
  // A placement that misses a rank: its error, and the cache unchanged.
  CHECK(cache.Get("j", shared, "tp=1,pp=1,dp=4", *layout, {"a"})
            .status()
            .code() == absl::StatusCode::kFailedPrecondition);
  cache.Forget("j");
  CHECK_FALSE(cache.Sent("j", "a", (*moved)->at("a").id));
}

}  // namespace
}  // namespace ptc
