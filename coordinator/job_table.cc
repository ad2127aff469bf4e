#include "coordinator/job_table.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/placement.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"

namespace ptc {

absl::StatusOr<std::shared_ptr<const ModelSpec>> JobSpec(
    const std::string& model, const proto::LayoutSpec* layout) {
  if (layout != nullptr) {
    if (!model.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("give either a model name ('", model,
                       "') or a layout spec, not both"));
    }
    PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromProto(*layout));
    return std::make_shared<const ModelSpec>(std::move(spec));
  }
  if (model.empty()) {
    return absl::InvalidArgumentError(
        "a job needs a model name or a layout spec");
  }
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecForModel(model));
  return std::make_shared<const ModelSpec>(std::move(spec));
}

absl::StatusOr<std::pair<int32_t, int64_t>> JobShape(
    const ModelSpec& spec, const std::string& config) {
  PTC_ASSIGN_OR_RETURN(ParallelConfig c, spec.ParseConfig(config));
  PTC_RETURN_IF_ERROR(CheckConfig(spec, c));
  return std::make_pair(c.world_size(), spec.TotalBytes());
}

std::map<std::string, int64_t> HostBytesOf(
    const std::shared_ptr<const ModelSpec>& spec, LayoutCache* layouts,
    const std::string& config,
    const google::protobuf::RepeatedPtrField<std::string>& rank_hosts) {
  std::map<std::string, int64_t> out;
  if (config.empty() || rank_hosts.empty()) return out;
  auto c = spec->ParseConfig(config);
  if (!c.ok() || c->world_size() != rank_hosts.size()) return out;
  LayoutCache own(1);
  auto layout = (layouts != nullptr ? layouts : &own)->Get(spec, config);
  if (!layout.ok()) return out;
  std::vector<std::string> names;
  std::map<std::string, int> id_of;
  Placement p;
  for (const std::string& h : rank_hosts) {
    auto [it, added] = id_of.emplace(h, static_cast<int>(names.size()));
    if (added) names.push_back(h);
    p.host.push_back(it->second);
    p.device.push_back(0);
  }
  const std::vector<int64_t> bytes =
      HostStateBytes(*spec, **layout, p, static_cast<int>(names.size()));
  for (size_t h = 0; h < names.size(); ++h) out[names[h]] = bytes[h];
  return out;
}

void JobTable::Job::Derive() {
  auto shape = JobShape(*spec, state.config());
  if (shape.ok()) std::tie(ranks, state_bytes) = *shape;
  host_bytes = HostBytesOf(spec, nullptr, state.config(), state.rank_hosts());
  target_host_bytes = HostBytesOf(spec, nullptr, state.target_config(),
                                  state.target_rank_hosts());
  ranks_on_.clear();
  indexed_epoch_ = -1;
}

int64_t JobTable::Job::NewVersion() {
  const int64_t v =
      std::max({state.next_version(), state.committed_version() + 1,
                state.target_version() + 1});
  state.set_next_version(v + 1);
  return v;
}

bool JobTable::Job::OwnsVersion(int64_t version) const {
  const proto::CoordinatorState::Job& s = state;
  if (version == s.committed_version()) return true;
  if (s.target_version() != 0 && version == s.target_version()) return true;
  // A number never handed out is nobody's yet; leave it (a race with its
  // allocation would otherwise delete a put that is about to be owned).
  if (version >= s.next_version()) return true;
  for (const auto& o : s.open_saves())
    if (o.version() == version) return true;
  return false;
}

bool JobTable::Job::Names(const std::string& host) const {
  auto in = [&](const auto& list) {
    return std::find(list.begin(), list.end(), host) != list.end();
  };
  return in(state.hosts()) || in(state.target_hosts()) ||
         in(state.lost_hosts());
}

void JobTable::Job::ClearPending() {
  if (const int64_t v = state.hot_version(); v != 0) {
    saved.erase(v);
    auto* open = state.mutable_open_saves();
    open->erase(std::remove_if(open->begin(), open->end(),
                               [&](const auto& o) { return o.version() == v; }),
                open->end());
  }
  state.clear_pending();
  state.clear_pending_reason();
  state.set_pending_serial(0);
  state.set_hot_version(0);
  PruneKept();
}

void JobTable::Job::PruneKept() {
  for (auto it = kept.begin(); it != kept.end();)
    it = OwnsVersion(it->first) ? std::next(it) : kept.erase(it);
}

const std::vector<int32_t>* JobTable::Job::RanksOn(const std::string& host) {
  static const std::vector<int32_t> kNone;
  const auto& hosts = state.rank_hosts();
  if (ranks <= 0 || hosts.size() != ranks ||
      state.rank_devices_size() != ranks)
    return nullptr;
  auto answer = [&]() -> const std::vector<int32_t>* {
    auto it = ranks_on_.find(host);
    return it == ranks_on_.end() ? &kNone : &it->second;
  };
  if (indexed_epoch_ == state.layout_epoch() && indexed_ranks_ == ranks) {
    // The placement changes only with the epoch; as a guard, an answer
    // naming a rank no longer on `host` is indexed again (a host that
    // gained ranks without a new epoch would not be seen: no path does).
    const std::vector<int32_t>* found = answer();
    if (std::all_of(found->begin(), found->end(),
                    [&](int32_t r) { return hosts[r] == host; }))
      return found;
  }
  ranks_on_.clear();
  for (int32_t r = 0; r < hosts.size(); ++r) ranks_on_[hosts[r]].push_back(r);
  indexed_epoch_ = state.layout_epoch();
  indexed_ranks_ = ranks;
  return answer();
}

void JobTable::Job::Brief(bool include_layout, proto::JobStatus* s) const {
  s->set_job(state.job());
  s->set_model(state.model());
  s->set_config(state.config());
  s->set_committed_version(state.committed_version());
  s->set_ranks(ranks);
  s->set_state_bytes(state_bytes);
  if (!saved.empty())
    s->set_ranks_saved(static_cast<int32_t>(saved.rbegin()->second.size()));
  s->set_layout_epoch(state.layout_epoch());
  s->set_committed_step(state.committed_step());
  s->set_pending_config(state.pending().to());
  s->set_pending_reason(state.pending_reason());
  s->set_pending_hot(state.pending().hot());
  s->set_pending_serial(state.pending_serial());
  s->set_dropped_save(state.dropped_save());
  // A few (at most --max-open-saves): a waiting rank tells a deleted
  // version from an open one.
  for (const auto& o : state.open_saves()) s->add_open_saves(o.version());
  *s->mutable_auto_policy() = state.auto_policy();
  if (include_layout) *s->mutable_layout() = SpecToProto(*spec);
  // The change without its plan and its hosts' progress, which grow with
  // the job (a 1,008-host change's plan names every rank's host): each of
  // a job's processes asks this after every change.
  const proto::ReconfigureEvent& e = event;
  proto::ReconfigureEvent& r = *s->mutable_reconfiguration();
  r.set_plan_epoch(e.plan_epoch());
  r.set_phase(e.phase());
  r.set_bytes_done(e.bytes_done());
  r.set_bytes_total(e.bytes_total());
  r.set_hosts_done(e.hosts_done());
  r.set_hosts_total(e.hosts_total());
  r.set_seconds(e.seconds());
  r.set_bytes_from_peers(e.bytes_from_peers());
  r.set_tensors_verified(e.tensors_verified());
  r.set_error(e.error());
  r.set_staging_seconds(e.staging_seconds());
  r.set_verifying_seconds(e.verifying_seconds());
  r.set_snapshot_bytes_read(e.snapshot_bytes_read());
  r.set_snapshot_dir(e.snapshot_dir());
  r.set_reason(e.reason());
  r.set_layout_epoch(e.layout_epoch());
  r.set_pending_config(e.pending_config());
  r.set_committed_version(e.committed_version());
  r.set_path(e.path());
  r.set_pending_hot(e.pending_hot());
  r.set_pending_serial(e.pending_serial());
  r.set_replanned(e.replanned());
  r.set_from_config(e.from_config());
  r.set_to_config(e.to_config());
  r.set_dropped_save(e.dropped_save());
}

void JobTable::Job::ArchiveEvent() {
  if (event.phase() != proto::PHASE_COMMITTED &&
      event.phase() != proto::PHASE_ABORTED)
    return;
  if (!history.empty() && history.front().plan_epoch() == event.plan_epoch() &&
      history.front().phase() == event.phase() &&
      history.front().error() == event.error())
    return;
  proto::ReconfigureEvent past = event;
  past.mutable_plan()->clear_flows();
  past.mutable_plan()->clear_rank_hosts();
  past.mutable_plan()->clear_rank_devices();
  past.mutable_plan()->clear_host_send_bytes();
  past.mutable_plan()->clear_host_receive_bytes();
  past.clear_host_progress();
  history.push_front(std::move(past));
  if (history.size() > kHistory) history.pop_back();
}

void JobTable::Job::Describe(bool include_layout, proto::JobStatus* s) const {
  Brief(include_layout, s);
  *s->mutable_reconfiguration() = event;  // with its plan and progress
  for (const proto::ReconfigureEvent& e : history) *s->add_recent_changes() = e;
  for (const std::string& h : state.hosts()) s->add_hosts(h);
  for (const std::string& h : state.lost_hosts()) s->add_lost_hosts(h);
  s->set_snapshot_version(state.snapshot_version());
  s->set_snapshot_root(state.snapshot_root());
  s->set_snapshot_unix(state.snapshot_unix());
  for (const std::string& h : state.pool()) s->add_pool(h);
  if (state.pending().hot()) {
    *s->mutable_pending_rank_hosts() = state.pending().placement().rank_hosts();
    *s->mutable_pending_rank_devices() =
        state.pending().placement().rank_devices();
  }
  for (const std::string& a : spec->mesh) s->add_mesh(a);
}

JobTable::Job* JobTable::Find(const std::string& name) {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobTable::Job* JobTable::Find(const std::string& name) const {
  auto it = jobs_.find(name);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<JobTable::Job*> JobTable::Known(const std::string& name) {
  Job* job = Find(name);
  if (job == nullptr)
    return absl::NotFoundError(absl::StrCat("job '", name, "' is unknown"));
  return job;
}

bool JobTable::NameHost(const std::string& host) const {
  for (const auto& [name, job] : jobs_)
    if (job->Names(host)) return true;
  return false;
}

JobTable::Job& JobTable::Add(std::unique_ptr<Job> job) {
  const std::string name = job->state.job();
  // Plan epochs continue after those of a forgotten job of the same name.
  if (auto r = retired_epochs_.find(name); r != retired_epochs_.end())
    job->state.set_last_epoch(std::max(job->state.last_epoch(), r->second));
  Job& added = *job;
  jobs_[name] = std::move(job);
  return added;
}

std::unique_ptr<JobTable::Job> JobTable::Remove(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return nullptr;
  std::unique_ptr<Job> gone = std::move(it->second);
  jobs_.erase(it);
  const int64_t last_epoch =
      std::max(gone->state.last_epoch(), gone->state.target_epoch());
  auto r = retired_epochs_.find(name);
  retired_before_[name] = r == retired_epochs_.end() ? -1 : r->second;
  int64_t& retired = retired_epochs_[name];
  retired = std::max(retired, last_epoch);
  return gone;
}

void JobTable::Put(std::unique_ptr<Job> job) {
  const std::string name = job->state.job();
  if (auto b = retired_before_.find(name); b != retired_before_.end()) {
    if (b->second < 0) {
      retired_epochs_.erase(name);
    } else {
      retired_epochs_[name] = b->second;
    }
    retired_before_.erase(b);
  }
  jobs_[name] = std::move(job);
}

namespace {

// Exchanges the fields of a job's record that grow with its hosts and
// ranks, or with its layout spec (its layout, placements, host lists and
// pending change), between `a` and `b`: what a save does not change,
// written as a record of its own ("layouts/NAME").
void SwapPlacement(proto::CoordinatorState::Job* a,
                   proto::CoordinatorState::Job* b) {
  a->mutable_hosts()->Swap(b->mutable_hosts());
  a->mutable_target_hosts()->Swap(b->mutable_target_hosts());
  a->mutable_release_hosts()->Swap(b->mutable_release_hosts());
  a->mutable_lost_hosts()->Swap(b->mutable_lost_hosts());
  a->mutable_acked_hosts()->Swap(b->mutable_acked_hosts());
  a->mutable_rank_hosts()->Swap(b->mutable_rank_hosts());
  a->mutable_rank_devices()->Swap(b->mutable_rank_devices());
  a->mutable_target_rank_hosts()->Swap(b->mutable_target_rank_hosts());
  a->mutable_target_rank_devices()->Swap(b->mutable_target_rank_devices());
  a->mutable_pool()->Swap(b->mutable_pool());
  a->mutable_left_pool_dead()->Swap(b->mutable_left_pool_dead());
  proto::LayoutSpec* layout_a = a->has_layout() ? a->release_layout() : nullptr;
  proto::LayoutSpec* layout_b = b->has_layout() ? b->release_layout() : nullptr;
  if (layout_b != nullptr) a->set_allocated_layout(layout_b);
  if (layout_a != nullptr) b->set_allocated_layout(layout_a);
  proto::ReconfigureRequest* pending_a =
      a->has_pending() ? a->release_pending() : nullptr;
  proto::ReconfigureRequest* pending_b =
      b->has_pending() ? b->release_pending() : nullptr;
  if (pending_b != nullptr) a->set_allocated_pending(pending_b);
  if (pending_a != nullptr) b->set_allocated_pending(pending_a);
}

}  // namespace

absl::Status JobTable::Load(const std::map<std::string, std::string>& records,
                            const std::string& where) {
  proto::CoordinatorState cluster;
  if (auto it = records.find(kClusterRecord); it != records.end()) {
    if (!cluster.ParseFromString(it->second)) {
      return absl::DataLossError(absl::StrCat("the cluster record in ", where,
                                              " is not a coordinator state"));
    }
    persisted_.cluster = it->second;
  }
  // A cluster record that still holds hosts or jobs is rewritten without
  // them by the next write (no serialization equals this).
  if (!cluster.hosts().empty() || !cluster.jobs().empty())
    persisted_.cluster = "\xff(with hosts or jobs)";
  retired_epochs_.insert(cluster.retired_epochs().begin(),
                         cluster.retired_epochs().end());
  std::map<std::string, proto::CoordinatorState::Job> loaded;
  for (const auto& js : cluster.jobs()) loaded[js.job()] = js;
  for (const auto& [key, bytes] : records) {
    if (!absl::StartsWith(key, "jobs/")) continue;
    proto::CoordinatorState::Job js;
    if (!js.ParseFromString(bytes) || js.job().empty()) {
      return absl::DataLossError(absl::StrCat("record '", key, "' in ", where,
                                              " is not a job's state"));
    }
    persisted_.jobs[js.job()] = bytes;
    loaded[js.job()] = std::move(js);
  }
  // Each job's placement record: its fields replace the job record's (a
  // record written before the split holds them itself). One of no job
  // is deleted by the next write.
  for (auto it = records.lower_bound("layouts/");
       it != records.end() && absl::StartsWith(it->first, "layouts/"); ++it) {
    proto::CoordinatorState::Job placement;
    if (!placement.ParseFromString(it->second) ||
        it->first != LayoutRecord(placement.job())) {
      return absl::DataLossError(absl::StrCat(
          "record '", it->first, "' in ", where, " is not a job's placement"));
    }
    persisted_.layouts[placement.job()] = it->second;
    auto job = loaded.find(placement.job());
    if (job == loaded.end()) continue;
    proto::CoordinatorState::Job old;
    SwapPlacement(&job->second, &old);
    SwapPlacement(&job->second, &placement);
  }
  for (const auto& [name, js] : loaded) {
    if (js.placement_apart() && !persisted_.layouts.count(name)) {
      return absl::DataLossError(absl::StrCat(
          "job '", name, "' in ", where, " has no record of its placement ('",
          LayoutRecord(name), "'); restore it, or forget the job"));
    }
  }
  for (auto& [name, js] : loaded) {
    auto job = std::make_unique<Job>();
    // A record from before layout epochs, ptc-chosen versions and pools.
    if (js.layout_epoch() == 0) js.set_layout_epoch(1);
    if (js.next_version() == 0) {
      js.set_next_version(
          std::max(js.committed_version(), js.target_version()) + 1);
    }
    if (js.pool().empty()) *js.mutable_pool() = js.hosts();
    auto spec = JobSpec(js.has_layout() ? "" : js.model(),
                        js.has_layout() ? &js.layout() : nullptr);
    if (!spec.ok()) {
      // Refuse to start rather than forget a job with committed state (the
      // next write would drop it).
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", name, "' in ", where,
          " has a layout this coordinator cannot read: ",
          spec.status().message(),
          "; run the ptc version that registered it, or forget the job"));
    }
    job->spec = *std::move(spec);
    job->state = std::move(js);
    job->Derive();
    jobs_[name] = std::move(job);
  }
  LoadKept(records);
  return absl::OkStatus();
}

void JobTable::LoadKept(const std::map<std::string, std::string>& records) {
  // Each job's parts of its committed version, by part.
  std::map<std::string, std::map<int32_t, proto::KeptCopies>> parts;
  std::map<std::string, std::vector<std::string>> keys;
  for (auto it = records.lower_bound("kept/");
       it != records.end() && absl::StartsWith(it->first, "kept/"); ++it) {
    proto::KeptCopies p;
    const Job* job = nullptr;
    if (p.ParseFromString(it->second) &&
        it->first == KeptRecord(p.job(), p.version(), p.part()))
      job = Find(p.job());
    if (job == nullptr || p.version() != job->state.committed_version() ||
        p.part() < 0 || p.part() >= p.parts()) {
      persisted_.stale_kept.push_back(it->first);
      continue;
    }
    keys[p.job()].push_back(it->first);
    parts[p.job()].emplace(p.part(), std::move(p));
  }
  for (auto& [name, by_part] : parts) {
    const int32_t expected = by_part.begin()->second.parts();
    bool whole = static_cast<int32_t>(by_part.size()) == expected;
    for (const auto& [part, p] : by_part)
      whole = whole && p.parts() == expected;
    if (!whole) {
      persisted_.stale_kept.insert(persisted_.stale_kept.end(),
                                   keys[name].begin(), keys[name].end());
      continue;
    }
    std::vector<proto::KeptCopies> in_order;
    for (auto& [part, p] : by_part) in_order.push_back(std::move(p));
    Job& job = *jobs_[name];
    std::shared_ptr<KeptSmallObjects> kept =
        KeptSmallObjects::FromRecords(in_order);
    persisted_.kept[name] = {kept->stamp(), keys[name]};
    job.kept[job.state.committed_version()] = std::move(kept);
  }
}

JobTable::Records JobTable::Writes(ControlStore::Writes* writes) const {
  Records records;
  for (const auto& [name, bytes] : persisted_.jobs) {
    if (!jobs_.count(name)) (*writes)[JobRecord(name)] = std::nullopt;
  }
  for (const auto& [name, bytes] : persisted_.layouts) {
    if (!jobs_.count(name)) (*writes)[LayoutRecord(name)] = std::nullopt;
  }
  for (const auto& [name, job] : jobs_) {
    // Two records: "jobs/NAME" (versions, saves, the change's progress:
    // what every save rewrites, a few hundred bytes) and "layouts/NAME"
    // (what grows with the job, rewritten only when a placement or the
    // host lists change). The placement's fields are lent to `placement`
    // while the two are serialized, and given back.
    job->state.set_placement_apart(true);
    proto::CoordinatorState::Job placement;
    SwapPlacement(&job->state, &placement);
    placement.set_job(name);
    std::string bytes = job->state.SerializeAsString();
    std::string layout = placement.SerializeAsString();
    SwapPlacement(&job->state, &placement);
    auto it = persisted_.jobs.find(name);
    if (it == persisted_.jobs.end() || it->second != bytes)
      (*writes)[JobRecord(name)] = bytes;
    auto lt = persisted_.layouts.find(name);
    if (lt == persisted_.layouts.end() || lt->second != layout)
      (*writes)[LayoutRecord(name)] = layout;
    records.jobs[name] = std::move(bytes);
    records.layouts[name] = std::move(layout);
  }
  // Each job's committed version's kept copies, where they changed; the
  // records they replace are deleted.
  for (const auto& [name, job] : jobs_) {
    const int64_t version = job->state.committed_version();
    auto kept = job->kept.find(version);
    if (kept == job->kept.end() || kept->second->size() == 0 ||
        kept->second->bytes() > kMaxPersistedKeptBytes)
      continue;
    auto before = persisted_.kept.find(name);
    if (before != persisted_.kept.end() &&
        before->second.stamp == kept->second->stamp()) {
      records.kept[name] = before->second;
      continue;
    }
    Records::Kept& now = records.kept[name];
    now.stamp = kept->second->stamp();
    for (const proto::KeptCopies& part :
         kept->second->ToRecords(name, version)) {
      now.keys.push_back(KeptRecord(name, version, part.part()));
      (*writes)[now.keys.back()] = part.SerializeAsString();
    }
  }
  for (const auto& [name, before] : persisted_.kept) {
    auto now = records.kept.find(name);
    for (const std::string& key : before.keys) {
      if (now == records.kept.end() ||
          std::find(now->second.keys.begin(), now->second.keys.end(), key) ==
              now->second.keys.end())
        (*writes)[key] = std::nullopt;
    }
  }
  for (const std::string& key : persisted_.stale_kept)
    writes->try_emplace(key, std::nullopt);  // a put of it now stands

  proto::CoordinatorState cluster;
  cluster.mutable_retired_epochs()->insert(retired_epochs_.begin(),
                                           retired_epochs_.end());
  records.cluster = cluster.SerializeAsString();
  if (records.cluster != persisted_.cluster)
    (*writes)[kClusterRecord] = records.cluster;
  return records;
}

void JobTable::PartlyPersisted(const ControlStore::Writes& written) {
  auto note = [](std::map<std::string, std::string>& records,
                 const std::string& name,
                 const std::optional<std::string>& bytes) {
    if (bytes.has_value()) {
      records[name] = *bytes;
    } else {
      records.erase(name);
    }
  };
  const std::string jobs = JobRecord(""), layouts = LayoutRecord("");
  // Per job, its kept copies' records written: put (true) or deleted.
  std::map<std::string, std::map<std::string, bool>> kept;
  for (const auto& [key, bytes] : written) {
    if (absl::StartsWith(key, jobs)) {
      note(persisted_.jobs, key.substr(jobs.size()), bytes);
    } else if (absl::StartsWith(key, layouts)) {
      note(persisted_.layouts, key.substr(layouts.size()), bytes);
    } else if (key == kClusterRecord && bytes.has_value()) {
      persisted_.cluster = *bytes;
    } else if (absl::StartsWith(key, "kept/")) {
      // "kept/JOB.VERSION.PART": the job is the name before the last two
      // dots.
      const size_t part = key.rfind('.');
      const size_t version = part == std::string::npos || part == 0
                                 ? std::string::npos
                                 : key.rfind('.', part - 1);
      if (version == std::string::npos || version < 5) continue;
      kept[key.substr(5, version - 5)][key] = bytes.has_value();
    }
  }
  // A job's kept copies written in part: the store holds those of before
  // not deleted and those put. Stamp 0 (no copies' stamp) has the next
  // write put every record of the job's copies and delete the others the
  // store holds.
  for (const auto& [name, keys] : kept) {
    Records::Kept& now = persisted_.kept[name];
    std::set<std::string> held(now.keys.begin(), now.keys.end());
    for (const auto& [key, put] : keys) {
      if (put) {
        held.insert(key);
      } else {
        held.erase(key);
      }
    }
    if (held.empty()) {
      persisted_.kept.erase(name);
      continue;
    }
    now.stamp = 0;
    now.keys.assign(held.begin(), held.end());
  }
  std::vector<std::string>& stale = persisted_.stale_kept;
  stale.erase(std::remove_if(stale.begin(), stale.end(),
                             [&](const std::string& key) {
                               auto w = written.find(key);
                               return w != written.end() && !w->second;
                             }),
              stale.end());
}

}  // namespace ptc
