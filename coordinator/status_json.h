// The coordinator's registries as JSON, one form for every reader:
// `ptcctl hosts --json`, `ptcctl jobs --json` and the coordinator's web
// view (/api/hosts, /api/jobs) print exactly these documents.
//
//   std::cout << HostsJson(list_hosts_response);
//   {"hosts": [{"name", "address", "gpus", "alive", "draining",
//               "gpu_memory_bytes", "memory_bytes", "memory_used_bytes",
//               "domain", "socket",
//               "seconds_since_heartbeat"}]}
//   std::cout << JobsJson(list_jobs_response);
//   {"jobs": [{"job", "model", "mesh", "config", "hosts",
//              "committed_version", "ranks", "ranks_saved", "state_bytes",
//              "rank_hosts", "rank_gpus", "layout_epoch", "committed_step",
//              "open_saves", "lost_hosts", "survival", "survives_host_loss",
//              "kept_small_objects", "small_objects_to_keep",
//              "kept_small_object_bytes",
//              "reconfiguration": {"plan_epoch", "phase", "bytes_done",
//                                  "bytes_total", "error", "reason", "path"},
//              "auto": {...}, "pool", "pending_config", ...}]}
#ifndef PTC_COORDINATOR_STATUS_JSON_H_
#define PTC_COORDINATOR_STATUS_JSON_H_

#include <string>

#include "proto/coordinator.pb.h"

namespace ptc {

std::string HostsJson(const proto::ListHostsResponse& resp);
std::string JobsJson(const proto::ListJobsResponse& resp);

}  // namespace ptc

#endif  // PTC_COORDINATOR_STATUS_JSON_H_
