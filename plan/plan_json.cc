#include "plan/plan_json.h"

#include "proto/enum_names.h"

namespace ptc {
namespace {

void WriteRegion(const Region& r, JsonWriter* w) {
  w->BeginArray();
  for (const Interval& i : r.dims())
    w->BeginArray().Int(i.begin).Int(i.end).EndArray();
  w->EndArray();
}

void WriteSide(const Layout& layout, const Placement& placement,
               JsonWriter* w) {
  w->BeginObject();
  w->Key("config");
  if (layout.config()) {
    w->String(layout.config()->ToString());
  } else {
    w->Null();
  }
  w->Key("ranks").BeginArray();
  for (int r = 0; r < placement.world_size(); ++r) {
    w->BeginObject().Key("rank").Int(r).Key("host").Int(placement.host[r]);
    w->Key("device").Int(placement.device[r]).EndObject();
  }
  w->EndArray();
  w->Key("shards").BeginArray();
  for (int t = 0; t < layout.num_tensors(); ++t) {
    for (const Shard& s : layout.shards(t)) {
      w->BeginObject().Key("tensor").Int(t).Key("rank").Int(s.rank).Key(
          "region");
      WriteRegion(s.region, w);
      w->EndObject();
    }
  }
  w->EndArray();
  w->EndObject();
}

}  // namespace

void WritePlanSummary(const PlanSummary& s, const Cluster& cluster,
                      JsonWriter* w) {
  w->BeginObject();
  w->Key("target_bytes").Int(s.target_bytes);
  w->Key("kept_in_place_bytes").Int(s.kept_in_place_bytes);
  w->Key("copied_within_host_bytes").Int(s.copied_within_host_bytes);
  w->Key("cross_host_bytes").Int(s.cross_host_bytes);
  w->Key("cross_host_bytes_lower_bound").Int(s.cross_host_bytes_lower_bound);
  w->Key("dedup_saved_bytes").Int(s.dedup_saved_bytes);
  w->Key("max_host_send_bytes").Int(s.max_host_send_bytes);
  w->Key("max_host_send_bytes_lower_bound")
      .Int(s.max_host_send_bytes_lower_bound);
  w->Key("max_host_send_host");
  if (s.max_host_send_host >= 0) {
    w->String(cluster.hosts[s.max_host_send_host].name);
  } else {
    w->Null();
  }
  w->Key("max_host_send_seconds").Double(s.max_host_send_seconds);
  w->Key("max_host_send_seconds_lower_bound")
      .Double(s.max_host_send_seconds_lower_bound);
  w->Key("transfers").Int(s.transfers);
  w->Key("small_object_moves").Int(s.small_object_moves);
  w->Key("snapshot_bytes").Int(s.snapshot_bytes);
  w->Key("plan_seconds").Double(s.plan_seconds);
  w->EndObject();
}

std::string PlanJson(const PlanInput& in, const Plan& plan) {
  JsonWriter w;
  w.BeginObject();
  w.Key("model").String(in.spec->name);
  w.Key("strategy").String(StrategyName(plan.strategy));
  w.Key("per_rank").Bool(plan.per_rank);
  w.Key("hosts").BeginArray();
  for (size_t h = 0; h < in.cluster->hosts.size(); ++h) {
    const Host& host = in.cluster->hosts[h];
    w.BeginObject().Key("id").Int(h).Key("name").String(host.name);
    w.Key("gpus").Int(host.gpus).Key("bandwidth").Double(host.bandwidth);
    w.Key("alive").Bool(in.IsAlive(h)).EndObject();
  }
  w.EndArray();
  w.Key("tensors").BeginArray();
  for (size_t t = 0; t < in.spec->tensors.size(); ++t) {
    const TensorSpec& ts = in.spec->tensors[t];
    w.BeginObject().Key("id").Int(t).Key("key").String(ts.key);
    w.Key("dtype")
        .String(DTypeName(ts.dtype))
        .Key("element_size")
        .Int(ElementSize(ts.dtype));
    w.Key("shape").BeginArray();
    for (int64_t e : ts.shape) w.Int(e);
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.Key("source");
  WriteSide(*in.source, *in.source_placement, &w);
  w.Key("target");
  WriteSide(*in.target, *in.target_placement, &w);
  w.Key("transfers").BeginArray();
  for (const HostFragment& f : plan.fragments) {
    ForEachPiece(f, [&](const Transfer& x) {
      w.BeginObject().Key("tensor").Int(x.tensor).Key("region");
      WriteRegion(x.region, &w);
      w.Key("source_host")
          .Int(x.source_host)
          .Key("target_host")
          .Int(x.target_host);
      w.Key("target_rank").Int(x.target_rank).EndObject();
    });
  }
  w.EndArray();
  w.Key("small_objects").BeginArray();
  for (const SmallObjectMove& m : plan.small_objects) {
    w.BeginObject()
        .Key("name")
        .String(m.name)
        .Key("target_rank")
        .Int(m.target_rank);
    w.Key("source_rank")
        .Int(m.source_rank)
        .Key("source_host")
        .Int(m.source_host);
    if (!m.derive_from.empty()) w.Key("derive_from").String(m.derive_from);
    w.Key("target_host").Int(m.target_host).EndObject();
  }
  w.EndArray();
  w.Key("summary");
  WritePlanSummary(plan.summary, *in.cluster, &w);
  w.EndObject();
  return w.str();
}

}  // namespace ptc
