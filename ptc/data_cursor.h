// The data-loader cursor: part of a job's state, so that after any change
// of data parallelism (or of the global batch size) every sample of an
// epoch is consumed exactly once.
//
// Samples are read in a seeded per-epoch permutation of [0, dataset_size).
// The cursor counts consumed samples globally; global batch k covers
// positions [consumed, consumed + global_batch) of the endless sequence of
// epochs, and DP rank i of D reads its chunk of that batch (chunk
// semantics). Nothing depends on D, so D may change between batches.
//
//   DataCursor c{.seed = 7, .dataset_size = 1000, .consumed = 0,
//                .global_batch = 32};
//   std::vector<int64_t> mine = NextSamples(c, /*dp_rank=*/1, /*dp=*/4);
//   Advance(&c);
#ifndef PTC_PTC_DATA_CURSOR_H_
#define PTC_PTC_DATA_CURSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptc {

struct DataCursor {
  uint64_t seed = 0;
  int64_t dataset_size = 0;
  int64_t consumed = 0;  // samples consumed by the whole job, all epochs
  int64_t global_batch = 1;
};

// The sample at global position `position` (epoch = position / size).
int64_t SampleAt(const DataCursor& cursor, int64_t position);

// The samples DP rank `dp_rank` of `dp` reads in the next global batch.
std::vector<int64_t> NextSamples(const DataCursor& cursor, int dp_rank, int dp);

// Marks the next global batch consumed.
inline void Advance(DataCursor* cursor) {
  cursor->consumed += cursor->global_batch;
}

// The cursor as the small object "data_cursor" (40 bytes, little-endian,
// with a format tag), and back; INVALID_ARGUMENT for bytes that are not a
// cursor or describe an impossible one.
std::string EncodeCursor(const DataCursor& cursor);
absl::StatusOr<DataCursor> DecodeCursor(absl::string_view bytes);

}  // namespace ptc

#endif  // PTC_PTC_DATA_CURSOR_H_
