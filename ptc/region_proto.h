// Regions to and from their wire form (proto/plan.proto's Region).
#ifndef PTC_PTC_REGION_PROTO_H_
#define PTC_PTC_REGION_PROTO_H_

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "ptc/region.h"

namespace ptc {

void RegionToProto(const Region& region, proto::Region* out);
// INVALID_ARGUMENT if a dimension has begin < 0 or begin > end.
absl::StatusOr<Region> RegionFromProto(const proto::Region& wire);

}  // namespace ptc

#endif  // PTC_PTC_REGION_PROTO_H_
