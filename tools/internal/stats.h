// Min / median / max of a benchmark's repetitions, as every ptc benchmark
// reports them.
//
//   const Stats s = Summarize({2.1, 1.9, 2.4});  // {1.9, 2.1, 2.4}
#ifndef PTC_TOOLS_INTERNAL_STATS_H_
#define PTC_TOOLS_INTERNAL_STATS_H_

#include <algorithm>
#include <vector>

namespace ptc {

struct Stats {
  double min = 0, median = 0, max = 0;
};

// Of a non-empty sample; the median of an even count is the upper middle.
inline Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

}  // namespace ptc

#endif  // PTC_TOOLS_INTERNAL_STATS_H_
