// Layouts (σ, φ of the PTC model): for every tensor, the regions each rank
// holds under a parallel config, and placements (α): rank -> (host, GPU).
//
//   PTC_ASSIGN_OR_RETURN(Layout layout, BuildLayout(spec, config));
//   for (const Shard& s : layout.shards(t)) { ... s.rank, s.region ... }
//   PTC_ASSIGN_OR_RETURN(Placement p, ContiguousPlacement(cluster, hosts, n));
#ifndef PTC_PTC_LAYOUT_H_
#define PTC_PTC_LAYOUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ptc/model_spec.h"
#include "ptc/parallel_config.h"
#include "ptc/region.h"

namespace ptc {

// One region of one tensor held by one rank.
struct Shard {
  int32_t rank = 0;
  Region region;
};

class Layout {
 public:
  Layout() = default;
  // Indexes every tensor's distinct regions (see regions()).
  Layout(int world_size, std::vector<std::vector<Shard>> shards,
         std::optional<ParallelConfig> config);

  int world_size() const { return world_size_; }
  int num_tensors() const { return static_cast<int>(shards_.size()); }
  // Shards of tensor `t`, sorted by rank; a rank may hold several regions
  // (grouped splits, ZeRO ranges) or none.
  const std::vector<Shard>& shards(int t) const { return shards_[t]; }
  // The distinct regions of tensor `t` (in order of first appearance),
  // and for shards(t)[i] the index of its region among them: layouts
  // repeat a few regions over many ranks (every dp replica holds the same
  // tp shards), and planning works on these small numbers.
  const std::vector<Region>& regions(int t) const { return regions_[t]; }
  const std::vector<int32_t>& region_ids(int t) const { return region_ids_[t]; }

  // The parallel config the layout was built from; empty for an explicit
  // layout registered by a framework the rules do not cover.
  const std::optional<ParallelConfig>& config() const { return config_; }

  // Bytes rank `rank` holds in total.
  int64_t RankBytes(const ModelSpec& spec, int rank) const;

 private:
  int world_size_ = 0;
  std::vector<std::vector<Shard>> shards_;
  std::vector<std::vector<Region>> regions_;
  std::vector<std::vector<int32_t>> region_ids_;
  std::optional<ParallelConfig> config_;
};

// Builds the layout of `spec` under `config`: every tensor's placements and
// stage rule on every rank, and the flat buffers in use (all but optional
// ones without zero=1): each rank owns its chunk of every bucket of its
// group's buffer, and a member tensor holds the flat ranges of its slot's
// local shard that fall in those chunks (a piece becomes at most
// 2*rank-1 rectangles per region). Refuses configs the spec cannot run
// with (CheckConfig).
absl::StatusOr<Layout> BuildLayout(const ModelSpec& spec,
                                   const ParallelConfig& config);

// The regions one rank holds under `config`, per tensor, in the order
// BuildLayout lists them for that rank: what a training process needs of
// its job's layout, built without the other ranks' (at 16,384 ranks of a
// 405B model the whole layout is 0.2-0.3 s and hundreds of MiB).
// INVALID_ARGUMENT for a rank outside the config, as BuildLayout otherwise.
absl::StatusOr<std::vector<std::vector<Region>>> BuildRankRegions(
    const ModelSpec& spec, const ParallelConfig& config, int rank);

// One instance of flat buffer `buffer` as rank `rank` sees it under
// `config`: where each entry's local shard starts (its regions row-major,
// in order), the buckets, and the chunk of each bucket the rank owns. A
// framework's distributed optimizer built on this view agrees with ptc on
// which elements of which parameter each rank keeps state for.
struct BufferView {
  struct Entry {
    int tensor = -1;
    // -1: the rank's pipeline stage does not hold it, or the buffer joins
    // another under this config (FlatBuffer::join).
    int64_t offset = -1;
    // Elements the entry takes in the buffer: its local shard's, with the
    // padding rows of a with_padding entry.
    int64_t size = 0;
    // Elements of the local shard (the real ones), at the start of each
    // padded region's room.
    int64_t real = 0;
  };
  bool in_use = true;  // false: an optional buffer without zero=1
  int64_t shards = 1;  // ranks the instance is split over
  int64_t index = 0;   // this rank's index among them
  // Listed order, with the entries of buffers that join this one
  // inserted (first_on_later_stages entries lead on later stages).
  std::vector<Entry> entries;
  std::vector<std::pair<int64_t, int64_t>> buckets;          // [start, end)
  std::vector<std::pair<int64_t, int64_t>> chunks;           // per bucket
};

// INVALID_ARGUMENT for an unknown buffer, a rank outside the config or a
// config the spec cannot run with.
absl::StatusOr<BufferView> ViewBuffer(const ModelSpec& spec,
                                      const ParallelConfig& config,
                                      absl::string_view buffer, int rank);

// A layout given rank by rank; checks every region against its tensor's
// shape and every rank against world_size.
absl::StatusOr<Layout> ExplicitLayout(const ModelSpec& spec, int world_size,
                                      std::vector<std::vector<Shard>> shards);

// A machine that holds part of a job's state.
struct Host {
  std::string name;
  int gpus = 8;
  // Link bandwidth to the other hosts, bytes per second.
  double bandwidth = 25e9;
  // The failure domain the host is in, as a path from the widest
  // ("dc1/rack3": lost with dc1, or with rack3 of dc1); empty: none but
  // the host itself.
  std::string domain;
};

// The hosts a plan may involve; host ids are indices into `hosts`.
struct Cluster {
  std::vector<Host> hosts;

  // "host<i>" for i in [0, n) with `gpus` each.
  static Cluster Uniform(int n, int gpus, double bandwidth = 25e9);
  // Index of the host named `name`, or -1.
  int FindHost(absl::string_view name) const;
};

// Where every rank runs.
struct Placement {
  std::vector<int32_t> host;    // rank -> host id
  std::vector<int32_t> device;  // rank -> GPU index on that host

  int world_size() const { return static_cast<int>(host.size()); }
};

// Fills `hosts` in order, GPU 0 upwards, one rank per GPU. Ranks that are
// adjacent in rank order (tp first, in Megatron's order) share a host.
// INVALID_ARGUMENT if the hosts have fewer GPUs than ranks.
absl::StatusOr<Placement> ContiguousPlacement(const Cluster& cluster,
                                              const std::vector<int>& hosts,
                                              int world_size);

// Checks an explicit placement: known hosts, devices in range, at most one
// rank per (host, GPU).
absl::Status ValidatePlacement(const Cluster& cluster,
                               const Placement& placement);

}  // namespace ptc

#endif  // PTC_PTC_LAYOUT_H_
