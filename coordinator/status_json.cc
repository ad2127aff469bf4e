#include "coordinator/status_json.h"

#include "common/json_writer.h"
#include "proto/enum_names.h"

namespace ptc {

std::string HostsJson(const proto::ListHostsResponse& resp) {
  JsonWriter w(2);
  w.BeginObject().Key("hosts").BeginArray();
  for (const auto& h : resp.hosts()) {
    w.BeginObject().Key("name").String(h.name()).Key("address").String(
        h.address());
    w.Key("gpus").Int(h.gpus()).Key("alive").Bool(h.alive());
    w.Key("draining").Bool(h.draining());
    w.Key("gpu_memory_bytes").Int(h.gpu_memory_bytes());
    w.Key("memory_bytes").Int(h.memory_bytes());
    w.Key("memory_used_bytes").Int(h.memory_used_bytes());
    w.Key("domain").String(h.domain()).Key("socket").String(h.socket());
    w.Key("held_back_seconds").Double(h.held_back_seconds());
    w.Key("seconds_since_heartbeat")
        .Double(h.seconds_since_heartbeat())
        .EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

std::string JobsJson(const proto::ListJobsResponse& resp) {
  JsonWriter w(2);
  w.BeginObject().Key("jobs").BeginArray();
  for (const auto& j : resp.jobs()) {
    w.BeginObject().Key("job").String(j.job()).Key("model").String(j.model());
    w.Key("mesh").BeginArray();
    for (const auto& a : j.mesh()) w.String(a);
    w.EndArray();
    w.Key("config").String(j.config()).Key("hosts").BeginArray();
    for (const auto& h : j.hosts()) w.String(h);
    w.EndArray().Key("committed_version").Int(j.committed_version());
    w.Key("ranks").Int(j.ranks()).Key("ranks_saved").Int(j.ranks_saved());
    w.Key("state_bytes").Int(j.state_bytes());
    w.Key("rank_hosts").BeginArray();
    for (const auto& h : j.rank_hosts()) w.String(h);
    w.EndArray().Key("rank_gpus").BeginArray();
    for (int32_t d : j.rank_devices()) w.Int(d);
    w.EndArray();
    w.Key("layout_epoch").Int(j.layout_epoch());
    w.Key("committed_step").Int(j.committed_step());
    w.Key("dropped_save").Int(j.dropped_save());
    w.Key("open_saves").BeginArray();
    for (int64_t v : j.open_saves()) w.Int(v);
    w.EndArray().Key("lost_hosts").BeginArray();
    for (const auto& h : j.lost_hosts()) w.String(h);
    w.EndArray();
    w.Key("survival").String(j.survival());
    w.Key("survives_host_loss").Bool(j.survives_host_loss());
    w.Key("kept_small_objects").Int(j.kept_small_objects());
    w.Key("small_objects_to_keep").Int(j.small_objects_to_keep());
    w.Key("kept_small_object_bytes").Int(j.kept_small_object_bytes());
    w.Key("reconfiguration")
        .BeginObject()
        .Key("plan_epoch")
        .Int(j.reconfiguration().plan_epoch());
    w.Key("phase").String(PhaseName(j.reconfiguration().phase()));
    w.Key("bytes_done").Int(j.reconfiguration().bytes_done());
    w.Key("bytes_total").Int(j.reconfiguration().bytes_total());
    w.Key("error").String(j.reconfiguration().error());
    w.Key("reason").String(j.reconfiguration().reason());
    w.Key("path").String(j.reconfiguration().path());
    const proto::ReconfigureEvent& r = j.reconfiguration();
    w.Key("from_config").String(r.from_config());
    w.Key("to_config").String(r.to_config());
    w.Key("hosts_done")
        .Int(r.hosts_done())
        .Key("hosts_total")
        .Int(r.hosts_total());
    w.Key("seconds").Double(r.seconds());
    w.Key("staging_seconds").Double(r.staging_seconds());
    w.Key("verifying_seconds").Double(r.verifying_seconds());
    w.Key("bytes_from_peers").Int(r.bytes_from_peers());
    const proto::PlanSummary& plan = r.plan();
    w.Key("plan").BeginObject();
    w.Key("cross_host_bytes").Int(plan.cross_host_bytes());
    w.Key("cross_host_bytes_lower_bound")
        .Int(plan.cross_host_bytes_lower_bound());
    w.Key("kept_in_place_bytes").Int(plan.kept_in_place_bytes());
    w.Key("copied_within_host_bytes").Int(plan.copied_within_host_bytes());
    w.Key("max_host_send_bytes").Int(plan.max_host_send_bytes());
    w.Key("rank_hosts").BeginArray();
    for (const auto& h : plan.rank_hosts()) w.String(h);
    w.EndArray().Key("flows").BeginArray();
    for (const auto& f : plan.flows()) {
      w.BeginObject().Key("from").String(f.from()).Key("to").String(f.to());
      w.Key("bytes").Int(f.bytes()).EndObject();
    }
    w.EndArray().EndObject();
    w.Key("host_progress").BeginArray();
    for (const auto& h : r.host_progress()) {
      w.BeginObject().Key("host").String(h.host());
      w.Key("bytes_done").Int(h.bytes_done()).Key("bytes_total").Int(
          h.bytes_total());
      w.Key("done").Bool(h.done()).EndObject();
    }
    w.EndArray().EndObject();
    w.Key("recent_changes").BeginArray();
    for (const proto::ReconfigureEvent& e : j.recent_changes()) {
      w.BeginObject().Key("plan_epoch").Int(e.plan_epoch());
      w.Key("phase").String(PhaseName(e.phase()));
      w.Key("from_config").String(e.from_config());
      w.Key("to_config").String(e.to_config());
      w.Key("seconds").Double(e.seconds());
      w.Key("staging_seconds").Double(e.staging_seconds());
      w.Key("verifying_seconds").Double(e.verifying_seconds());
      w.Key("bytes_from_peers").Int(e.bytes_from_peers());
      w.Key("path").String(e.path()).Key("reason").String(e.reason());
      w.Key("error").String(e.error()).EndObject();
    }
    w.EndArray();
    const proto::AutoPolicy& p = j.auto_policy();
    w.Key("auto").BeginObject().Key("enabled").Bool(p.enabled());
    w.Key("live").Bool(p.live()).Key("hot").Bool(p.hot());
    w.Key("pinned_config").String(p.pinned_config());
    w.EndObject().Key("pool").BeginArray();
    for (const auto& h : j.pool()) w.String(h);
    w.EndArray().Key("pending_config").String(j.pending_config());
    w.Key("pending_reason").String(j.pending_reason());
    w.Key("pending_hot").Bool(j.pending_hot());
    w.EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

}  // namespace ptc
