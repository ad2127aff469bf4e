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
  auto shares = SharesOf("j", 7, *spec, *layout, hosts);
  REQUIRE(shares.ok());
  REQUIRE(shares->size() == 2);
  const HostShare& a = shares->at("a");
  CHECK(a.request.job() == "j");
  CHECK(a.request.version() == 7);
  CHECK(a.request.expect_regions_size() == layout->num_tensors());
  CHECK(a.expected.size() == static_cast<size_t>(layout->num_tensors()));
  for (const HostShare::Expected& e : a.expected)
    CHECK(e.ranks == std::vector<int32_t>{0, 1});
  CHECK(a.request.expect_small_objects_size() ==
        2 * static_cast<int>(spec->small_objects.size()));

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
    const auto short_shares =
        SharesOf("j", 7, *spec, *layout, {"a", "a", "b"});
    CHECK(short_shares.status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ptc
