#include "ptc/region_proto.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ptc {

void RegionToProto(const Region& region, proto::Region* out) {
  out->clear_dims();
  for (const Interval& i : region.dims()) {
    proto::Interval* d = out->add_dims();
    d->set_begin(i.begin);
    d->set_end(i.end);
  }
}

absl::StatusOr<Region> RegionFromProto(const proto::Region& wire) {
  std::vector<Interval> dims;
  for (const proto::Interval& d : wire.dims()) {
    if (d.begin() < 0 || d.begin() > d.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("region dimension ", dims.size(), " is [", d.begin(),
                       ", ", d.end(), "); need 0 <= begin <= end"));
    }
    dims.push_back({d.begin(), d.end()});
  }
  return Region(dims);
}

}  // namespace ptc
