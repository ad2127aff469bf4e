#include "coordinator/host_registry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ptc {

HostRegistry::Registered HostRegistry::Register(const proto::HostStatus& h,
                                                absl::Time now) {
  Host& host = hosts_[h.name()];
  Registered r;
  r.known = !host.status.name().empty();
  r.was_dead = r.known && !host.status.alive();
  r.same_process = r.known && host.status.incarnation() == h.incarnation();
  // The same process back after it was declared dead kept its memory, but
  // it is not trusted until proven (rule 7).
  if (r.was_dead && r.same_process) to_prove_.insert(h.name());
  const bool draining = host.status.draining();
  host.status = h;
  host.status.set_draining(draining);
  host.status.set_alive(true);
  host.last_heartbeat = now;
  host.registered_at = now;
  return r;
}

bool HostRegistry::Heartbeat(const std::string& name, uint64_t incarnation,
                             absl::Time now) {
  auto it = hosts_.find(name);
  if (it == hosts_.end() || !it->second.status.alive() ||
      (incarnation != 0 && incarnation != it->second.status.incarnation()))
    return false;
  it->second.last_heartbeat = now;
  return true;
}

const HostRegistry::Host* HostRegistry::Find(const std::string& name) const {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : &it->second;
}

bool HostRegistry::Alive(const std::string& name) const {
  const Host* h = Find(name);
  return h != nullptr && h->status.alive();
}

bool HostRegistry::Usable(const std::string& name) const {
  const Host* h = Find(name);
  return h != nullptr && h->status.alive() && !h->status.draining();
}

absl::StatusOr<std::vector<std::string>> HostRegistry::Addresses(
    const std::vector<std::string>& names) const {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const std::string& n : names) {
    const Host* h = Find(n);
    if (h == nullptr)
      return absl::NotFoundError(absl::StrCat("host '", n, "' is unknown"));
    out.push_back(h->status.address());
  }
  return out;
}

absl::Status HostRegistry::SetDraining(const std::vector<std::string>& names,
                                       bool drain) {
  for (const std::string& n : names) {
    if (Find(n) == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "host '", n.substr(0, 253),
          "' is not registered; register it (start its ptcd) first"));
    }
  }
  for (const std::string& n : names) hosts_[n].status.set_draining(drain);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> HostRegistry::Overdue(
    absl::Time now, absl::Time started, absl::Duration after) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, h] : hosts_) {
    if (h.status.alive() && now - std::max(h.last_heartbeat, started) > after)
      out.push_back({name, h.status.address()});
  }
  return out;
}

void HostRegistry::HeardFrom(const std::string& name, absl::Time now) {
  auto it = hosts_.find(name);
  if (it != hosts_.end()) it->second.last_heartbeat = now;
}

void HostRegistry::MarkDead(const std::string& name) {
  auto it = hosts_.find(name);
  if (it == hosts_.end()) return;
  it->second.status.set_alive(false);
  to_prove_.erase(name);
}

std::vector<std::string> HostRegistry::Expire(
    absl::Time now, absl::Duration expiry,
    const std::function<bool(const std::string&)>& in_use) {
  std::vector<std::string> gone;
  for (auto it = hosts_.begin(); it != hosts_.end();) {
    const auto& [name, h] = *it;
    if (h.status.alive() || now - h.last_heartbeat < expiry || in_use(name)) {
      ++it;
      continue;
    }
    gone.push_back(name);
    to_prove_.erase(name);
    it = hosts_.erase(it);
  }
  return gone;
}

int HostRegistry::alive_count() const {
  int n = 0;
  for (const auto& [name, h] : hosts_) n += h.status.alive();
  return n;
}

absl::Status HostRegistry::Load(
    const std::map<std::string, std::string>& records,
    const proto::CoordinatorState& legacy, absl::Time now,
    const std::string& where) {
  for (const proto::HostStatus& h : legacy.hosts())
    hosts_[h.name()] = Host{h, now};
  for (const auto& [key, bytes] : records) {
    if (!absl::StartsWith(key, "hosts/")) continue;
    proto::HostStatus h;
    if (!h.ParseFromString(bytes) || h.name().empty()) {
      return absl::DataLossError(absl::StrCat("record '", key, "' in ", where,
                                              " is not a host's registration"));
    }
    persisted_[h.name()] = bytes;
    hosts_[h.name()] = Host{h, now};
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> HostRegistry::Writes(
    ControlStore::Writes* writes) const {
  for (const auto& [name, bytes] : persisted_) {
    if (!hosts_.count(name)) (*writes)[HostRecord(name)] = std::nullopt;
  }
  std::map<std::string, std::string> records;
  for (const auto& [name, h] : hosts_) {
    std::string bytes = h.status.SerializeAsString();
    auto it = persisted_.find(name);
    if (it == persisted_.end() || it->second != bytes)
      (*writes)[HostRecord(name)] = bytes;
    records[name] = std::move(bytes);
  }
  return records;
}

}  // namespace ptc
