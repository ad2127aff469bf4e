#include "coordinator/save_proof.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ptc/region_proto.h"

namespace ptc {
namespace {

std::string Ranks(const std::vector<int32_t>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ","));
}

}  // namespace

// Keyed by region ids and host indexes, not by regions and host names: a
// map of (host name, region) took seconds of CPU per save at 16,384 ranks.
absl::StatusOr<std::map<std::string, HostShare>> SharesOf(
    const std::string& job, int64_t version, const ModelSpec& spec,
    const Layout& layout, const std::vector<std::string>& rank_hosts) {
  if (static_cast<int>(rank_hosts.size()) != layout.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' places ", rank_hosts.size(), " of its ",
        layout.world_size(), " ranks; are all its hosts registered?"));
  }
  std::map<std::string, HostShare> out;
  // Each rank's host's share.
  std::vector<HostShare*> share_of(rank_hosts.size());
  {
    absl::flat_hash_map<absl::string_view, HostShare*> by_name;
    for (size_t r = 0; r < rank_hosts.size(); ++r) {
      HostShare*& share = by_name[rank_hosts[r]];
      if (share == nullptr) {
        share = &out[rank_hosts[r]];
        share->request.set_job(job);
        share->request.set_version(version);
      }
      share_of[r] = share;
    }
  }
  // (host's share, region id) -> index in that host's expectations.
  absl::flat_hash_map<std::pair<const HostShare*, int32_t>, int> index;
  for (int t = 0; t < layout.num_tensors(); ++t) {
    index.clear();
    const std::vector<Shard>& shards = layout.shards(t);
    const std::vector<int32_t>& ids = layout.region_ids(t);
    for (size_t i = 0; i < shards.size(); ++i) {
      const Shard& s = shards[i];
      if (s.region.empty()) continue;
      HostShare& share = *share_of[s.rank];
      auto [it, added] = index.try_emplace({&share, ids[i]},
                                           share.request.expect_regions_size());
      if (added) {
        proto::ExpectedRegion* e = share.request.add_expect_regions();
        e->set_tensor(spec.tensors[t].key);
        RegionToProto(s.region, e->mutable_region());
        share.expected.push_back({t, ids[i], {}});
      }
      share.expected[it->second].ranks.push_back(s.rank);
    }
  }
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    for (const SmallObjectSpec& o : spec.small_objects) {
      proto::ExpectedSmallObject* e =
          share_of[rank]->request.add_expect_small_objects();
      e->set_name(o.name);
      e->set_rank(rank);
    }
  }
  return out;
}

absl::Status CheckReplicas(
    const ModelSpec& spec, const Layout& layout,
    const std::map<std::string, HostShare>& shares,
    const std::map<std::string, proto::CommitVersionResponse>& answers) {
  // The first copy of each region, by tensor and region id.
  struct Copy {
    const std::string* host = nullptr;
    uint64_t checksum = 0;
    const std::vector<int32_t>* ranks = nullptr;
  };
  std::vector<std::vector<Copy>> first(layout.num_tensors());
  for (int t = 0; t < layout.num_tensors(); ++t)
    first[t].resize(layout.regions(t).size());
  for (const auto& [name, share] : shares) {
    auto it = answers.find(name);
    if (it == answers.end())
      return absl::InternalError(absl::StrCat("host ", name, " did not answer"));
    const proto::CommitVersionResponse& answer = it->second;
    if (answer.checksums_size() != share.request.expect_regions_size()) {
      return absl::InternalError(absl::StrCat(
          "host ", name, " answered ", answer.checksums_size(),
          " checksums for ", share.request.expect_regions_size(), " regions"));
    }
    for (int i = 0; i < answer.checksums_size(); ++i) {
      const HostShare::Expected& e = share.expected[i];
      Copy& copy = first[e.tensor][e.region];
      if (copy.host == nullptr) {
        copy = {&name, answer.checksums(i), &e.ranks};
        continue;
      }
      if (copy.checksum == answer.checksums(i)) continue;
      return absl::DataLossError(absl::StrCat(
          "replicas of tensor '", spec.tensors[e.tensor].key, "' ",
          layout.regions(e.tensor)[e.region].ToString(), " disagree: ",
          Ranks(*copy.ranks), " on ", *copy.host, " saved other bytes than ",
          Ranks(e.ranks), " on ", name));
    }
  }
  return absl::OkStatus();
}

}  // namespace ptc
