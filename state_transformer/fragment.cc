#include "state_transformer/fragment.h"

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"

namespace ptc {

absl::Status ValidateFragment(const FragmentJob& job) {
  if (job.parallel_pulls < 1 || job.parallel_pulls > kMaxParallelPulls) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel pulls ", job.parallel_pulls,
                     " is out of range; use 1 to ", kMaxParallelPulls));
  }
  const int num_tensors = static_cast<int>(job.tensors.size());
  auto check = [&](int32_t t, const Region& region,
                   const char* what) -> absl::Status {
    if (t < 0 || t >= num_tensors) {
      return absl::InvalidArgumentError(
          absl::StrCat("the fragment ", what, " unknown tensor id ", t,
                       " (it declares ", num_tensors, " tensors)"));
    }
    return Annotate(ValidateRegion(region, job.tensors[t].shape),
                    absl::StrCat("the fragment ", what, " tensor '",
                                 job.tensors[t].key, "'"));
  };
  std::vector<std::vector<const Region*>> pieces(num_tensors);
  for (const FragmentPiece& p : job.pieces) {
    PTC_RETURN_IF_ERROR(check(p.tensor, p.region, "moves a piece of"));
    if (p.region.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the fragment moves an empty piece ", p.region.ToString(),
          " of tensor '", job.tensors[p.tensor].key, "'"));
    }
    pieces[p.tensor].push_back(&p.region);
  }
  for (const auto& [t, region] : job.holds) {
    PTC_RETURN_IF_ERROR(check(t, region, "holds"));
    std::vector<Region> missing = {region};
    for (const Region* piece : pieces[t]) {
      std::vector<Region> still;
      for (const Region& m : missing) {
        if (!m.Intersects(*piece)) {
          still.push_back(m);
          continue;
        }
        for (Region& rest : m.Difference(*piece))
          still.push_back(std::move(rest));
      }
      missing.swap(still);
      if (missing.empty()) break;
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the fragment holds ", region.ToString(), " of tensor '",
                       job.tensors[t].key, "' but no piece fills ",
                       missing[0].ToString(), "; the plan is incomplete"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ptc
