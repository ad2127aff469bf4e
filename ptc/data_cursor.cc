#include "ptc/data_cursor.h"

#include "common/mix.h"
#include "ptc/parallel_config.h"

namespace ptc {
namespace {

// A bijection of [0, 2^(2*half)) built from a 4-round Feistel network.
uint64_t Feistel(uint64_t x, int half, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t left = x >> half, right = x & mask;
  for (int round = 0; round < 4; ++round) {
    const uint64_t next =
        left ^ (SplitMix64(key ^ (right * 0x100000001b3ULL) ^ round) & mask);
    left = right;
    right = next;
  }
  return (left << half) | right;
}

}  // namespace

int64_t SampleAt(const DataCursor& cursor, int64_t position) {
  const int64_t n = cursor.dataset_size;
  if (n <= 1) return 0;
  const uint64_t epoch = static_cast<uint64_t>(position / n);
  uint64_t x = static_cast<uint64_t>(position % n);
  int bits = 1;
  while ((uint64_t{1} << bits) < static_cast<uint64_t>(n)) ++bits;
  const int half = (bits + 1) / 2;
  const uint64_t key = SplitMix64(cursor.seed ^ SplitMix64(epoch));
  // Cycle walking: re-apply until the value falls inside [0, n).
  do {
    x = Feistel(x, half, key);
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

std::vector<int64_t> NextSamples(const DataCursor& cursor, int dp_rank,
                                 int dp) {
  auto [b, e] = ChunkOf(cursor.global_batch, dp, dp_rank);
  std::vector<int64_t> out;
  out.reserve(e - b);
  for (int64_t i = b; i < e; ++i)
    out.push_back(SampleAt(cursor, cursor.consumed + i));
  return out;
}

}  // namespace ptc
