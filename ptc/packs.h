// How a rank's save groups its small regions into packs: one buffer (a
// memfd of ptcd's) that holds up to kMaxPackRegions regions, each from a
// kPackAlignment boundary, asked for in one request (the local protocol's
// AllocatePuts). The client packs what it writes; the coordinator, which
// has ptcd prepare a save's memory before the save (a job's first, or
// the first of a new layout), asks for the same buffers, so the sizes it
// prepares are the sizes the save takes.
//
//   std::vector<PackCandidate> regions = ...;   // the rank's, in order
//   std::vector<int64_t> sizes = SaveBufferSizes(regions);
#ifndef PTC_PTC_PACKS_H_
#define PTC_PTC_PACKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ptc {

// Where a pack's regions start: page boundaries, so that a client can map
// one region of it alone.
inline constexpr int64_t kPackAlignment = 4096;
// A pack holds at most this many regions and bytes: a pack's memory
// returns only once all its regions are gone (a region a later version
// keeps holds its whole pack), so packs stay small beside a save.
inline constexpr int kMaxPackRegions = 128;
inline constexpr int64_t kMaxPackBytes = int64_t{64} << 20;
// Regions this large or larger are saved alone (a client maps them in
// huge pages itself).
inline constexpr int64_t kPackRegionsBelow = int64_t{8} << 20;
// A pack's request stays this far within a local packet (64 KiB).
inline constexpr int64_t kMaxPackRequestBytes = int64_t{32} << 10;

// A region as packing sees it: its bytes, and about what naming it takes
// in a request (PackRequestBytes).
struct PackCandidate {
  int64_t bytes = 0;
  int64_t request_bytes = 0;
};

// At most what naming a region of tensor `key` with `rank` dimensions
// takes in an AllocatePuts request.
int64_t PackRequestBytes(const std::string& key, int rank);

// `bytes` rounded up to kPackAlignment.
int64_t PackAligned(int64_t bytes);

// The regions that go into one pack when region `first` of `regions` (a
// rank's, in order) is written first of those not `taken`: `first`, then
// the ones after it, then those before it, each under kPackRegionsBelow
// and not taken, up to kMaxPackRegions regions, kMaxPackBytes and
// kMaxPackRequestBytes. Fewer than two (a region alone, or one too large
// to pack): empty.
std::vector<size_t> NextPack(const std::vector<PackCandidate>& regions,
                             size_t first, const std::vector<bool>& taken);

// The bytes of a pack of `members`: each region from an aligned start.
int64_t PackBytes(const std::vector<PackCandidate>& regions,
                  const std::vector<size_t>& members);

// The buffers a save of `regions` written in order asks for: each pack's
// bytes and each lone region's, in the order they are asked for.
std::vector<int64_t> SaveBufferSizes(const std::vector<PackCandidate>& regions);

}  // namespace ptc

#endif  // PTC_PTC_PACKS_H_
