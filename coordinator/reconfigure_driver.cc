#include "coordinator/reconfigure_driver.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/parallel_for.h"
#include "common/status_macros.h"
#include "coordinator/internal/fingerprint_calls.h"
#include "plan/internal/cover.h"
#include "plan/plan_proto.h"
#include "plan/snapshot_plan.h"
#include "proto/transformer.grpc.pb.h"
#include "tensor_store/store_client.h"

namespace ptc {
namespace {

std::string HostLabel(const ReconfigureRequest& r, int32_t host) {
  auto it = r.addresses.find(host);
  return absl::StrCat(r.input->cluster->hosts[host].name, " (",
                      it == r.addresses.end() ? "no address" : it->second, ")");
}

// Which live hosts hold each distinct source region of each tensor: the
// other holders a target may take a piece from if its planned source fails
// mid-transfer. Layouts repeat few distinct regions over many ranks, so a
// lookup scans a handful of regions.
class SourceHolders {
 public:
  explicit SourceHolders(const ReconfigureRequest& r) {
    const PlanInput& in = *r.input;
    by_tensor_.resize(in.spec->tensors.size());
    for (size_t t = 0; t < by_tensor_.size(); ++t) {
      for (const Shard& s : in.source->shards(static_cast<int>(t))) {
        const int32_t host = in.source_placement->host[s.rank];
        if (!in.HoldsSource(host)) continue;
        auto& regions = by_tensor_[t];
        auto it =
            std::find_if(regions.begin(), regions.end(),
                         [&](const auto& e) { return e.first == s.region; });
        if (it == regions.end()) {
          regions.push_back({s.region, {}});
          it = std::prev(regions.end());
        }
        if (std::find(it->second.begin(), it->second.end(), host) ==
            it->second.end())
          it->second.push_back(host);
      }
    }
    ranks_.resize(by_tensor_.size());
    for (size_t t = 0; t < by_tensor_.size(); ++t)
      ranks_[t] = static_cast<int>(in.spec->tensors[t].shape.size());
  }

  // Up to kMax hosts besides the piece's source and target that hold all
  // of it.
  std::vector<int32_t> Alternates(const Transfer& x) const {
    constexpr size_t kMax = 16;
    std::vector<int32_t> out;
    auto add = [&](int32_t h) {
      if (h == x.source_host || h == x.target_host ||
          std::find(out.begin(), out.end(), h) != out.end())
        return;
      out.push_back(h);
    };
    // A host with one stored region that contains the piece.
    const auto& regions = by_tensor_[x.tensor];
    for (const auto& [region, hosts] : regions) {
      if (!region.Contains(x.region)) continue;
      for (int32_t h : hosts) {
        add(h);
        if (out.size() == kMax) return out;
      }
    }
    if (!out.empty()) return out;
    // A piece that spans several stored regions of its source (tp shards
    // of a host, read as one): a host whose regions together cover it.
    std::map<int32_t, std::vector<std::pair<int32_t, Region>>> parts;
    for (const auto& [region, hosts] : regions) {
      const Region part = region.Intersect(x.region);
      if (part.empty()) continue;
      for (int32_t h : hosts) parts[h].push_back({0, part});
    }
    constexpr size_t kMaxHostsChecked = 256;
    size_t checked = 0;
    for (const auto& [h, list] : parts) {
      if (h == x.source_host || h == x.target_host) continue;
      if (++checked > kMaxHostsChecked) break;
      int64_t covered = 0;
      for (const auto& [owner, cover] :
           plan_internal::DisjointCover(ranks_[x.tensor], list)) {
        for (const Region& r : cover) covered += r.volume();
      }
      if (covered == x.region.volume()) add(h);
      if (out.size() == kMax) break;
    }
    return out;
  }

 private:
  std::vector<std::vector<std::pair<Region, std::vector<int32_t>>>> by_tensor_;
  std::vector<int> ranks_;
};

proto::ExecuteFragmentRequest FragmentRequest(const ReconfigureRequest& r,
                                              const SourceHolders& holders,
                                              const HostFragment& f) {
  proto::ExecuteFragmentRequest req;
  req.set_job(r.job);
  req.set_source_version(r.source_version);
  req.set_target_version(r.target_version);
  req.set_plan_epoch(r.plan_epoch);
  req.set_host(f.host);
  req.set_parallel_pulls(r.parallel_pulls);
  req.set_transport(r.transport);
  req.set_peer_timeout_ms(absl::ToInt64Milliseconds(r.peer_timeout));
  for (const TensorSpec& t : r.input->spec->tensors) {
    proto::TensorDecl* d = req.add_tensors();
    d->set_key(t.key);
    d->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t e : t.shape) d->add_shape(e);
  }
  Plan one;
  one.fragments.push_back(f);
  if (r.plan->per_rank) {
    // A per-rank (baseline) plan holds a region once per rank; the host's
    // store holds it once, and every rank's fetch still runs.
    std::set<std::pair<int32_t, Region>> seen;
    std::vector<HeldRegion> holds;
    for (const HeldRegion& h : f.holds)
      if (seen.insert({h.tensor, h.region}).second) holds.push_back(h);
    one.fragments[0].holds = std::move(holds);
  }
  *req.mutable_fragment() = PlanToProto(one).fragments(0);
  auto add_peer = [&](int32_t host) {
    auto it = r.addresses.find(host);
    if (it != r.addresses.end()) (*req.mutable_peers())[host] = it->second;
    (*req.mutable_peer_names())[host] = r.input->cluster->hosts[host].name;
  };
  ForEachPiece(f, [&](const Transfer& x) {
    if (x.source_host != kFromSnapshot) add_peer(x.source_host);
  });
  // Other holders of each remote piece, for a source that fails midway.
  for (proto::Transfer& x : *req.mutable_fragment()->mutable_transfers()) {
    if (x.source_host() == f.host || x.source_host() == kFromSnapshot) continue;
    Transfer t;
    t.tensor = x.tensor();
    t.source_host = x.source_host();
    t.target_host = f.host;
    auto region = RegionFromProto(x.region());
    if (!region.ok()) continue;
    t.region = *std::move(region);
    for (int32_t h : holders.Alternates(t)) {
      x.add_alternate_sources(h);
      add_peer(h);
    }
  }
  for (const SmallObjectMove& m : r.plan->small_objects) {
    if (m.target_host != f.host) continue;
    proto::SmallObjectMove* pm = req.add_small_objects();
    pm->set_name(m.name);
    pm->set_target_rank(m.target_rank);
    pm->set_source_rank(m.source_rank);
    pm->set_source_host(m.source_host);
    pm->set_derive_from(m.derive_from);
    pm->set_target_host(m.target_host);
    if (m.derive_from.empty() && m.source_host >= 0) add_peer(m.source_host);
    if (m.kept_rank >= 0 && r.kept_copy) {
      if (const std::string* copy = r.kept_copy(m.name, m.kept_rank)) {
        pm->set_has_kept(true);
        pm->set_kept_rank(m.kept_rank);
        pm->set_kept(*copy);
      }
    }
    for (const SmallObjectMove::Copy& c : m.alternates) {
      pm->add_alternate_ranks(c.rank);
      pm->add_alternate_hosts(c.host);
      add_peer(c.host);
    }
    pm->set_derive_fallback(m.derive_fallback);
  }
  if (r.snapshot != nullptr) {
    *req.mutable_snapshot() =
        SnapshotSourceFor(*r.snapshot, r.snapshot_dir, *r.plan, f);
  }
  return req;
}

// Source hosts (not targets) that hold the only copy of something the plan
// needs, with what: a small object with no other copy and no fresh value
// to fall back on, or a piece no other live host holds. If one goes silent the change cannot
// finish, and is stopped at once rather than when a transfer times out.
std::map<int32_t, std::string> SoleSources(const ReconfigureRequest& r,
                                           const SourceHolders& holders) {
  std::set<int32_t> targets;
  for (const HostFragment& f : r.plan->fragments) targets.insert(f.host);
  std::map<int32_t, std::string> out;
  for (const SmallObjectMove& m : r.plan->small_objects) {
    // Derived, local, from the snapshot, or with another copy or a fresh
    // value to fall back on: no host is its only source.
    if (!m.derive_from.empty() || targets.count(m.source_host) ||
        m.source_host < 0 || !m.alternates.empty() ||
        !m.derive_fallback.empty() || m.kept_rank >= 0)
      continue;
    out.emplace(m.source_host, absl::StrCat("small object '", m.name,
                                            "' of rank ", m.source_rank));
  }
  for (const HostFragment& f : r.plan->fragments) {
    ForEachPiece(f, [&](const Transfer& x) {
      if (targets.count(x.source_host) || out.count(x.source_host) ||
          x.source_host == kFromSnapshot)
        return;
      Transfer t = x;
      t.target_host = f.host;
      if (holders.Alternates(t).empty()) {
        out.emplace(x.source_host,
                    absl::StrCat("a piece of tensor '",
                                 r.input->spec->tensors[x.tensor].key, "'"));
      }
    });
  }
  return out;
}

// The first sole source that is no longer alive, as an error; OK if none.
absl::Status SoleSourceLost(const ReconfigureRequest& r,
                            const std::map<int32_t, std::string>& sole) {
  if (!r.is_alive) return absl::OkStatus();
  for (const auto& [host, what] : sole) {
    if (r.is_alive(host)) continue;
    return WithPlanFailure(
        absl::UnavailableError(absl::StrCat(
            "host ", HostLabel(r, host),
            " went silent during the change (no heartbeat within the host "
            "timeout) and it holds the only copy of ",
            what)),
        PlanFailure::kHostWentSilent);
  }
  return absl::OkStatus();
}

// Tells every source host which target hosts pull from it in this epoch:
// with TLS it serves those hosts' SendParts and ExposePieces only. A source
// that cannot be told is logged, not fatal: its targets then fail to pull
// from it, as they would from a dead host. A cancel (a host went silent)
// stops the waiting at once. Returns the sources that could not be reached
// (unavailable, no answer in time, or gone silent meanwhile).
std::set<int32_t> AdmitPeersOnSources(const ReconfigureRequest& r,
                                      const SourceHolders& holders,
                                      absl::Duration deadline) {
  // source -> the targets that may pull from it (as planned, or as another
  // holder of a piece, or of a small object)
  // A late host (PlanInput::late) is admitted as a planned source only,
  // not as another holder: the change does not wait to tell a host that may
  // be gone.
  std::map<int32_t, std::set<std::string>> pullers;
  for (const HostFragment& f : r.plan->fragments) {
    const std::string& target = r.input->cluster->hosts[f.host].name;
    ForEachPiece(f, [&](const Transfer& x) {
      if (x.source_host == f.host || x.source_host == kFromSnapshot) return;
      pullers[x.source_host].insert(target);
      Transfer t = x;
      t.target_host = f.host;
      for (int32_t h : holders.Alternates(t)) {
        if (!r.input->IsLate(h)) pullers[h].insert(target);
      }
    });
  }
  // Small objects are read from their source host too (GetSmallObject).
  for (const SmallObjectMove& m : r.plan->small_objects) {
    if (!m.derive_from.empty() || m.source_host < 0 ||
        m.source_host == m.target_host)
      continue;
    pullers[m.source_host].insert(r.input->cluster->hosts[m.target_host].name);
    for (const SmallObjectMove::Copy& c : m.alternates) {
      if (c.host != m.target_host && !r.input->IsLate(c.host))
        pullers[c.host].insert(r.input->cluster->hosts[m.target_host].name);
    }
  }
  std::vector<std::string> addresses;
  std::map<std::string, const std::set<std::string>*> of;
  std::map<std::string, int32_t> host_of;
  for (const auto& [source, targets] : pullers) {
    auto it = r.addresses.find(source);
    if (it == r.addresses.end() || (r.is_alive && !r.is_alive(source)))
      continue;
    addresses.push_back(it->second);
    of[it->second] = &targets;
    host_of[it->second] = source;
  }
  absl::Mutex mu;
  std::set<int32_t> unreachable;
  CallEachWithin(
      addresses, deadline,
      [&](const std::string& address, grpc::ClientContext* ctx) {
        proto::AdmitPeersRequest req;
        req.set_job(r.job);
        req.set_plan_epoch(r.plan_epoch);
        for (const std::string& h : *of.at(address)) req.add_hosts(h);
        proto::AdmitPeersResponse resp;
        const absl::Status s =
            FromGrpcStatus(proto::Transformer::NewStub(HostChannel(address))
                               ->AdmitPeers(ctx, req, &resp));
        if (!s.ok() && s.code() != absl::StatusCode::kUnimplemented) {
          Log("coordinator")
              ->warn("job {} epoch {}: admitting peers on {}: {}", r.job,
                     r.plan_epoch, address, s.ToString());
        }
        if (s.code() == absl::StatusCode::kUnavailable ||
            s.code() == absl::StatusCode::kDeadlineExceeded ||
            (s.code() == absl::StatusCode::kCancelled &&
             !(r.cancel != nullptr && r.cancel->load()))) {
          absl::MutexLock lock(&mu);
          unreachable.insert(host_of.at(address));
        }
      },
      r.cancel,
      // A source that went silent is not waited for.
      [&](const std::string& address) {
        return r.is_alive && !r.is_alive(host_of.at(address));
      });
  return unreachable;
}

// A source that could not be told its pullers at the change's start (its
// link was cut a moment ago, before its heartbeats were late) is made late
// and the change planned again, when the caller can: it then sends only
// what no other live host holds, and the change neither stages from it
// nor waits for its fingerprints or its release. A source still
// heartbeating is slow, not cut off, and is not planned around. Returns
// whether it replanned (`input` and `plan` then hold the new ones).
bool ReplanAroundUnreachable(const ReconfigureRequest& r,
                             const std::set<int32_t>& unreachable,
                             PlanInput* input, Plan* plan) {
  if (!r.replan) return false;
  std::vector<std::string> names;
  *input = *r.input;
  input->late.resize(input->cluster->hosts.size(), false);
  for (int32_t h : unreachable) {
    if (h < 0 || h >= static_cast<int32_t>(input->late.size()) ||
        input->IsLate(h) || (r.heard_lately && r.heard_lately(h)))
      continue;
    input->late[h] = true;
    names.push_back(input->cluster->hosts[h].name);
  }
  if (names.empty()) return false;
  absl::StatusOr<Plan> again = r.replan(*input);
  if (!again.ok()) {
    Log("coordinator")
        ->warn("job {} epoch {}: planning again without {} failed ({}); "
               "keeping the plan",
               r.job, r.plan_epoch, absl::StrJoin(names, ", "),
               again.status().ToString());
    return false;
  }
  *plan = *std::move(again);
  Log("coordinator")
      ->warn("job {} epoch {}: {} did not answer at the change's start; "
             "planned again, sending from {} only what no other live host "
             "holds ({} bytes across hosts)",
             r.job, r.plan_epoch, absl::StrJoin(names, ", "),
             names.size() > 1 ? "them" : "it",
             plan->summary.cross_host_bytes);
  return true;
}

// One target host's ExecuteFragment stream, read by gRPC's callback
// threads: staging a change on 2,048 hosts takes no thread per host.
class FragmentStream : public grpc::ClientReadReactor<proto::FragmentProgress> {
 public:
  // Called under the staging's lock with each progress message.
  using OnProgress = std::function<void(const proto::FragmentProgress&)>;
  // Called once, when the stream ended, with how it ended.
  using OnEnd = std::function<void(absl::Status)>;

  FragmentStream(const std::string& address,
                 proto::ExecuteFragmentRequest request, OnProgress on_progress,
                 OnEnd on_end)
      // A target is asked with the patient keepalive: one too busy to
      // answer a ping within 2 s (its CPUs taken by training; at 2,048
      // hollow hosts on two cores every change aborted so) must not abort
      // a change it would finish. A target that goes silent stops the
      // change by its heartbeats (CoordinatorService::CancelFlightsOnLocked).
      : stub_(proto::Transformer::NewStub(
            HostChannel(address, /*patient=*/true))),
        request_(std::move(request)),
        on_progress_(std::move(on_progress)),
        on_end_(std::move(on_end)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(2)));
  }

  void Start() {
    stub_->async()->ExecuteFragment(&context_, &request_, this);
    StartRead(&progress_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (progress_.done()) finished_ = true;
    on_progress_(progress_);
    StartRead(&progress_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::Status s = FromGrpcStatus(status);
    if (s.ok() && !finished_) {
      s = absl::UnavailableError(
          "the fragment's stream ended before it was done");
    }
    // The staging may delete this object once on_end_ ran: nothing of it
    // is touched after.
    OnEnd end = std::move(on_end_);
    end(std::move(s));
  }

 private:
  std::unique_ptr<proto::Transformer::Stub> stub_;
  grpc::ClientContext context_;
  proto::ExecuteFragmentRequest request_;
  proto::FragmentProgress progress_;
  bool finished_ = false;
  OnProgress on_progress_;
  OnEnd on_end_;
};

// Stages the target version on every target host, in parallel.
absl::Status StageAll(
    const ReconfigureRequest& r, const SourceHolders& holders,
    const std::function<void(const ReconfigureProgress&)>& progress,
    ReconfigureReport* report) {
  const int n = static_cast<int>(r.plan->fragments.size());
  absl::Mutex mu;
  ReconfigureProgress total;
  total.hosts_total = n;
  std::vector<int64_t> done(n, 0), remote(n, 0), disk(n, 0);
  std::vector<absl::Status> status(n);
  const absl::Time started = absl::Now();
  std::vector<double> ended(n, 0);  // seconds after `started`
  for (const HostFragment& f : r.plan->fragments) {
    ForEachPiece(f, [&](const Transfer& x) {
      total.bytes_total += x.region.volume() *
                           ElementSize(r.input->spec->tensors[x.tensor].dtype);
    });
  }
  std::atomic<int> running{n};
  std::vector<std::unique_ptr<FragmentStream>> streams(n);
  for (int i = 0; i < n; ++i) {
    const HostFragment& f = r.plan->fragments[i];
    auto it = r.addresses.find(f.host);
    if (it == r.addresses.end()) {
      status[i] = absl::InvalidArgumentError("no address for this target host");
      running.fetch_sub(1);
      continue;
    }
    streams[i] = std::make_unique<FragmentStream>(
        it->second, FragmentRequest(r, holders, f),
        [&, i](const proto::FragmentProgress& p) {
          absl::MutexLock lock(&mu);
          total.bytes_done += p.bytes_done() - done[i];
          done[i] = p.bytes_done();
          remote[i] = p.remote_bytes_done();
          disk[i] = p.snapshot_bytes_read();
          if (p.done()) ++total.hosts_done;
          total.fragment = i;
          total.fragment_bytes_done = p.bytes_done();
          total.fragment_done = p.done();
          if (progress) progress(total);
        },
        [&, i](absl::Status s) {
          {
            absl::MutexLock lock(&mu);
            status[i] = std::move(s);
            ended[i] = absl::ToDoubleSeconds(absl::Now() - started);
          }
          running.fetch_sub(1);
        });
  }
  for (auto& stream : streams)
    if (stream != nullptr) stream->Start();
  auto cancel_all = [&] {
    for (auto& stream : streams)
      if (stream != nullptr) stream->Cancel();
  };
  const std::map<int32_t, std::string> sole = SoleSources(r, holders);
  bool cancelled = false;
  absl::Status lost;
  for (int tick = 0; running.load() > 0; ++tick) {
    if (!cancelled && r.cancel != nullptr && r.cancel->load()) {
      cancelled = true;
      cancel_all();
    }
    if (!cancelled && lost.ok() && tick % 10 == 0) {
      lost = SoleSourceLost(r, sole);
      if (!lost.ok()) cancel_all();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Every stream has ended (OnDone ran): gRPC is done with them.
  if (cancelled)
    return absl::CancelledError("the reconfiguration was aborted by request");
  if (!lost.ok()) return lost;
  if (n > 0) {
    std::sort(ended.begin(), ended.end());
    report->hosts_staged_seconds[0] = ended.front();
    report->hosts_staged_seconds[1] = ended[ended.size() / 2];
    report->hosts_staged_seconds[2] = ended.back();
  }
  for (int i = 0; i < n; ++i) {
    report->bytes_moved += done[i];
    report->bytes_from_peers += remote[i];
    report->snapshot_bytes_read += disk[i];
  }
  for (int i = 0; i < n; ++i) {
    if (!status[i].ok()) {
      return Annotate(status[i],
                      absl::StrCat("staging version ", r.target_version, " on ",
                                   HostLabel(r, r.plan->fragments[i].host)));
    }
  }
  return absl::OkStatus();
}

// The fingerprint and element count of every tensor of one side, each
// element counted once: a disjoint cover of the replicas assigns every
// element to one host (balanced across the replicas by elements), and
// each host fingerprints its share, by a few calls at once
// (coordinator_internal::AskFingerprints). `stop`, when set (the staging
// it runs beside failed), ends it early with CANCELLED.
absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> FingerprintsOnce(
    const ReconfigureRequest& r, const Layout& layout,
    const Placement& placement, int64_t version, bool source,
    const std::set<int32_t>& failed, const std::atomic<bool>& stop,
    int32_t* failed_host) {
  const PlanInput& in = *r.input;
  const int num_tensors = static_cast<int>(in.spec->tensors.size());
  std::map<int32_t, std::vector<coordinator_internal::FingerprintAsk>> asks;
  std::vector<std::string> keys;
  // Elements each host fingerprints so far: replicas share the work (the
  // source's fingerprints run while every host stages). A late source host
  // starts so loaded that it fingerprints only what no other holder has.
  std::map<int32_t, int64_t> load;
  if (source) {
    for (int32_t h = 0; h < static_cast<int32_t>(in.late.size()); ++h) {
      if (in.IsLate(h)) load[h] = int64_t{1} << 60;
    }
  }
  for (int t = 0; t < num_tensors; ++t) {
    keys.push_back(in.spec->tensors[t].key);
    std::vector<std::pair<int32_t, Region>> held;
    for (const Shard& s : layout.shards(t)) {
      const int h = placement.host[s.rank];
      if (failed.count(h)) continue;
      if (source ? in.HoldsSource(h) : in.IsAlive(h))
        held.push_back({h, s.region});
    }
    const int rank = static_cast<int>(in.spec->tensors[t].shape.size());
    for (auto& [host, regions] :
         plan_internal::DisjointCover(rank, held, &load)) {
      asks[host].push_back({t, std::move(regions)});
    }
  }
  coordinator_internal::FingerprintCalls calls;
  calls.job = r.job;
  calls.version = version;
  calls.tensor_keys = &keys;
  calls.addresses = &r.addresses;
  calls.label = [&](int32_t host) { return HostLabel(r, host); };
  calls.is_alive = r.is_alive;
  calls.cancel = r.cancel;
  calls.stop = &stop;
  return coordinator_internal::AskFingerprints(asks, calls, failed_host);
}

// Fingerprints of `version` under `layout`. For the source, a host that
// fails (it died during the change, its targets took its pieces from other
// holders) is left out and the regions it covered are asked of the other
// holders, up to a few times; a region no live host holds fails it.
absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> Fingerprints(
    const ReconfigureRequest& r, const Layout& layout,
    const Placement& placement, int64_t version, bool source,
    const std::atomic<bool>& stop) {
  std::set<int32_t> failed;
  if (source && r.is_alive) {
    for (const auto& [host, address] : r.addresses)
      if (!r.is_alive(host)) failed.insert(host);
  }
  for (int attempt = 0;; ++attempt) {
    int32_t failed_host = -1;
    auto fp = FingerprintsOnce(r, layout, placement, version, source, failed,
                               stop, &failed_host);
    if (fp.ok() || !source || failed_host < 0 || attempt == 3 ||
        !(fp.status().code() == absl::StatusCode::kUnavailable ||
          fp.status().code() == absl::StatusCode::kDeadlineExceeded)) {
      return fp;
    }
    Log("coordinator")
        ->warn(
            "job {}: source {} did not answer for fingerprints ({}); "
            "asking the other holders",
            r.job, HostLabel(r, failed_host), fp.status().ToString());
    failed.insert(failed_host);
  }
}

// The hosts the plan uses (targets, and sources of pieces and small objects)
// that are no longer alive: named when a change fails, since a transfer
// error ("failed to connect", a deadline) rarely says that its peer died.
std::string SilentHostsNote(const ReconfigureRequest& r) {
  if (!r.is_alive) return "";
  std::set<int32_t> used;
  for (const HostFragment& f : r.plan->fragments) {
    used.insert(f.host);
    ForEachPiece(f, [&](const Transfer& x) { used.insert(x.source_host); });
  }
  for (const SmallObjectMove& m : r.plan->small_objects) {
    if (m.derive_from.empty()) used.insert(m.source_host);
  }
  used.erase(kFromSnapshot);
  used.erase(kFromCoordinator);
  std::vector<std::string> silent;
  for (int32_t h : used) {
    if (!r.is_alive(h)) silent.push_back(r.input->cluster->hosts[h].name);
  }
  if (silent.empty()) return "";
  return absl::StrCat(" (", silent.size() > 1 ? "hosts " : "host ",
                      absl::StrJoin(silent, ", "),
                      " went silent during the change: no heartbeat within "
                      "the host timeout)");
}

// The target hosts' addresses; with `live_only`, of those alive now.
std::vector<std::string> TargetAddresses(const ReconfigureRequest& r,
                                         bool live_only) {
  std::vector<std::string> out;
  for (const HostFragment& f : r.plan->fragments) {
    if (live_only && r.is_alive && !r.is_alive(f.host)) continue;
    auto it = r.addresses.find(f.host);
    if (it != r.addresses.end()) out.push_back(it->second);
  }
  return out;
}

}  // namespace

void PauseAtFailpoint(absl::string_view point) {
  static const std::pair<std::string, double> armed = [] {
    const char* v = std::getenv("PTC_TEST_PAUSE");
    std::pair<std::string, double> out;
    if (v == nullptr) return out;
    std::pair<std::string, std::string> kv = absl::StrSplit(v, ':');
    if (absl::SimpleAtod(kv.second, &out.second)) out.first = kv.first;
    return out;
  }();
  if (armed.first != point || armed.second <= 0) return;
  Log("coordinator")
      ->warn("test fault point {}: pausing {} s (PTC_TEST_PAUSE)",
             std::string(point), armed.second);
  absl::SleepFor(absl::Seconds(armed.second));
}

absl::StatusOr<ReconfigureReport> RunReconfiguration(
    const ReconfigureRequest& request,
    const std::function<void(const ReconfigureProgress&)>& progress) {
  if (request.input == nullptr || request.plan == nullptr ||
      request.job.empty() || request.plan_epoch <= 0 ||
      request.target_version == request.source_version) {
    return absl::InvalidArgumentError(
        "a reconfiguration needs an input, a plan, a job, a positive epoch and "
        "a new version");
  }
  const absl::Time start = absl::Now();
  ReconfigureReport report;
  // The request as driven: its input and plan may be replaced below.
  ReconfigureRequest req = request;
  const ReconfigureRequest& r = req;
  PlanInput replanned_input;
  Plan replanned;
  // A source that cannot be told within a couple of seconds (a link cut
  // just now: connecting times out, or a connection that is up waits for
  // its keepalive) is planned around, when the caller can plan again; a
  // source the new plan still needs is told again, with time to answer.
  std::optional<SourceHolders> holding(std::in_place, r);
  const std::set<int32_t> unreachable = AdmitPeersOnSources(
      r, *holding, r.replan ? absl::Seconds(2) : absl::Seconds(10));
  if (!unreachable.empty()) {
    if (ReplanAroundUnreachable(r, unreachable, &replanned_input,
                                &replanned)) {
      req.input = &replanned_input;
      req.plan = &replanned;
      holding.emplace(r);
    }
    AdmitPeersOnSources(r, *holding, absl::Seconds(10));
  }
  report.admitting_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  PauseAtFailpoint("after_admission");
  const SourceHolders& holders = *holding;
  // The source version's fingerprints are taken while the target stages:
  // that version is committed and immutable, so they hold whenever they
  // are taken, and the sources' cores are not all busy staging (a host
  // that dies meanwhile is handled by Fingerprints, as after staging).
  // A snapshot of the source version recorded its fingerprints.
  std::atomic<bool> staging_failed{false};
  absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> before;
  std::thread source([&] {
    before = r.snapshot != nullptr
                 ? SnapshotFingerprints(*r.snapshot)
                 : Fingerprints(r, *r.input->source, *r.input->source_placement,
                                r.source_version, true, staging_failed);
  });
  absl::Status staged = StageAll(r, holders, progress, &report);
  report.staging_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (staged.ok()) {
    const double* h = report.hosts_staged_seconds;
    Log("coordinator")
        ->info(
            "job {} epoch {}: staged on {} hosts in {:.2f} s: sources told "
            "their pullers in {:.2f} s, then the hosts' fragments ended "
            "after {:.2f} / {:.2f} / {:.2f} s (first / median / last)",
            r.job, r.plan_epoch, r.plan->fragments.size(),
            report.staging_seconds, report.admitting_seconds, h[0], h[1], h[2]);
  }
  if (!staged.ok()) staging_failed = true;
  if (staged.ok()) {
    auto after = Fingerprints(r, *r.input->target, *r.input->target_placement,
                              r.target_version, false, staging_failed);
    source.join();
    if (!before.ok()) staged = before.status();
    if (staged.ok() && !after.ok()) staged = after.status();
    for (size_t t = 0; staged.ok() && t < before->size(); ++t) {
      if ((*before)[t] != (*after)[t]) {
        staged = absl::DataLossError(absl::StrCat(
            "tensor '", r.input->spec->tensors[t].key,
            "' differs after the reconfiguration: ", (*after)[t].second,
            " elements with fingerprint ", (*after)[t].first, " vs ",
            (*before)[t].second, " elements with fingerprint ",
            (*before)[t].first, " before"));
      }
      ++report.tensors_verified;
    }
    report.verifying_seconds =
        absl::ToDoubleSeconds(absl::Now() - start) - report.staging_seconds;
  }
  if (source.joinable()) source.join();  // staging failed: stops early
  if (staged.ok() && r.cancel != nullptr && r.cancel->load()) {
    staged = absl::CancelledError("the reconfiguration was aborted by request");
  }
  if (staged.ok() && r.before_commit) staged = r.before_commit();
  if (!staged.ok()) {
    // Dead targets are not waited for: they clean up when they return
    // (their heartbeats list the version, which nothing owns).
    AbortStagedOn(TargetAddresses(r, true), r.job, r.target_version,
                  r.plan_epoch, absl::Seconds(3));
    if (staged.code() != absl::StatusCode::kCancelled &&
        !HasPlanFailure(staged, PlanFailure::kHostWentSilent)) {
      if (std::string note = SilentHostsNote(r); !note.empty()) {
        staged =
            absl::Status(staged.code(), absl::StrCat(staged.message(), note));
      }
    }
    Log("coordinator")
        ->error(
            "job {} epoch {}: reconfiguration aborted, version {} intact: {}",
            r.job, r.plan_epoch, r.source_version, staged.ToString());
    return staged;
  }
  // Commit everywhere. From here the decision is made: a host that does
  // not acknowledge is retried (by the caller, if it says who is alive),
  // never rolled back.
  PTC_RETURN_IF_ERROR(r.is_alive
                          ? CommitStagedOn(TargetAddresses(r, false), r.job,
                                           r.target_version, r.plan_epoch, 1,
                                           absl::Seconds(3))
                          : CommitStagedOn(TargetAddresses(r, false), r.job,
                                           r.target_version, r.plan_epoch));
  if (!r.keep_source) {
    // The job sees the commit once this returns: a source that went silent
    // during the change, or was late from its start, is not waited for (its
    // next heartbeat has it reclaim the version, which nothing owns), and a
    // release is best effort.
    std::set<int32_t> sources;
    for (int32_t h : r.input->source_placement->host) {
      if (r.input->IsAlive(h) && !r.input->IsLate(h) &&
          (!r.is_alive || r.is_alive(h)))
        sources.insert(h);
    }
    std::vector<std::string> release;
    for (int32_t h : sources) {
      auto it = r.addresses.find(h);
      if (it != r.addresses.end()) release.push_back(it->second);
    }
    // The change has committed: its report waits at most a second on a
    // source that does not answer (one cut off just now).
    ReleaseOn(release, r.job, r.source_version, absl::Seconds(1));
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Log("coordinator")
      ->info(
          "job {} epoch {}: version {} committed ({} bytes, {} from peers, "
          "{:.2f} s)",
          r.job, r.plan_epoch, r.target_version, report.bytes_moved,
          report.bytes_from_peers, report.seconds);
  return report;
}

absl::Status OnEachAddress(
    const std::vector<std::string>& addresses,
    const std::function<absl::Status(const std::string&)>& fn,
    size_t max_at_once) {
  // Every address is called even after one fails (an abort or a commit
  // must reach all it can), so the loop itself never sees an error.
  absl::Mutex mu;
  absl::Status first;
  ParallelFor(addresses.size(),
              static_cast<int>(std::min<size_t>(max_at_once, kMaxRpcThreads)),
              [&](size_t k) {
                absl::Status s = fn(addresses[k]);
                absl::MutexLock lock(&mu);
                if (first.ok()) first = std::move(s);
                return absl::OkStatus();
              })
      .IgnoreError();
  return first;
}

void CallEachWithin(
    const std::vector<std::string>& addresses, absl::Duration deadline,
    const std::function<void(const std::string&, grpc::ClientContext*)>& call,
    const std::atomic<bool>* cancel,
    const std::function<bool(const std::string&)>& gone,
    size_t max_at_once) {
  // A context per address, made before any call starts, so that the
  // watcher below can cancel one whose call has not started yet.
  std::vector<grpc::ClientContext> contexts(addresses.size());
  std::atomic<bool> finished{false};
  std::thread watch([&] {
    std::vector<bool> given_up(addresses.size(), false);
    for (int tick = 0; !finished.load(); ++tick) {
      if (cancel != nullptr && cancel->load()) {
        for (grpc::ClientContext& ctx : contexts) ctx.TryCancel();
        return;
      }
      if (gone && tick % 10 == 0) {
        for (size_t i = 0; i < addresses.size(); ++i) {
          if (!given_up[i] && gone(addresses[i])) {
            given_up[i] = true;
            contexts[i].TryCancel();
          }
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  ParallelFor(addresses.size(),
              static_cast<int>(std::min<size_t>(max_at_once, kMaxRpcThreads)),
              [&](size_t i) {
                contexts[i].set_deadline(
                    absl::ToChronoTime(absl::Now() + deadline));
                call(addresses[i], &contexts[i]);
                return absl::OkStatus();
              })
      .IgnoreError();
  finished = true;
  watch.join();
}

absl::Status CommitStagedOn(const std::vector<std::string>& addresses,
                            const std::string& job, int64_t version,
                            int64_t epoch, int attempts,
                            absl::Duration deadline,
                            std::vector<std::string>* acked) {
  absl::Mutex mu;
  return OnEachAddress(addresses, [&](const std::string& address) {
    absl::Status s;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      auto stub = proto::Transformer::NewStub(HostChannel(address));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
      proto::CommitStagedRequest req;
      req.set_job(job);
      req.set_version(version);
      req.set_plan_epoch(epoch);
      proto::CommitStagedResponse resp;
      s = FromGrpcStatus(stub->CommitStaged(&ctx, req, &resp));
      if (s.ok() || s.code() != absl::StatusCode::kUnavailable) break;
      if (attempt + 1 < attempts)
        absl::SleepFor(absl::Milliseconds(200 << attempt));
    }
    if (s.ok() && acked != nullptr) {
      absl::MutexLock lock(&mu);
      acked->push_back(address);
    }
    return Annotate(s, absl::StrCat("version ", version, " of job '", job,
                                    "' is decided committed but ", address,
                                    " has not acknowledged; the commit will "
                                    "be retried"));
  });
}

void AbortStagedOn(const std::vector<std::string>& addresses,
                   const std::string& job, int64_t version, int64_t epoch,
                   absl::Duration deadline) {
  OnEachAddress(addresses, [&](const std::string& address) {
    auto stub = proto::Transformer::NewStub(HostChannel(address));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    proto::AbortStagedRequest req;
    req.set_job(job);
    req.set_version(version);
    req.set_plan_epoch(epoch);
    proto::AbortStagedResponse resp;
    const grpc::Status s = stub->AbortStaged(&ctx, req, &resp);
    if (!s.ok()) {
      Log("coordinator")
          ->warn("job {} epoch {}: aborting version {} on {}: {}", job, epoch,
                 version, address, s.error_message());
    }
    return absl::OkStatus();  // logged: an abort is best effort
  }).IgnoreError();
}

void ReleaseOn(const std::vector<std::string>& addresses,
               const std::string& job, int64_t version,
               absl::Duration deadline) {
  OnEachAddress(addresses, [&](const std::string& address) {
    auto deleted = StoreClient::ConnectKept(address)->DeleteVersion(
        job, version, deadline);
    if (!deleted.ok() &&
        deleted.status().code() != absl::StatusCode::kNotFound) {
      Log("coordinator")
          ->warn("job {}: releasing version {} on {}: {}", job, version,
                 address, deleted.status().ToString());
    }
    return absl::OkStatus();  // logged: a release is best effort
  }).IgnoreError();
}

}  // namespace ptc
