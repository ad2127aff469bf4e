#include "coordinator/save_proof.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "ptc/region_proto.h"

namespace ptc {
namespace {

std::string Ranks(const std::vector<int32_t>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ","));
}

// The ranks of `share` that hold region `region` of tensor `t` (for a
// message: a scan of the tensor's shards).
std::vector<int32_t> RanksHolding(const Layout& layout, int t, int32_t region,
                                  const HostShare& share) {
  std::vector<int32_t> out;
  const std::vector<Shard>& shards = layout.shards(t);
  const std::vector<int32_t>& ids = layout.region_ids(t);
  for (size_t i = 0; i < shards.size(); ++i) {
    if (ids[i] == region && !shards[i].region.empty() &&
        std::binary_search(share.ranks.begin(), share.ranks.end(),
                           shards[i].rank))
      out.push_back(shards[i].rank);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

template <typename T>
void Append(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A checksum of what `share` expects: the tensors' keys, each expected
// region's tensor and bounds, and each small object (name, rank).
uint64_t IdOf(const ModelSpec& spec, const Layout& layout,
              const HostShare& share) {
  std::string bytes;
  for (const TensorSpec& t : spec.tensors) {
    Append(bytes, t.key.size());
    bytes += t.key;
  }
  for (const HostShare::Expected& e : share.expected) {
    Append(bytes, e.tensor);
    for (const Interval& d : layout.regions(e.tensor)[e.region].dims()) {
      Append(bytes, d.begin);
      Append(bytes, d.end);
    }
  }
  for (int32_t rank : share.ranks) {
    for (const SmallObjectSpec& o : spec.small_objects) {
      Append(bytes, o.name.size());
      bytes += o.name;
      Append(bytes, rank);
    }
  }
  const uint64_t id = Checksum(bytes.data(), bytes.size());
  return id != 0 ? id : 1;
}

}  // namespace

// Keyed by region ids and host indexes, not by regions and host names: a
// map of (host name, Region) took seconds of CPU per save at 16,384 ranks.
absl::StatusOr<Shares> SharesOf(const std::string& job, const ModelSpec& spec,
                                const Layout& layout,
                                const std::vector<std::string>& rank_hosts) {
  if (static_cast<int>(rank_hosts.size()) != layout.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' places ", rank_hosts.size(), " of its ",
        layout.world_size(), " ranks; are all its hosts registered?"));
  }
  Shares out;
  // Each rank's host's share.
  std::vector<HostShare*> share_of(rank_hosts.size());
  {
    absl::flat_hash_map<absl::string_view, HostShare*> by_name;
    for (size_t r = 0; r < rank_hosts.size(); ++r) {
      HostShare*& share = by_name[rank_hosts[r]];
      if (share == nullptr) share = &out[rank_hosts[r]];
      share->ranks.push_back(static_cast<int32_t>(r));
      share_of[r] = share;
    }
  }
  // (host's share, region id) already expected.
  absl::flat_hash_map<std::pair<const HostShare*, int32_t>, bool> seen;
  for (int t = 0; t < layout.num_tensors(); ++t) {
    seen.clear();
    const std::vector<Shard>& shards = layout.shards(t);
    const std::vector<int32_t>& ids = layout.region_ids(t);
    for (size_t i = 0; i < shards.size(); ++i) {
      const Shard& s = shards[i];
      if (s.region.empty()) continue;
      HostShare& share = *share_of[s.rank];
      if (seen.try_emplace({&share, ids[i]}, true).second)
        share.expected.push_back({t, ids[i]});
    }
  }
  for (auto& [name, share] : out) share.id = IdOf(spec, layout, share);
  return out;
}

proto::CommitVersionRequest ShareRequest(const std::string& job,
                                         int64_t version, const ModelSpec& spec,
                                         const Layout& layout,
                                         const HostShare& share, bool whole) {
  proto::CommitVersionRequest req;
  req.set_job(job);
  req.set_version(version);
  req.set_expectations_id(share.id);
  if (!whole) return req;
  req.mutable_expect_regions()->Reserve(
      static_cast<int>(share.expected.size()));
  for (const HostShare::Expected& e : share.expected) {
    proto::ExpectedRegion* r = req.add_expect_regions();
    r->set_tensor(spec.tensors[e.tensor].key);
    RegionToProto(layout.regions(e.tensor)[e.region], r->mutable_region());
  }
  for (int32_t rank : share.ranks) {
    for (const SmallObjectSpec& o : spec.small_objects) {
      proto::ExpectedSmallObject* s = req.add_expect_small_objects();
      s->set_name(o.name);
      s->set_rank(rank);
    }
  }
  return req;
}

absl::Status CheckReplicas(
    const ModelSpec& spec, const Layout& layout, const Shares& shares,
    const std::map<std::string, proto::CommitVersionResponse>& answers) {
  // The first copy of each region, by tensor and region id.
  struct Copy {
    const std::string* host = nullptr;
    uint64_t checksum = 0;
    const HostShare* share = nullptr;
  };
  std::vector<std::vector<Copy>> first(layout.num_tensors());
  for (int t = 0; t < layout.num_tensors(); ++t)
    first[t].resize(layout.regions(t).size());
  for (const auto& [name, share] : shares) {
    auto it = answers.find(name);
    if (it == answers.end())
      return absl::InternalError(absl::StrCat("host ", name, " did not answer"));
    const proto::CommitVersionResponse& answer = it->second;
    if (answer.checksums_size() != static_cast<int>(share.expected.size())) {
      return absl::InternalError(
          absl::StrCat("host ", name, " answered ", answer.checksums_size(),
                       " checksums for ", share.expected.size(), " regions"));
    }
    for (int i = 0; i < answer.checksums_size(); ++i) {
      const HostShare::Expected& e = share.expected[i];
      Copy& copy = first[e.tensor][e.region];
      if (copy.host == nullptr) {
        copy = {&name, answer.checksums(i), &share};
        continue;
      }
      if (copy.checksum == answer.checksums(i)) continue;
      return absl::DataLossError(absl::StrCat(
          "replicas of tensor '", spec.tensors[e.tensor].key, "' ",
          layout.regions(e.tensor)[e.region].ToString(), " disagree: ",
          Ranks(RanksHolding(layout, e.tensor, e.region, *copy.share)), " on ",
          *copy.host, " saved other bytes than ",
          Ranks(RanksHolding(layout, e.tensor, e.region, share)), " on ",
          name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Shares>> ShareCache::Get(
    const std::string& job, const std::shared_ptr<const ModelSpec>& spec,
    const std::string& config, const Layout& layout,
    const std::vector<std::string>& rank_hosts) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end() && it->second.spec == spec &&
        it->second.config == config && it->second.rank_hosts == rank_hosts)
      return it->second.shares;
  }
  // Built outside the lock (about a second at 16,384 ranks).
  PTC_ASSIGN_OR_RETURN(Shares built, SharesOf(job, *spec, layout, rank_hosts));
  auto shares = std::make_shared<const Shares>(std::move(built));
  absl::MutexLock lock(&mu_);
  jobs_[job] = Entry{spec, config, rank_hosts, shares, {}};
  return shares;
}

bool ShareCache::Sent(const std::string& job, const std::string& host,
                      uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second.sent.count({host, id}) > 0;
}

void ShareCache::MarkSent(const std::string& job, const std::string& host,
                          uint64_t id, bool kept) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  if (kept) {
    it->second.sent.insert({host, id});
  } else {
    it->second.sent.erase({host, id});
  }
}

void ShareCache::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job);
}

}  // namespace ptc
