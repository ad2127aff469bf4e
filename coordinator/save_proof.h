// What each host of a placement must prove it holds of a saved version
// before the save commits (rule 4 of coordinator_service.h), and the check
// that replicas on different hosts saved the same bytes. Built from the
// layout's region ids and host indexes: at 16,384 ranks of a 405B model a
// save expects millions of regions (tools/control_plane_benchmark).
//
// A placement's shares change only with the job's layout: ShareCache keeps
// them per job, and a host that was sent its expectations once keeps them
// under their id, so that a save names them instead of sending them again.
//
//   PTC_ASSIGN_OR_RETURN(auto shares, cache.Get(job, spec, config, layout,
//                                               rank_hosts));
//   ... each host answers CommitVersion(ShareRequest(..., whole)) ...
//   PTC_RETURN_IF_ERROR(CheckReplicas(spec, layout, *shares, answers));
#ifndef PTC_COORDINATOR_SAVE_PROOF_H_
#define PTC_COORDINATOR_SAVE_PROOF_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/tensor_store.pb.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"

namespace ptc {

// What one host must hold of every version saved under a placement: the
// distinct regions of the ranks placed on it (ranks on one host share a
// region), as (tensor, index among the tensor's distinct regions,
// Layout::regions), in the order its answer's checksums come; and every
// small object of its ranks.
struct HostShare {
  std::vector<int32_t> ranks;  // ascending
  struct Expected {
    int32_t tensor;
    int32_t region;
  };
  std::vector<Expected> expected;
  // Names these expectations (CommitVersionRequest.expectations_id): a
  // checksum of their content, never 0.
  uint64_t id = 0;
};
using Shares = std::map<std::string, HostShare>;

// Each host's share under `layout`, whose rank r is placed on
// rank_hosts[r]. FAILED_PRECONDITION (naming `job`) when the placement
// does not place every rank.
absl::StatusOr<Shares> SharesOf(const std::string& job, const ModelSpec& spec,
                                const Layout& layout,
                                const std::vector<std::string>& rank_hosts);

// The host's CommitVersion request for `version` of `job`: carrying its
// expectations (`whole`: the store keeps them under share.id), or naming
// them by that id.
proto::CommitVersionRequest ShareRequest(const std::string& job,
                                         int64_t version, const ModelSpec& spec,
                                         const Layout& layout,
                                         const HostShare& share, bool whole);

// Whether every region's copies on different hosts have one checksum, from
// each host's answer to its share's request: DATA_LOSS naming the tensor,
// the region and the ranks and hosts of two copies that disagree; INTERNAL
// when a host answered another number of checksums than it was asked.
absl::Status CheckReplicas(
    const ModelSpec& spec, const Layout& layout, const Shares& shares,
    const std::map<std::string, proto::CommitVersionResponse>& answers);

// Per job, the shares of its last placement (built again when the spec,
// the config or a rank's host changes), and which hosts were sent which
// expectations. Thread-safe.
class ShareCache {
 public:
  absl::StatusOr<std::shared_ptr<const Shares>> Get(
      const std::string& job, const std::shared_ptr<const ModelSpec>& spec,
      const std::string& config, const Layout& layout,
      const std::vector<std::string>& rank_hosts);
  // Whether `host` keeps the expectations `id` of `job`, as far as this
  // cache knows (a store that restarted forgets them: it says so).
  bool Sent(const std::string& job, const std::string& host, uint64_t id);
  void MarkSent(const std::string& job, const std::string& host, uint64_t id,
                bool kept);
  void Forget(const std::string& job);

 private:
  struct Entry {
    std::shared_ptr<const ModelSpec> spec;
    std::string config;
    std::vector<std::string> rank_hosts;
    std::shared_ptr<const Shares> shares;
    std::set<std::pair<std::string, uint64_t>> sent;
  };
  absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_SAVE_PROOF_H_
