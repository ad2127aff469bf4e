#include "coordinator/auto_changes.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace ptc {
namespace {

bool Contains(const google::protobuf::RepeatedPtrField<std::string>& list,
              const std::string& x) {
  return std::find(list.begin(), list.end(), x) != list.end();
}

}  // namespace

std::string NameHosts(const std::vector<std::string>& hosts) {
  if (hosts.size() <= kHostsNamed) {
    return absl::StrCat(hosts.size() > 1 ? "hosts " : "host ",
                        absl::StrJoin(hosts, ", "));
  }
  return absl::StrCat(
      "hosts ",
      absl::StrJoin(hosts.begin(), hosts.begin() + kHostsNamed, ", "),
      " and ", hosts.size() - kHostsNamed, " more");
}

void AutoChanges::ProcessExited(const std::string& job, int64_t epoch,
                                std::string why) {
  process_exits_[job] = {epoch, std::move(why)};
  wake_ = true;
}

void AutoChanges::PolicyChanging(const std::string& job,
                                 const proto::AutoPolicy& old_policy) {
  seen_policy_.emplace(job, old_policy.SerializeAsString());
  retry_.erase(job);
  wake_ = true;
}

void AutoChanges::Forget(const std::string& job) {
  seen_.erase(job);
  seen_policy_.erase(job);
  process_exits_.erase(job);
  retry_.erase(job);
  waiting_since_.erase(job);
}

bool MayPlaceOn(const HostRegistry& hosts,
                const proto::CoordinatorState::Job& job,
                const std::string& host, absl::Time now) {
  // The job's hosts are scanned only for a host held back (rare): the
  // automatic changes' look asks this of every host of a job's pool five
  // times a second under the coordinator's lock, and scanning first took
  // pool x hosts string compares (4 million at 2,048 hosts).
  const HostRegistry::Host* h = hosts.Find(host);
  return h != nullptr && MayPlaceOn(*h, job, now);
}

bool MayPlaceOn(const HostRegistry::Host& host,
                const proto::CoordinatorState::Job& job, absl::Time now) {
  const bool usable = host.status.alive() && !host.status.draining();
  const bool held_back = host.status.alive() && now < host.held_until;
  return usable && (!held_back || Contains(job.hosts(), host.status.name()));
}

std::optional<AutoChanges::Action> AutoChanges::Judge(
    const std::string& name, JobTable::Job& job, const HostRegistry& hosts,
    absl::Time now) {
  proto::CoordinatorState::Job& s = job.state;
  if (s.target_version() != 0 || job.committing_save || job.running)
    return std::nullopt;
  if (auto r = retry_.find(name); r != retry_.end() && r->second > now)
    return std::nullopt;
  if (auto e = process_exits_.find(name);
      e != process_exits_.end() && e->second.first != s.layout_epoch()) {
    // A change committed since that process died: the agent starts its
    // GPU's process anew under the new layout (the other processes of the
    // old one followed the change).
    process_exits_.erase(e);
  }
  const proto::AutoPolicy& policy = s.auto_policy();
  if (s.has_pending()) {
    const double waited = absl::ToUnixMicros(now) / 1e6 - s.pending_unix();
    const double timeout = policy.save_timeout_seconds() > 0
                               ? policy.save_timeout_seconds()
                               : kDefaultSaveTimeout;
    const bool saved = s.committed_version() > s.pending_after_version();
    // A process that died, or the processes of a dead host, will not save:
    // start from what is committed.
    bool lost_process = process_exits_.erase(name) > 0;
    for (const std::string& h : s.hosts()) lost_process |= !hosts.Alive(h);
    if (lost_process && s.pending().hot() && policy.enabled()) {
      // The hot switch cannot finish without every process: the change is
      // planned again from the committed version.
      Log("coordinator")
          ->warn("job {}: a process or host died during the hot switch to "
                 "{}; the job changes from version {}",
                 name, s.pending().to(), s.committed_version());
      process_exits_[name] = {s.layout_epoch(),
                              "a process died during a hot switch"};
      job.ClearPending();
      wake_ = true;
      return std::nullopt;
    }
    // A host the pending change would run on died: the change cannot
    // start (its target is dead). It is dropped and planned afresh at the
    // next look, without the host, not after a failed start and kAutoRetry.
    std::vector<std::string> gone;
    for (const std::string& h : s.pending().hosts())
      if (!hosts.Alive(h)) gone.push_back(h);
    if (!gone.empty() && policy.enabled()) {
      Log("coordinator")
          ->warn(
              "job {}: {} of the pending change to {} died before it "
              "started; the change is planned again",
              name, NameHosts(gone), s.pending().to());
      job.ClearPending();
      wake_ = true;
      return std::nullopt;
    }
    if (!saved && waited <= timeout && !lost_process) return std::nullopt;
    if (!saved) {
      Log("coordinator")
          ->warn("job {}: {}; the change starts from version {}", name,
                 lost_process ? "a process or host died before it saved"
                              : absl::StrCat("no save within ", timeout, " s"),
                 s.committed_version());
    }
    Action a;
    a.job = name;
    a.reason = s.pending_reason();
    a.pending = true;
    a.request = s.pending();
    return a;
  }
  if (!policy.enabled() || s.committed_version() == 0) return std::nullopt;
  Action a;
  a.job = name;
  if (auto e = process_exits_.find(name); e != process_exits_.end()) {
    // Its other processes cannot go on: a change from the committed
    // version forms the job again (the agent starts the process anew).
    a.reason = e->second.second;
    a.must_change = true;
    process_exits_.erase(e);
    return a;
  }
  std::vector<std::string> dead, draining;
  // The last the dead were heard of (the infinite past: none known).
  absl::Time dead_heard = absl::InfinitePast();
  // One lookup per host here and below (the look runs five times a
  // second over every host of the job and its pool).
  for (const std::string& h : s.hosts()) {
    const HostRegistry::Host* host = hosts.Find(h);
    if (host == nullptr || !host->status.alive()) {
      dead.push_back(h);
      if (host != nullptr)
        dead_heard = std::max(dead_heard, host->last_heartbeat);
    } else if (host->status.draining()) {
      draining.push_back(h);
    }
  }
  // What the job may use now: its pool's live hosts in service. Not its
  // config: a change's own commit is no reason for another (one started
  // for it took in a drain that came right after the commit, under the
  // wrong reason).
  const std::string policy_bytes = policy.SerializeAsString();
  std::string seen = absl::StrCat(policy_bytes, "|");
  for (const std::string& h : s.pool()) {
    const HostRegistry::Host* host = hosts.Find(h);
    if (host != nullptr && MayPlaceOn(*host, s, now))
      absl::StrAppend(&seen, h, ":", host->status.gpus(), ",");
  }
  const auto seen_p = seen_policy_.find(name);
  const bool policy_changed =
      seen_p != seen_policy_.end() && seen_p->second != policy_bytes;
  if ((!dead.empty() || !draining.empty() || policy_changed ||
       seen_[name] != seen) &&
      wait_for_late_) {
    // A change is due; it waits while a host of the pool is in doubt:
    // for a death, one that went silent with the dead (kSilentTogether).
    absl::Duration max_wait = absl::ZeroDuration();  // zero: none is late
    for (const auto* names : {&s.pool(), &s.hosts()}) {
      for (const std::string& h : *names) {
        const HostRegistry::Host* host = hosts.Find(h);
        if (host != nullptr && hosts.Late(*host, now) &&
            (dead_heard == absl::InfinitePast() ||
             host->last_heartbeat <=
                 dead_heard + kSilentTogether + 2 * hosts.IntervalOf(*host))) {
          max_wait = std::max(max_wait, hosts.TimeoutOf(*host) +
                                            2 * hosts.IntervalOf(*host));
        }
      }
    }
    const absl::Time since =
        waiting_since_.try_emplace(name, now).first->second;
    if (now - since < max_wait) return std::nullopt;
  }
  waiting_since_.erase(name);
  bool act = true;
  if (!dead.empty()) {
    // Its processes there are gone: the change starts from the committed
    // version, without them. The dead hosts leave the pool (ChangeHosts
    // adds them back; one that returns as the same process rejoins it).
    auto* pool = s.mutable_pool();
    pool->erase(std::remove_if(pool->begin(), pool->end(),
                               [&](const std::string& h) {
                                 return std::find(dead.begin(), dead.end(),
                                                  h) != dead.end();
                               }),
                pool->end());
    for (const std::string& h : dead) {
      if (!Contains(s.left_pool_dead(), h)) s.add_left_pool_dead(h);
    }
    a.reason = absl::StrCat(NameHosts(dead), " died");
  } else if (!draining.empty()) {
    a.reason = absl::StrCat("host ", absl::StrJoin(draining, ", "), " drained");
    a.save_first = policy.live();
  } else if (policy_changed) {
    a.reason = "its automatic-change policy changed";
    a.save_first = policy.live();
  } else if (seen_[name] != seen) {
    std::vector<std::string> joined;
    const absl::flat_hash_set<absl::string_view> on(s.hosts().begin(),
                                                    s.hosts().end());
    for (const std::string& h : s.pool()) {
      if (MayPlaceOn(hosts, s, h, now) && !on.contains(h)) joined.push_back(h);
    }
    a.reason = joined.empty() ? "its hosts changed"
                              : absl::StrCat(NameHosts(joined), " can take it");
    a.save_first = policy.live();
  } else {
    act = false;
  }
  seen_[name] = std::move(seen);
  seen_policy_[name] = policy_bytes;
  if (!act) return std::nullopt;
  return a;
}

}  // namespace ptc
