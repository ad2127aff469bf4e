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
  if (r.was_dead && r.same_process) {
    to_prove_.insert(h.name());
    // A false death: damped if it follows another one closely.
    host.flaps = now - host.last_flap < kFlapWindow ? host.flaps + 1 : 1;
    host.last_flap = now;
    if (host.flaps > 1) {
      absl::Duration hold = kFirstFlapHold;
      for (int i = 2; i < host.flaps && hold < kMaxFlapHold; ++i) hold *= 2;
      host.held_until = now + std::min(hold, kMaxFlapHold);
    }
  }
  const bool draining = host.status.draining();
  host.status = h;
  host.status.set_draining(draining);
  host.status.set_alive(true);
  host.status.clear_held_back_seconds();  // the coordinator's word (HeldBack)
  host.last_heartbeat = now;
  host.registered_at = now;
  host.told = Interval();
  dirty_.insert(h.name());
  return r;
}

bool HostRegistry::Heartbeat(const std::string& name, uint64_t incarnation,
                             absl::Time now) {
  auto it = hosts_.find(name);
  if (it == hosts_.end() || !it->second.status.alive() ||
      (incarnation != 0 && incarnation != it->second.status.incarnation()))
    return false;
  it->second.last_heartbeat = now;
  it->second.told = Interval();
  return true;
}

void HostRegistry::NoteMemoryUsed(const std::string& name, int64_t bytes) {
  auto it = hosts_.find(name);
  if (it != hosts_.end())
    it->second.status.set_memory_used_bytes(std::max<int64_t>(bytes, 0));
}

absl::Duration HostRegistry::Interval() const {
  // Registered hosts, dead ones too (they are few, and expire): counting
  // the live ones would cost a pass over the registry per heartbeat.
  const absl::Duration stretched =
      absl::Seconds(2.0 * static_cast<double>(hosts_.size()) /
                    std::max(cadence_.max_rate, 1.0));
  return std::max(cadence_.interval, stretched);
}

absl::Duration HostRegistry::IntervalOf(const Host& h) const {
  return std::max(h.told, Interval());
}

absl::Duration HostRegistry::TimeoutOf(const Host& h) const {
  return TimeoutFor(IntervalOf(h));
}

absl::Duration HostRegistry::TimeoutFor(absl::Duration interval) const {
  // The operator's timeout spans `ratio` of their intervals; a stretched
  // interval keeps as many of them, up to kIntervalsPerTimeout: beyond
  // that the operator's timeout already spans enough of the longer ones
  // (30 s at 1 s, stretched to 2 s, still waits 15 intervals), and
  // multiplying it would double the time to notice a death.
  const double ratio =
      std::min(absl::FDivDuration(cadence_.timeout, cadence_.interval),
               static_cast<double>(kIntervalsPerTimeout));
  return std::max(cadence_.timeout, interval * ratio);
}

absl::Duration HostRegistry::LongestTimeoutOf(
    const std::vector<std::string>& names) const {
  absl::Duration longest = Timeout();
  for (const std::string& name : names) {
    const Host* h = Find(name);
    if (h != nullptr) longest = std::max(longest, TimeoutOf(*h));
  }
  return longest;
}

bool HostRegistry::Late(const Host& h, absl::Time now) const {
  return h.status.alive() && now - h.last_heartbeat > 2 * IntervalOf(h);
}

const HostRegistry::Host* HostRegistry::Find(const std::string& name) const {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : &it->second;
}

bool HostRegistry::Alive(const std::string& name) const {
  const Host* h = Find(name);
  return h != nullptr && h->status.alive();
}

bool HostRegistry::HeldBack(const std::string& name, absl::Time now) const {
  const Host* h = Find(name);
  return h != nullptr && h->status.alive() && now < h->held_until;
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
  for (const std::string& n : names) {
    hosts_[n].status.set_draining(drain);
    dirty_.insert(n);
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> HostRegistry::Overdue(
    absl::Time now, absl::Time started) const {
  std::vector<std::pair<std::string, std::string>> out;
  // Asked five times a second of every host: the interval and timeout
  // that most hosts share are computed once (absl's duration divisions
  // are not free), a host told a longer interval gets its own.
  const absl::Duration interval = Interval();
  const absl::Duration half = TimeoutFor(interval) / 2;
  for (const auto& [name, h] : hosts_) {
    if (!h.status.alive()) continue;
    const absl::Duration limit =
        h.told > interval ? TimeoutFor(h.told) / 2 : half;
    if (now - std::max(h.last_heartbeat, started) > limit)
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
  dirty_.insert(name);
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
    dirty_.insert(name);
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
  for (const proto::HostStatus& h : legacy.hosts()) {
    hosts_[h.name()] = Host{h, now};
    dirty_.insert(h.name());  // into a record of its own
  }
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

HostRegistry::Records HostRegistry::Writes(
    ControlStore::Writes* writes) const {
  Records changed;
  for (const std::string& name : dirty_) {
    const auto host = hosts_.find(name);
    const auto stored = persisted_.find(name);
    if (host == hosts_.end()) {
      if (stored != persisted_.end())
        (*writes)[HostRecord(name)] = std::nullopt;
      changed[name] = std::nullopt;
      continue;
    }
    std::string bytes = host->second.status.SerializeAsString();
    if (stored == persisted_.end() || stored->second != bytes)
      (*writes)[HostRecord(name)] = bytes;
    changed[name] = std::move(bytes);
  }
  return changed;
}

void HostRegistry::Persisted(Records records) {
  for (auto& [name, bytes] : records) {
    if (bytes.has_value()) {
      persisted_[name] = std::move(*bytes);
    } else {
      persisted_.erase(name);
    }
    dirty_.erase(name);
  }
}

void HostRegistry::PartlyPersisted(const ControlStore::Writes& written) {
  const std::string prefix = HostRecord("");
  for (const auto& [key, bytes] : written) {
    if (!absl::StartsWith(key, prefix)) continue;
    const std::string name = key.substr(prefix.size());
    if (bytes.has_value()) {
      persisted_[name] = *bytes;
    } else {
      persisted_.erase(name);
    }
    dirty_.insert(name);
  }
}

}  // namespace ptc
