// Fingerprint benchmark (not a test): the rate at which each kernel of the
// partition-invariant fingerprint (ptc/fingerprint.h) reads a 256 MiB
// region of each element size, against memcpy of the same bytes measured
// in the same run. A reconfiguration fingerprints both versions before it
// commits, so this rate bounds its "verifying" phase. Reports min / median
// / max GB/s over the repetitions, and the median's share of memcpy's.
//
//   bazel build -c opt //tools:fingerprint_benchmark &&
//   bazel-bin/tools/fingerprint_benchmark [REPETITIONS]
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ptc/fingerprint.h"
#include "tools/internal/stats.h"

namespace ptc {
namespace {

template <typename Fn>
Stats Rate(int repetitions, int64_t bytes, Fn&& fn) {
  std::vector<double> gbps;
  for (int i = 0; i < repetitions; ++i) {
    const absl::Time t = absl::Now();
    fn();
    gbps.push_back(bytes / absl::ToDoubleSeconds(absl::Now() - t) / 1e9);
  }
  return Summarize(std::move(gbps));
}

const char* Name(FingerprintKernel k) {
  switch (k) {
    case FingerprintKernel::kAvx512:
      return "avx512";
    case FingerprintKernel::kAvx2:
      return "avx2";
    case FingerprintKernel::kScalar:
      break;
  }
  return "scalar";
}

int Run(int repetitions) {
  constexpr int64_t kBytes = int64_t{256} << 20;
  std::vector<uint8_t> data(kBytes), copy(kBytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  std::memcpy(copy.data(), data.data(), kBytes);  // both faulted in
  const Stats memcpy_rate = Rate(repetitions, kBytes, [&] {
    std::memcpy(copy.data(), data.data(), kBytes);
  });
  std::cout << absl::StrFormat(
      "fingerprint of a 256 MiB region, %d repetitions, GB/s min / median / "
      "max (fastest kernel on this CPU: %s)\n",
      repetitions, Name(BestFingerprintKernel()));
  std::cout << absl::StrFormat("%-8s %-5s %6.2f / %6.2f / %6.2f\n", "memcpy",
                               "-", memcpy_rate.min, memcpy_rate.median,
                               memcpy_rate.max);
  for (const int64_t size : {1, 2, 4, 8}) {
    const Shape shape = {kBytes / size};
    const Region full = Region::Full(shape);
    uint64_t expected = 0;
    for (const FingerprintKernel kernel :
         {FingerprintKernel::kScalar, FingerprintKernel::kAvx2,
          FingerprintKernel::kAvx512}) {
      if (!FingerprintKernelRuns(kernel)) continue;
      uint64_t sum = 0;
      const Stats s = Rate(repetitions, kBytes, [&] {
        sum =
            FingerprintRegionWith(kernel, data.data(), full, full, shape, size);
      });
      if (kernel == FingerprintKernel::kScalar) expected = sum;
      if (sum != expected) {  // every kernel computes the same sum
        std::cerr << Name(kernel) << " disagrees with the scalar kernel\n";
        return 1;
      }
      std::cout << absl::StrFormat(
          "%-8s %d B   %6.2f / %6.2f / %6.2f  (%.0f%% of memcpy)\n",
          Name(kernel), size, s.min, s.median, s.max,
          100 * s.median / memcpy_rate.median);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ptc

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 5;
  if (repetitions < 1 || repetitions > 1000) {
    std::cerr << "usage: fingerprint_benchmark [REPETITIONS: 1-1000]\n";
    return 2;
  }
  return ptc::Run(repetitions);
}
