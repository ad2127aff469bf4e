// The coordinator's host registry: every registered host's registration
// (its record "hosts/NAME" in the control store), when it last sent a
// heartbeat, and which hosts came back from a silence as the same process
// and must be proven before their bytes are used again (rule 7).
//
// It owns that state and its persistence: Writes() says which host records
// changed since the last transaction, Persisted() is told once it
// committed. It decides nothing about jobs; the coordinator asks it.
// Not thread-safe: the coordinator calls it under its lock.
//
//   HostRegistry hosts;
//   HostRegistry::Registered r = hosts.Register(status, absl::Now());
//   if (hosts.Alive("h1")) ...
//   ControlStore::Writes writes;
//   auto records = hosts.Writes(&writes);
//   PTC_RETURN_IF_ERROR(store.Commit(writes));
//   hosts.Persisted(std::move(records));
#ifndef PTC_COORDINATOR_HOST_REGISTRY_H_
#define PTC_COORDINATOR_HOST_REGISTRY_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/control_store.h"
#include "proto/coordinator.pb.h"

namespace ptc {

class HostRegistry {
 public:
  struct Host {
    proto::HostStatus status;
    absl::Time last_heartbeat;
    // When this process of the host registered (the infinite past for a
    // host known from the control store).
    absl::Time registered_at = absl::InfinitePast();
    // The heartbeat interval the host was last told (zero: not told by
    // this coordinator).
    absl::Duration told = absl::ZeroDuration();
    // False deaths (declared dead, back as the same process) close
    // together, the last one's time, and until when jobs do not grow onto
    // the host (FlapHold).
    int flaps = 0;
    absl::Time last_flap = absl::InfinitePast();
    absl::Time held_until = absl::InfinitePast();
  };

  // A host that keeps being declared dead and coming back (a flapping
  // link, a host that stalls) would move its jobs off and back each time,
  // each move rolling them back to their last save. The first false death
  // in kFlapWindow costs nothing more: jobs grow onto the host again at
  // once. Each further one holds the growth for kFirstFlapHold, doubled
  // per flap, at most kMaxFlapHold; a host that stays up for kFlapWindow
  // starts afresh.
  static constexpr absl::Duration kFlapWindow = absl::Minutes(10);
  static constexpr absl::Duration kFirstFlapHold = absl::Seconds(30);
  static constexpr absl::Duration kMaxFlapHold = absl::Minutes(10);
  // Jobs do not grow onto `name` now (alive, but back from its latest of
  // several false deaths a moment ago). Its current jobs stay on it.
  bool HeldBack(const std::string& name, absl::Time now) const;

  // How often hosts heartbeat, and how long a silent one has before it is
  // declared dead. A host sends two heartbeats per interval. The
  // operator's interval and timeout hold while the hosts' heartbeats come
  // at most `max_rate` a second all together; beyond that the interval
  // stretches in proportion to the hosts registered, so that the
  // coordinator's heartbeat load stays bounded as the cluster grows, and
  // the timeout is the longer of the operator's and as many stretched
  // intervals as the operator's spans, at most kIntervalsPerTimeout
  // (2,048 hosts at 500 a second: an interval of 8.2 s, declared dead
  // after 41 s with the default 5 s, and also with 30 s; a host silent
  // for half its timeout is asked directly before that).
  static constexpr int kIntervalsPerTimeout = 5;
  struct Cadence {
    absl::Duration interval = absl::Seconds(1);
    absl::Duration timeout = absl::Seconds(5);
    double max_rate = 500;
  };
  void SetCadence(const Cadence& c) { cadence_ = c; }
  const Cadence& cadence() const { return cadence_; }
  // The interval to tell a host now, and the timeout that goes with it.
  absl::Duration Interval() const;
  absl::Duration Timeout() const { return TimeoutFor(Interval()); }
  // The host's own interval: the longer of what it was last told and
  // what it would be told now (a host told a longer one before the
  // cluster shrank is judged by that until its next heartbeat).
  absl::Duration IntervalOf(const Host& h) const;
  // Silent this long, the host is dead (its interval's share of it).
  absl::Duration TimeoutOf(const Host& h) const;
  // The timeout of a host told to heartbeat every `interval`.
  absl::Duration TimeoutFor(absl::Duration interval) const;
  // The longest TimeoutOf the named hosts (unknown names skipped), and
  // never less than Timeout(): how long a change waits on a silent source.
  absl::Duration LongestTimeoutOf(const std::vector<std::string>& names) const;
  // Alive, and silent for more than two of its intervals: in doubt.
  bool Late(const Host& h, absl::Time now) const;
  // Whether a ptcd that answered a call sent at `asked` with its `uptime`
  // surely started after `registered_at` (another process under the
  // host's name), allowing a second for clocks. Judged by when the call
  // was sent, the earliest it could have been answered: not by when the
  // answer was read, which on a loaded coordinator (or after waiting for
  // slower probes) can be long after, and would make an old process look
  // young.
  static bool StartedAfter(absl::Duration uptime, absl::Time asked,
                           absl::Time registered_at) {
    return registered_at != absl::InfinitePast() &&
           uptime + absl::Seconds(1) < asked - registered_at;
  }

  // What a registration found.
  struct Registered {
    bool known = false;         // the name was registered before
    bool was_dead = false;      // ... and declared dead
    bool same_process = false;  // ... by the same process (incarnation)
  };
  // Records `h` (validated by the caller) as alive, heard from at `now`,
  // told the current Interval().
  // Whether it is drained stays the scheduler's word, not the host's. A
  // host that was dead and comes back as the same process must be proven
  // (NeedsProof) before its bytes are used.
  Registered Register(const proto::HostStatus& h, absl::Time now);

  // A heartbeat from `name` at `now` (the host is told the current
  // Interval()): false if the host is unknown, declared dead, or another
  // process under the name (`incarnation` 0 matches any): it must
  // register again.
  bool Heartbeat(const std::string& name, uint64_t incarnation, absl::Time now);
  // What a live host's heartbeat said of its store's memory in use (shown,
  // not persisted: the next heartbeat after a restart says it again).
  void NoteMemoryUsed(const std::string& name, int64_t bytes);

  // The host's registration, or null if unknown.
  const Host* Find(const std::string& name) const;
  // Registered and not declared dead.
  bool Alive(const std::string& name) const;
  // Alive and not drained: a host a job may be placed on.
  bool Usable(const std::string& name) const;
  // The address of each named host; NOT_FOUND names an unknown one.
  absl::StatusOr<std::vector<std::string>> Addresses(
      const std::vector<std::string>& names) const;
  // Marks registered hosts drained (or not); NOT_FOUND names an unknown one
  // and nothing changes then.
  absl::Status SetDraining(const std::vector<std::string>& names, bool drain);

  // Alive hosts silent for more than half their timeout at `now` (heard
  // from at `started` at the earliest): name and address.
  std::vector<std::pair<std::string, std::string>> Overdue(
      absl::Time now, absl::Time started) const;
  // A host that answered directly counts as heard from at `now`.
  void HeardFrom(const std::string& name, absl::Time now);
  // Declares the host dead (it must register again); it needs no proof
  // any more (its bytes are not trusted at all).
  void MarkDead(const std::string& name);
  // Forgets hosts dead for `expiry` at `now` that `in_use` does not
  // claim; returns their names.
  std::vector<std::string> Expire(
      absl::Time now, absl::Duration expiry,
      const std::function<bool(const std::string&)>& in_use);

  // Hosts back as the same process after a silence, to be proven.
  bool NeedsProof(const std::string& name) const {
    return to_prove_.count(name) > 0;
  }
  const std::set<std::string>& to_prove() const { return to_prove_; }
  void Proven(const std::string& name) { to_prove_.erase(name); }

  const std::map<std::string, Host>& hosts() const { return hosts_; }
  int alive_count() const;
  size_t size() const { return hosts_.size(); }

  // Persistence. Load takes the host records ("hosts/NAME") and the hosts
  // of a cluster record from coordinators before per-host records; every
  // host gets one timeout from `now` to heartbeat again. DATA_LOSS names a
  // record that is not a host's registration.
  absl::Status Load(const std::map<std::string, std::string>& records,
                    const proto::CoordinatorState& legacy, absl::Time now,
                    const std::string& where);
  // Adds to `writes` the host records that changed since Persisted (new or
  // changed registrations; deletes for forgotten hosts) and returns what
  // those records hold after them (nullopt: deleted), for Persisted once
  // they committed. Only the hosts touched since are looked at: a host's
  // registration costs the same in a cluster of thousands.
  using Records = std::map<std::string, std::optional<std::string>>;
  Records Writes(ControlStore::Writes* writes) const;
  void Persisted(Records records);
  // After a write that failed part way: `written` holds the records that
  // did commit (of hosts and others). The hosts stay to be looked at by
  // the next Writes, which compares with what they now hold.
  void PartlyPersisted(const ControlStore::Writes& written);

 private:
  std::map<std::string, Host> hosts_;
  std::set<std::string> to_prove_;
  Cadence cadence_;
  // What each host's record holds now, by host name.
  std::map<std::string, std::string> persisted_;
  // Hosts registered, changed or forgotten since their record was written.
  std::set<std::string> dirty_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_HOST_REGISTRY_H_
