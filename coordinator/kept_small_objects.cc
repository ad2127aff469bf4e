#include "coordinator/kept_small_objects.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/placement.h"

namespace ptc {

absl::StatusOr<KeepPlan> MakeKeepPlan(
    const ModelSpec& spec, const std::string& config,
    const std::vector<std::string>& rank_hosts) {
  PTC_ASSIGN_OR_RETURN(ParallelConfig parsed, spec.ParseConfig(config));
  if (static_cast<int64_t>(rank_hosts.size()) != parsed.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the placement places ", rank_hosts.size(), " of ", config,
                     "'s ", parsed.world_size(), " ranks"));
  }
  // Hosts as groups.
  absl::flat_hash_map<std::string, int> id;
  std::vector<int> group(rank_hosts.size());
  for (size_t r = 0; r < rank_hosts.size(); ++r) {
    group[r] = id.try_emplace(rank_hosts[r], static_cast<int>(id.size()))
                   .first->second;
  }
  KeepPlan plan;
  plan.config = config;
  plan.rank_hosts = rank_hosts;
  plan.names.resize(rank_hosts.size());
  for (const SmallObjectClass& c :
       SmallObjectClasses(spec, parsed, [&](int r) { return group[r]; })) {
    if (c.group < 0) continue;  // copies on more than one host
    plan.names[c.first_rank].push_back(spec.small_objects[c.object].name);
    ++plan.objects;
  }
  return plan;
}

bool KeptSmallObjects::Add(const std::string& name, int32_t rank,
                           std::string bytes) {
  auto it = copies_.find(std::make_pair(name, rank));
  const int64_t before = it == copies_.end() ? 0 : it->second.size();
  const int64_t after = bytes_ - before + static_cast<int64_t>(bytes.size());
  if (after > kMaxKeptBytesPerVersion) return false;
  bytes_ = after;
  copies_[std::make_pair(name, rank)] = std::move(bytes);
  return true;
}

const std::string* KeptSmallObjects::Find(const std::string& name,
                                          int32_t rank) const {
  auto it = copies_.find(std::make_pair(name, rank));
  return it == copies_.end() ? nullptr : &it->second;
}

}  // namespace ptc
