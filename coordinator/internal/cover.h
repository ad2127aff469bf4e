// A disjoint cover: given (host, region) pairs of one tensor, assigns every
// element of their union to exactly one host (the lowest id holding it), as
// few regions per host as the grid allows. Used to fingerprint each
// element of a tensor once across replicated hosts.
#ifndef PTC_COORDINATOR_INTERNAL_COVER_H_
#define PTC_COORDINATOR_INTERNAL_COVER_H_

#include <map>
#include <utility>
#include <vector>

#include "ptc/region.h"

namespace ptc::coordinator_internal {

std::map<int32_t, std::vector<Region>> DisjointCover(
    int rank, const std::vector<std::pair<int32_t, Region>>& held);

}  // namespace ptc::coordinator_internal

#endif  // PTC_COORDINATOR_INTERNAL_COVER_H_
