#include "coordinator/kept_small_objects.h"

#include <algorithm>
#include <atomic>

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

uint64_t KeptSmallObjects::NewStamp() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

std::vector<proto::KeptCopies> KeptSmallObjects::ToRecords(
    const std::string& job, int64_t version) const {
  // In a stable order: the same copies make the same records.
  std::vector<
      const std::pair<const std::pair<std::string, int32_t>, std::string>*>
      sorted;
  sorted.reserve(copies_.size());
  for (const auto& copy : copies_) sorted.push_back(&copy);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  std::vector<proto::KeptCopies> parts;
  int64_t part_bytes = kKeptPartBytes;
  for (const auto* copy : sorted) {
    if (part_bytes >= kKeptPartBytes) {
      parts.emplace_back();
      parts.back().set_job(job);
      parts.back().set_version(version);
      parts.back().set_part(static_cast<int32_t>(parts.size() - 1));
      parts.back().set_objects(plan_->objects);
      part_bytes = 0;
    }
    proto::KeptCopies::Copy* c = parts.back().add_copies();
    c->set_name(copy->first.first);
    c->set_rank(copy->first.second);
    c->set_bytes(copy->second);
    part_bytes += static_cast<int64_t>(copy->second.size() + c->name().size());
  }
  for (proto::KeptCopies& p : parts)
    p.set_parts(static_cast<int32_t>(parts.size()));
  return parts;
}

std::shared_ptr<KeptSmallObjects> KeptSmallObjects::FromRecords(
    const std::vector<proto::KeptCopies>& parts) {
  auto plan = std::make_shared<KeepPlan>();
  if (!parts.empty()) plan->objects = parts[0].objects();
  auto kept = std::make_shared<KeptSmallObjects>(std::move(plan));
  for (const proto::KeptCopies& p : parts) {
    for (const proto::KeptCopies::Copy& c : p.copies())
      kept->Add(c.name(), c.rank(), c.bytes());
  }
  return kept;
}

bool KeptSmallObjects::Add(const std::string& name, int32_t rank,
                           std::string bytes) {
  auto it = copies_.find(std::make_pair(name, rank));
  const int64_t before = it == copies_.end() ? 0 : it->second.size();
  const int64_t after = bytes_ - before + static_cast<int64_t>(bytes.size());
  if (after > kMaxKeptBytesPerVersion) return false;
  bytes_ = after;
  copies_[std::make_pair(name, rank)] = std::move(bytes);
  stamp_ = NewStamp();
  return true;
}

const std::string* KeptSmallObjects::Find(const std::string& name,
                                          int32_t rank) const {
  auto it = copies_.find(std::make_pair(name, rank));
  return it == copies_.end() ? nullptr : &it->second;
}

}  // namespace ptc
