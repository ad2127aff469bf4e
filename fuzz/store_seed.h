// The store the fuzz targets that serve a store start from: job "job" with
// tensor "w" (fp32 [16, 16]) and a committed version 1 with small objects
// "rng" of ranks 0 and 1, so that reads and maps have something to find.
#ifndef PTC_FUZZ_STORE_SEED_H_
#define PTC_FUZZ_STORE_SEED_H_

#include "tensor_store/store.h"

namespace ptc::fuzz {

inline constexpr int64_t kFuzzStoreBytes = int64_t{64} << 20;

inline void SeedStore(Store& store) {
  store.DeclareTensors("job", {{"w", DType::kFloat32, {16, 16}}}).IgnoreError();
  auto put = store.BeginPut("job", 1, "w", Region{{0, 16}, {0, 16}});
  if (put.ok()) store.FinishPut(*std::move(put)).IgnoreError();
  store.PutSmallObject("job", 1, "rng", 0, "rank 0's state").IgnoreError();
  store.PutSmallObject("job", 1, "rng", 1, "rank 1's state").IgnoreError();
  store.Commit("job", 1).IgnoreError();
}

}  // namespace ptc::fuzz

#endif  // PTC_FUZZ_STORE_SEED_H_
