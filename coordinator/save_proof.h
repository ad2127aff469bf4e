// What each host of a placement must prove it holds of a saved version
// before the save commits (rule 4 of coordinator_service.h), and the check
// that replicas on different hosts saved the same bytes. Built from the
// layout's region ids and host indexes: at 16,384 ranks of a 405B model a
// save expects millions of regions (tools/control_plane_benchmark).
//
//   PTC_ASSIGN_OR_RETURN(auto shares,
//                        SharesOf(job, version, spec, layout, rank_hosts));
//   ... each host answers CommitVersion(shares[host].request) ...
//   PTC_RETURN_IF_ERROR(CheckReplicas(spec, layout, shares, answers));
#ifndef PTC_COORDINATOR_SAVE_PROOF_H_
#define PTC_COORDINATOR_SAVE_PROOF_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor_store.pb.h"
#include "ptc/layout.h"
#include "ptc/model_spec.h"

namespace ptc {

// What one host must hold of one version: the distinct regions of the
// ranks placed on it (ranks on one host share a region) and every rank's
// small objects; and, per expected region, its tensor, its index among
// the tensor's distinct regions (Layout::regions) and the ranks that hold
// it, for the replicas' comparison and messages.
struct HostShare {
  proto::CommitVersionRequest request;
  struct Expected {
    int32_t tensor;
    int32_t region;
    std::vector<int32_t> ranks;
  };
  std::vector<Expected> expected;  // as request.expect_regions
};

// Each host's share of `version` of `job` under `layout`, whose rank r is
// placed on rank_hosts[r]. FAILED_PRECONDITION when the placement does not
// place every rank.
absl::StatusOr<std::map<std::string, HostShare>> SharesOf(
    const std::string& job, int64_t version, const ModelSpec& spec,
    const Layout& layout, const std::vector<std::string>& rank_hosts);

// Whether every region's copies on different hosts have one checksum, from
// each host's answer to its share's request: DATA_LOSS naming the tensor,
// the region and the ranks and hosts of two copies that disagree; INTERNAL
// when a host answered another number of checksums than it was asked.
absl::Status CheckReplicas(
    const ModelSpec& spec, const Layout& layout,
    const std::map<std::string, HostShare>& shares,
    const std::map<std::string, proto::CommitVersionResponse>& answers);

}  // namespace ptc

#endif  // PTC_COORDINATOR_SAVE_PROOF_H_
