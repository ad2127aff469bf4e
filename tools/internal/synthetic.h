// Synthetic training state for demos and tests: every element of tensor t
// at global flat index i holds the low bytes of Mix(t, i), so a region read
// back anywhere can be checked element by element.
#ifndef PTC_TOOLS_INTERNAL_SYNTHETIC_H_
#define PTC_TOOLS_INTERNAL_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ptc/region.h"

namespace ptc::tools {

// Writes the synthetic bytes of `region` (row-major) into dst.
void FillSynthetic(int tensor, absl::Span<const int64_t> shape,
                   const Region& region, int64_t element_size, char* dst);
std::vector<char> Synthetic(int tensor, absl::Span<const int64_t> shape,
                            const Region& region, int64_t element_size);

// The synthetic bytes of small object `name` as rank `rank` saves it:
// names both, so a moved copy shows whose it was.
std::string SyntheticSmallObject(const std::string& name, int rank);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_SYNTHETIC_H_
