#include "ptc/small_object.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptc {

absl::string_view NewRankRuleName(NewRankRule rule) {
  return rule == NewRankRule::kDerive ? "derive" : "copy";
}

absl::StatusOr<std::vector<std::string>> ScopeByName(
    absl::string_view name, const std::vector<std::string>& mesh) {
  auto has = [&](absl::string_view a) {
    return std::find(mesh.begin(), mesh.end(), a) != mesh.end();
  };
  if (name == "global") return std::vector<std::string>{};
  std::vector<std::string> scope;
  if (name == "stage" || name == "tp_rank") {
    if (has(kPipelineAxis)) scope.emplace_back(kPipelineAxis);
    if (name == "tp_rank" && has("tp")) scope.emplace_back("tp");
    return scope;
  }
  if (name == "rank") return mesh;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown small-object scope '", name,
                   "'; use global, stage, tp_rank, rank or a list of axes"));
}

std::string ScopeString(const std::vector<std::string>& scope) {
  if (scope.empty()) return "global";
  return absl::StrCat("per ", absl::StrJoin(scope, ","));
}

std::string ScopeCoordinates(const SmallObjectSpec& object,
                             const ParallelConfig& config,
                             const MeshCoord& coord) {
  if (object.scope.empty()) return "global";
  std::vector<std::string> parts;
  for (const std::string& a : object.scope) {
    parts.push_back(absl::StrCat(a, "=", config.IndexOn(coord, a)));
  }
  return absl::StrJoin(parts, ",");
}

SmallObjectSource SmallObjectSources(const SmallObjectSpec& object,
                                     const ParallelConfig& from,
                                     const ParallelConfig& to, int num_layers,
                                     const MeshCoord& target) {
  SmallObjectSource out;
  // want[i]: the index on from.axes[i] a source must have, or -1 for any.
  std::vector<int> want(from.axes.size(), -1);
  std::vector<std::string> derived;
  for (const std::string& a : object.scope) {
    const int i = from.AxisIndex(a);
    if (i < 0) continue;
    const int t = to.IndexOn(target, a);
    if (a == kPipelineAxis) {
      const int first_layer = to.StageLayers(t, num_layers).first;
      want[i] = from.StageOfLayer(first_layer, num_layers);
    } else if (t < from.sizes[i]) {
      want[i] = t;
    } else if (object.new_ranks == NewRankRule::kDerive) {
      want[i] = t % from.sizes[i];
      derived.push_back(a);
    } else {
      want[i] = t % from.sizes[i];
    }
  }
  if (!derived.empty()) {
    out.derive_from = ScopeCoordinates(object, to, target);
    return out;
  }
  // Walk the matching coordinates in rank order (axes are slowest first):
  // an odometer over the free axes, fixed axes held at their index.
  MeshCoord c;
  c.index.resize(from.axes.size());
  for (size_t i = 0; i < want.size(); ++i) c.index[i] = std::max(want[i], 0);
  while (true) {
    out.candidates.push_back(from.RankOf(c));
    int i = static_cast<int>(want.size()) - 1;
    for (; i >= 0; --i) {
      if (want[i] >= 0) continue;
      if (++c.index[i] < from.sizes[i]) break;
      c.index[i] = 0;
    }
    if (i < 0) break;
  }
  return out;
}

namespace {

constexpr char kSeedMagic[] = "PTCSEED1";

uint64_t Mix(uint64_t h, absl::string_view bytes) {
  // FNV-1a over the bytes, then a splitmix64 finalizer.
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

}  // namespace

std::string DerivedSmallObject(absl::string_view job, absl::string_view name,
                               absl::string_view derive_from,
                               int64_t target_version) {
  uint64_t seed = Mix(0xcbf29ce484222325ULL, name);
  seed = Mix(seed, derive_from);
  seed = Mix(seed, absl::StrCat(target_version));
  seed = Mix(seed, absl::StrCat("job=", job));
  std::string out(kSeedMagic, 8);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(seed >> (8 * i)));
  return out;
}

std::optional<uint64_t> DerivedSeed(absl::string_view bytes) {
  if (bytes.size() != 16 || bytes.substr(0, 8) != absl::string_view(kSeedMagic, 8))
    return std::nullopt;
  uint64_t seed = 0;
  for (int i = 7; i >= 0; --i) {
    seed = (seed << 8) | static_cast<unsigned char>(bytes[8 + i]);
  }
  return seed;
}

}  // namespace ptc
