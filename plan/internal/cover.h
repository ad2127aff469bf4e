// A disjoint cover: given (host, region) pairs of one tensor, assigns every
// element of their union to exactly one host (the lowest id holding it, or
// the least loaded), as few regions per host as the grid allows. Used to
// fingerprint each element of a tensor once across replicated hosts.
#ifndef PTC_PLAN_INTERNAL_COVER_H_
#define PTC_PLAN_INTERNAL_COVER_H_

#include <map>
#include <utility>
#include <vector>

#include "ptc/region.h"

namespace ptc::plan_internal {

// Without `load`, each element goes to the lowest host id that holds it.
// With `load` (elements assigned to each host so far, kept by the caller
// across calls), each element goes to the holder with the fewest before
// this call (ties: the lowest id), and what each host got is added there:
// over many tensors, replicas share the work.
std::map<int32_t, std::vector<Region>> DisjointCover(
    int rank, const std::vector<std::pair<int32_t, Region>>& held,
    std::map<int32_t, int64_t>* load = nullptr);

}  // namespace ptc::plan_internal

#endif  // PTC_PLAN_INTERNAL_COVER_H_
