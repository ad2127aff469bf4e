#include "plan/plan_validator.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/internal/grid.h"
#include "plan/planner.h"

namespace ptc {
namespace {

using plan_internal::Grid;

struct UnitRegion {
  int32_t unit;  // target host, or target rank in per-rank plans
  Region region;
};

struct Piece {
  int32_t unit;
  int32_t source_host;
  const Transfer* transfer;
};

absl::Status Bad(const PlanInput& in, const Transfer& x,
                 absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid plan: transfer of tensor '", in.spec->tensors[x.tensor].key,
      "' region ", x.region.ToString(), " from ",
      x.source_host == kFromSnapshot ? std::string("the snapshot")
                                     : in.cluster->hosts[x.source_host].name,
      " to ",
      in.cluster->hosts[x.target_host].name, ": ", what));
}

// Checks transfers' fields; returns the transfers grouped by tensor.
absl::StatusOr<std::vector<std::vector<const Transfer*>>> GroupTransfers(
    const PlanInput& in, const Plan& plan, std::vector<Transfer>* kept) {
  const int num_hosts = static_cast<int>(in.cluster->hosts.size());
  const int num_tensors = static_cast<int>(in.spec->tensors.size());
  std::vector<std::vector<const Transfer*>> by_tensor(num_tensors);
  // Kept-in-place holds are pieces from the host itself; they are checked
  // like any transfer.
  size_t kept_count = 0;
  for (const HostFragment& f : plan.fragments)
    for (const HeldRegion& h : f.holds) kept_count += h.kept_in_place;
  kept->clear();
  kept->reserve(kept_count);  // stable addresses for by_tensor
  for (const HostFragment& f : plan.fragments) {
    if (f.host < 0 || f.host >= num_hosts) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid plan: fragment for unknown host id ", f.host));
    }
    for (const HeldRegion& h : f.holds) {
      if (h.kept_in_place) kept->push_back({h.tensor, h.region, f.host, f.host, -1});
    }
  }
  // (the fragment's host, a piece of it)
  std::vector<std::pair<int32_t, const Transfer*>> all;
  all.reserve(kept->size());
  for (const Transfer& x : *kept) all.push_back({x.target_host, &x});
  for (const HostFragment& f : plan.fragments)
    for (const Transfer& x : f.transfers) all.push_back({f.host, &x});
  for (const auto& [host, px] : all) {
    const Transfer& x = *px;
    const bool from_snapshot =
        x.source_host == kFromSnapshot && in.snapshot_source;
    if (x.tensor < 0 || x.tensor >= num_tensors ||
        (!from_snapshot && x.source_host < 0) ||
        x.source_host >= num_hosts || x.target_host != host) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid plan: a transfer in the fragment of ",
          in.cluster->hosts[host].name,
          " names an unknown tensor or host, or another target host"));
    }
    PTC_RETURN_IF_ERROR(
        Annotate(ValidateRegion(x.region, in.spec->tensors[x.tensor].shape),
                 absl::StrCat("invalid plan: tensor '",
                              in.spec->tensors[x.tensor].key, "'")));
    if (!from_snapshot && !in.HoldsSource(x.source_host))
      return Bad(in, x, "the source host is dead or lost the source");
    if (plan.per_rank) {
      if (x.target_rank < 0 || x.target_rank >= in.target->world_size() ||
          in.target_placement->host[x.target_rank] != x.target_host) {
        return Bad(in, x, "its target rank is not a rank on the target host");
      }
    }
    by_tensor[x.tensor].push_back(&x);
  }
  return by_tensor;
}

absl::Status ValidateTensor(const PlanInput& in, const Plan& plan, int t,
                            const std::vector<const Transfer*>& transfers) {
  const TensorSpec& ts = in.spec->tensors[t];
  std::vector<UnitRegion> needed;
  for (const Shard& s : in.target->shards(t)) {
    const int32_t unit =
        plan.per_rank ? s.rank : in.target_placement->host[s.rank];
    needed.push_back({unit, s.region});
  }
  std::vector<std::pair<int32_t, Region>> held;  // (live host, region)
  for (const Shard& s : in.source->shards(t)) {
    const int h = in.source_placement->host[s.rank];
    if (in.HoldsSource(h)) held.push_back({h, s.region});
  }
  Grid grid;
  grid.Reset(static_cast<int>(ts.shape.size()));
  for (const auto& n : needed) grid.AddCuts(n.region);
  for (const auto& h : held) grid.AddCuts(h.second);
  for (const Transfer* x : transfers) grid.AddCuts(x->region);
  grid.Finalize();
  const int64_t cells = grid.num_cells();
  std::vector<absl::InlinedVector<int32_t, 4>> need(cells), hold(cells);
  std::vector<absl::InlinedVector<Piece, 2>> pieces(cells);
  for (const auto& n : needed) {
    grid.ForEachCell(n.region, [&](int64_t c) { need[c].push_back(n.unit); });
  }
  for (const auto& h : held) {
    grid.ForEachCell(h.second, [&](int64_t c) { hold[c].push_back(h.first); });
  }
  for (const Transfer* x : transfers) {
    const int32_t unit = plan.per_rank ? x->target_rank : x->target_host;
    grid.ForEachCell(x->region, [&](int64_t c) {
      pieces[c].push_back({unit, x->source_host, x});
    });
  }
  for (int64_t c = 0; c < cells; ++c) {
    auto& n = need[c];
    std::sort(n.begin(), n.end());
    n.erase(std::unique(n.begin(), n.end()), n.end());
    for (const Piece& p : pieces[c]) {
      // The snapshot holds every region of the source version.
      if (!(p.source_host == kFromSnapshot && in.snapshot_source) &&
          std::find(hold[c].begin(), hold[c].end(), p.source_host) ==
              hold[c].end()) {
        return Bad(in, *p.transfer,
                   absl::StrCat("the source host does not hold ",
                                grid.CellRegion(c).ToString()));
      }
      if (!std::binary_search(n.begin(), n.end(), p.unit)) {
        return Bad(in, *p.transfer,
                   absl::StrCat("it delivers ", grid.CellRegion(c).ToString(),
                                ", which the target does not need"));
      }
    }
    for (int32_t unit : n) {
      const int count = static_cast<int>(
          std::count_if(pieces[c].begin(), pieces[c].end(),
                        [&](const Piece& p) { return p.unit == unit; }));
      if (count != 1) {
        const std::string who = plan.per_rank ? absl::StrCat("rank ", unit)
                                              : in.cluster->hosts[unit].name;
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid plan: region ", grid.CellRegion(c).ToString(),
            " of tensor '", ts.key, "' is covered ", count, " times for ", who,
            "; every needed region must be covered exactly once"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const PlanInput& in, const Plan& plan) {
  PTC_RETURN_IF_ERROR(CheckPlanInput(in));
  std::vector<Transfer> kept;
  PTC_ASSIGN_OR_RETURN(auto by_tensor, GroupTransfers(in, plan, &kept));
  for (int t = 0; t < static_cast<int>(by_tensor.size()); ++t) {
    PTC_RETURN_IF_ERROR(ValidateTensor(in, plan, t, by_tensor[t]));
  }
  return absl::OkStatus();
}

}  // namespace ptc
