#include "plan/plan_proto.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ptc {

proto::PlanSummary SummaryToProto(const PlanSummary& s) {
  proto::PlanSummary out;
  out.set_target_bytes(s.target_bytes);
  out.set_kept_in_place_bytes(s.kept_in_place_bytes);
  out.set_copied_within_host_bytes(s.copied_within_host_bytes);
  out.set_cross_host_bytes(s.cross_host_bytes);
  out.set_cross_host_bytes_lower_bound(s.cross_host_bytes_lower_bound);
  out.set_dedup_saved_bytes(s.dedup_saved_bytes);
  out.set_max_host_send_bytes(s.max_host_send_bytes);
  out.set_max_host_send_bytes_lower_bound(s.max_host_send_bytes_lower_bound);
  out.set_max_host_send_host(s.max_host_send_host);
  out.set_max_host_send_seconds(s.max_host_send_seconds);
  out.set_max_host_send_seconds_lower_bound(
      s.max_host_send_seconds_lower_bound);
  out.set_transfers(s.transfers);
  out.set_small_object_moves(s.small_object_moves);
  out.set_snapshot_bytes(s.snapshot_bytes);
  out.set_plan_seconds(s.plan_seconds);
  for (int64_t b : s.host_send_bytes) out.add_host_send_bytes(b);
  for (int64_t b : s.host_receive_bytes) out.add_host_receive_bytes(b);
  return out;
}

proto::Plan PlanToProto(const Plan& plan) {
  proto::Plan wire;
  wire.set_strategy(plan.strategy);
  wire.set_per_rank(plan.per_rank);
  for (const HostFragment& f : plan.fragments) {
    proto::HostFragment* pf = wire.add_fragments();
    pf->set_host(f.host);
    for (const HeldRegion& h : f.holds) {
      proto::HeldRegion* ph = pf->add_holds();
      ph->set_tensor(h.tensor);
      RegionToProto(h.region, ph->mutable_region());
    }
    ForEachPiece(f, [&](const Transfer& x) {
      proto::Transfer* px = pf->add_transfers();
      px->set_tensor(x.tensor);
      RegionToProto(x.region, px->mutable_region());
      px->set_source_host(x.source_host);
      px->set_target_host(x.target_host);
      px->set_target_rank(x.target_rank);
    });
  }
  for (const SmallObjectMove& m : plan.small_objects) {
    proto::SmallObjectMove* pm = wire.add_small_objects();
    pm->set_name(m.name);
    pm->set_target_rank(m.target_rank);
    pm->set_source_rank(m.source_rank);
    pm->set_source_host(m.source_host);
    pm->set_derive_from(m.derive_from);
    pm->set_target_host(m.target_host);
    for (const SmallObjectMove::Copy& c : m.alternates) {
      pm->add_alternate_ranks(c.rank);
      pm->add_alternate_hosts(c.host);
    }
    pm->set_derive_fallback(m.derive_fallback);
    pm->set_has_kept(m.kept_rank >= 0);
    pm->set_kept_rank(m.kept_rank);
  }
  *wire.mutable_summary() = SummaryToProto(plan.summary);
  return wire;
}

absl::StatusOr<Plan> PlanFromProto(const proto::Plan& wire) {
  Plan plan;
  plan.strategy = wire.strategy();
  plan.per_rank = wire.per_rank();
  for (const proto::HostFragment& pf : wire.fragments()) {
    HostFragment f;
    f.host = pf.host();
    for (const proto::HeldRegion& ph : pf.holds()) {
      PTC_ASSIGN_OR_RETURN(Region r, RegionFromProto(ph.region()));
      f.holds.push_back({ph.tensor(), std::move(r)});
    }
    for (const proto::Transfer& px : pf.transfers()) {
      PTC_ASSIGN_OR_RETURN(Region r, RegionFromProto(px.region()));
      f.transfers.push_back({px.tensor(), std::move(r), px.source_host(),
                             px.target_host(), px.target_rank()});
    }
    plan.fragments.push_back(std::move(f));
  }
  for (const proto::SmallObjectMove& pm : wire.small_objects()) {
    SmallObjectMove& m = plan.small_objects.emplace_back(
        SmallObjectMove{pm.name(), pm.target_rank(), pm.source_rank(),
                        pm.source_host(), pm.target_host(), pm.derive_from()});
    for (int i = 0;
         i < pm.alternate_ranks_size() && i < pm.alternate_hosts_size(); ++i)
      m.alternates.push_back({pm.alternate_ranks(i), pm.alternate_hosts(i)});
    m.derive_fallback = pm.derive_fallback();
    if (pm.has_kept()) m.kept_rank = pm.kept_rank();
  }
  const proto::PlanSummary& ps = wire.summary();
  PlanSummary& s = plan.summary;
  s.target_bytes = ps.target_bytes();
  s.kept_in_place_bytes = ps.kept_in_place_bytes();
  s.copied_within_host_bytes = ps.copied_within_host_bytes();
  s.cross_host_bytes = ps.cross_host_bytes();
  s.cross_host_bytes_lower_bound = ps.cross_host_bytes_lower_bound();
  s.dedup_saved_bytes = ps.dedup_saved_bytes();
  s.max_host_send_bytes = ps.max_host_send_bytes();
  s.max_host_send_bytes_lower_bound = ps.max_host_send_bytes_lower_bound();
  s.max_host_send_host = ps.max_host_send_host();
  s.max_host_send_seconds = ps.max_host_send_seconds();
  s.max_host_send_seconds_lower_bound = ps.max_host_send_seconds_lower_bound();
  s.transfers = ps.transfers();
  s.small_object_moves = ps.small_object_moves();
  s.snapshot_bytes = ps.snapshot_bytes();
  s.plan_seconds = ps.plan_seconds();
  s.host_send_bytes.assign(ps.host_send_bytes().begin(),
                           ps.host_send_bytes().end());
  s.host_receive_bytes.assign(ps.host_receive_bytes().begin(),
                              ps.host_receive_bytes().end());
  return plan;
}

}  // namespace ptc
