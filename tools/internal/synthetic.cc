#include "tools/internal/synthetic.h"

#include <cstring>

#include "common/mix.h"

namespace ptc::tools {
void FillSynthetic(int tensor, absl::Span<const int64_t> shape,
                   const Region& region, int64_t element_size, char* dst) {
  const int rank = region.rank();
  if (region.empty()) return;
  std::vector<int64_t> idx(rank);
  for (int d = 0; d < rank; ++d) idx[d] = region.dim(d).begin;
  const uint64_t salt = static_cast<uint64_t>(tensor) << 40;
  const int64_t row = rank == 0 ? 1 : region.dim(rank - 1).size();
  int64_t k = 0;
  while (k < region.volume()) {
    int64_t flat = 0;
    for (int d = 0; d < rank; ++d) flat = flat * shape[d] + idx[d];
    for (int64_t j = 0; j < row; ++j, ++k) {
      const uint64_t v = SplitMix64(salt ^ static_cast<uint64_t>(flat + j));
      std::memcpy(dst + k * element_size, &v, element_size);
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < region.dim(d).end) break;
      idx[d] = region.dim(d).begin;
    }
    if (d < 0) break;
  }
}

std::vector<char> Synthetic(int tensor, absl::Span<const int64_t> shape,
                            const Region& region, int64_t element_size) {
  std::vector<char> out(region.volume() * element_size);
  FillSynthetic(tensor, shape, region, element_size, out.data());
  return out;
}

std::string SyntheticSmallObject(const std::string& name, int rank) {
  std::string out = name + " saved by rank " + std::to_string(rank) + ":";
  for (uint64_t i = 0; out.size() < 96; ++i) {
    out.push_back(static_cast<char>(SplitMix64(i ^ (uint64_t(rank) << 32))));
  }
  return out;
}

}  // namespace ptc::tools
