#include "ptc/data_cursor.h"

#include "absl/strings/str_cat.h"
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

namespace {
constexpr char kCursorTag[8] = {'P', 'T', 'C', 'C', 'U', 'R', '1', 0};
}  // namespace

std::string EncodeCursor(const DataCursor& cursor) {
  std::string out(kCursorTag, sizeof(kCursorTag));
  for (uint64_t v : {cursor.seed, static_cast<uint64_t>(cursor.dataset_size),
                     static_cast<uint64_t>(cursor.consumed),
                     static_cast<uint64_t>(cursor.global_batch)}) {
    for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
  }
  return out;
}

absl::StatusOr<DataCursor> DecodeCursor(absl::string_view bytes) {
  if (bytes.size() != 40 ||
      bytes.substr(0, 8) != absl::string_view(kCursorTag, 8)) {
    return absl::InvalidArgumentError(
        "these bytes are not a ptc data cursor (wrong size or tag)");
  }
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) {
    v[i] = 0;
    for (int b = 0; b < 8; ++b)
      v[i] |= uint64_t{static_cast<uint8_t>(bytes[8 + 8 * i + b])} << (8 * b);
  }
  DataCursor c{v[0], static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]),
               static_cast<int64_t>(v[3])};
  if (c.dataset_size < 1 || c.consumed < 0 || c.global_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data cursor is impossible: dataset size ", c.dataset_size,
        ", consumed ", c.consumed, ", global batch ", c.global_batch));
  }
  return c;
}

}  // namespace ptc
