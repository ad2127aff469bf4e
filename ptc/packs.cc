#include "ptc/packs.h"

namespace ptc {

int64_t PackRequestBytes(const std::string& key, int rank) {
  // The tensor's name, two varints per dimension, the fields' tags.
  return static_cast<int64_t>(key.size()) + 24 * int64_t{rank} + 32;
}

int64_t PackAligned(int64_t bytes) {
  return (bytes + kPackAlignment - 1) / kPackAlignment * kPackAlignment;
}

std::vector<size_t> NextPack(const std::vector<PackCandidate>& regions,
                             size_t first, const std::vector<bool>& taken) {
  const size_t n = regions.size();
  auto packable = [&](size_t j) {
    return !taken[j] && regions[j].bytes > 0 &&
           regions[j].bytes < kPackRegionsBelow;
  };
  std::vector<size_t> members;
  if (first >= n || taken.size() != n || !packable(first)) return members;
  int64_t bytes = 0, request = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t j = (first + k) % n;
    if (!packable(j)) continue;
    const PackCandidate& r = regions[j];
    if (!members.empty() &&
        (static_cast<int>(members.size()) == kMaxPackRegions ||
         bytes + r.bytes > kMaxPackBytes ||
         request + r.request_bytes > kMaxPackRequestBytes))
      break;
    members.push_back(j);
    bytes += PackAligned(r.bytes);
    request += r.request_bytes;
  }
  if (members.size() < 2) members.clear();
  return members;
}

int64_t PackBytes(const std::vector<PackCandidate>& regions,
                  const std::vector<size_t>& members) {
  int64_t bytes = 0;
  for (size_t j : members) bytes += PackAligned(regions[j].bytes);
  return bytes;
}

std::vector<int64_t> SaveBufferSizes(
    const std::vector<PackCandidate>& regions) {
  std::vector<int64_t> sizes;
  std::vector<bool> taken(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    if (taken[i] || regions[i].bytes <= 0) continue;
    const std::vector<size_t> pack = NextPack(regions, i, taken);
    if (pack.empty()) {
      taken[i] = true;
      sizes.push_back(regions[i].bytes);
      continue;
    }
    for (size_t j : pack) taken[j] = true;
    sizes.push_back(PackBytes(regions, pack));
  }
  return sizes;
}

}  // namespace ptc
