#include "plan/hot_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/planner.h"
#include "ptc/dtype.h"

namespace ptc {

absl::StatusOr<ProcessPlan> PlanProcessSwitch(const PlanInput& in) {
  PTC_RETURN_IF_ERROR(CheckPlanInput(in));
  for (size_t h = 0; h < in.alive.size(); ++h) {
    if (!in.alive[h]) {
      return absl::FailedPreconditionError(
          absl::StrCat("host ", in.cluster->hosts[h].name,
                       " is dead: a hot switch needs every process alive"));
    }
  }
  if (!in.source_lost.empty() || in.snapshot_source) {
    return absl::FailedPreconditionError(
        "a hot switch moves what the processes hold; this change needs the "
        "store (a host lost its state, or pieces come from a snapshot)");
  }
  PTC_ASSIGN_OR_RETURN(Plan host_plan, PlanReconfiguration(in));
  const Layout& src = *in.source;
  const Layout& dst = *in.target;
  const Placement& sp = *in.source_placement;
  const Placement& tp = *in.target_placement;

  ProcessPlan out;
  out.host_plan = host_plan.summary;
  out.small_objects = host_plan.small_objects;
  // Pieces each target host receives, per tensor (with their source host).
  std::vector<std::map<int32_t, std::vector<Transfer>>> pieces(
      in.cluster->hosts.size());
  for (const HostFragment& f : host_plan.fragments) {
    ForEachPiece(f, [&](const Transfer& x) {
      pieces[f.host][x.tensor].push_back(x);
    });
  }
  // Source shards per (tensor, host), for finding a piece's holders.
  std::vector<int64_t> sent(src.world_size(), 0);
  for (int t = 0; t < dst.num_tensors(); ++t) {
    const int64_t element = ElementSize(in.spec->tensors[t].dtype);
    std::map<int32_t, std::vector<const Shard*>> holders;  // host -> shards
    for (const Shard& s : src.shards(t)) {
      if (!s.region.empty()) holders[sp.host[s.rank]].push_back(&s);
    }
    for (const Shard& d : dst.shards(t)) {
      if (d.region.empty()) continue;
      const int32_t host = tp.host[d.rank];
      auto here = pieces[host].find(t);
      if (here == pieces[host].end()) continue;
      for (const Transfer& x : here->second) {
        const Region part = x.region.Intersect(d.region);
        if (part.empty()) continue;
        // The processes that send it, from the planner's source host: the
        // receiver itself for what it holds, else the least loaded holder
        // (bytes so far), then the lowest rank. A piece may span regions
        // of several processes there (the host's store holds them all).
        std::vector<Region> left = {part};
        while (!left.empty()) {
          const Region q = left.back();
          left.pop_back();
          const Shard* best = nullptr;
          bool best_same = false, best_whole = false;
          for (const Shard* s : holders[x.source_host]) {
            if (!s->region.Intersects(q)) continue;
            const bool same = sp.host[s->rank] == tp.host[d.rank] &&
                              sp.device[s->rank] == tp.device[d.rank];
            const bool whole = s->region.Contains(q);
            const auto key = [&](const Shard* c, bool sm, bool wh) {
              return std::make_tuple(!sm, !wh, sent[c->rank], c->rank);
            };
            if (best == nullptr ||
                key(s, same, whole) < key(best, best_same, best_whole)) {
              best = s;
              best_same = same;
              best_whole = whole;
            }
          }
          if (best == nullptr) {
            return absl::InternalError(absl::StrCat(
                "no process on host ", in.cluster->hosts[x.source_host].name,
                " holds ", q.ToString(), " of tensor '",
                in.spec->tensors[t].key, "', which the plan takes from there"));
          }
          const Region got = q.Intersect(best->region);
          for (Region& rest : q.Difference(best->region))
            left.push_back(std::move(rest));
          const int64_t bytes = got.volume() * element;
          out.bytes += bytes;
          if (!best_same) {
            sent[best->rank] += bytes;
            out.bytes_between_processes += bytes;
          }
          if (x.source_host != host) out.bytes_between_hosts += bytes;
          out.transfers.push_back({t, got, best->rank, d.rank});
        }
      }
    }
  }
  std::stable_sort(out.transfers.begin(), out.transfers.end(),
                   [](const ProcessTransfer& a, const ProcessTransfer& b) {
                     return std::tie(a.target_rank, a.tensor) <
                            std::tie(b.target_rank, b.tensor);
                   });
  return out;
}

}  // namespace ptc
