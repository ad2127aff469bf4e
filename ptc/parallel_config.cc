#include "ptc/parallel_config.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ptc {

const std::vector<std::string>& DefaultMesh() {
  static const std::vector<std::string>* mesh =
      new std::vector<std::string>{"pp", "dp", "tp"};
  return *mesh;
}

std::pair<int64_t, int64_t> ChunkOf(int64_t extent, int64_t parts, int64_t i) {
  const int64_t base = extent / parts, extra = extent % parts;
  const int64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

int ParallelConfig::AxisIndex(absl::string_view axis) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] == axis) return static_cast<int>(i);
  }
  return -1;
}

int ParallelConfig::size(absl::string_view axis) const {
  const int i = AxisIndex(axis);
  return i < 0 ? 1 : sizes[i];
}

void ParallelConfig::set_size(absl::string_view axis, int n) {
  const int i = AxisIndex(axis);
  if (i >= 0) sizes[i] = n;
}

int ParallelConfig::world_size() const {
  int64_t n = 1;
  for (int s : sizes) {
    n *= s;
    if (n > kMaxWorldSize) return static_cast<int>(kMaxWorldSize + 1);
  }
  return static_cast<int>(n);
}

MeshCoord ParallelConfig::CoordOf(int rank) const {
  MeshCoord c;
  c.index.assign(axes.size(), 0);
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i) {
    c.index[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return c;
}

int ParallelConfig::RankOf(const MeshCoord& coord) const {
  int rank = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    rank = rank * sizes[i] + coord.index[i];
  }
  return rank;
}

int ParallelConfig::IndexOn(const MeshCoord& coord,
                            absl::string_view axis) const {
  const int i = AxisIndex(axis);
  return i < 0 ? 0 : coord.index[i];
}

namespace {

absl::Status ParseOrder(absl::string_view value, absl::string_view text,
                        ParallelConfig* c) {
  std::vector<std::string> fastest_first = absl::StrSplit(value, '-');
  std::vector<std::string> sorted = fastest_first, want = c->mesh;
  std::sort(sorted.begin(), sorted.end());
  std::sort(want.begin(), want.end());
  if (sorted != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad rank order '", value, "' in parallel config '", text,
        "'; list every axis of the mesh once, fastest first, e.g. order=",
        absl::StrJoin(c->mesh.rbegin(), c->mesh.rend(), "-")));
  }
  std::vector<int> sizes;
  std::vector<std::string> axes(fastest_first.rbegin(), fastest_first.rend());
  for (const std::string& a : axes) sizes.push_back(c->size(a));
  c->axes = std::move(axes);
  c->sizes = std::move(sizes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParallelConfig> ParallelConfig::Parse(
    absl::string_view text, const std::vector<std::string>& mesh) {
  ParallelConfig c;
  c.mesh = mesh;
  c.axes = mesh;
  c.sizes.assign(mesh.size(), 1);
  absl::string_view order;
  for (absl::string_view token : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(token, absl::MaxSplits('=', 1));
    const absl::string_view key = kv.first, value = kv.second;
    if (key == "layers") {
      for (absl::string_view n : absl::StrSplit(value, '/')) {
        int layers;
        if (!absl::SimpleAtoi(n, &layers) || c.layers_per_stage.size() > 65536) {
          return absl::InvalidArgumentError(absl::StrCat(
              "bad layers-per-stage list '", value, "' in parallel config '",
              text, "'; expected e.g. layers=10/14"));
        }
        c.layers_per_stage.push_back(layers);
      }
      continue;
    }
    if (key == "order") {
      order = value;
      continue;
    }
    int n;
    if (!absl::SimpleAtoi(value, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value in '", token, "' of parallel config '", text,
                       "'; expected e.g. tp=2,pp=2,dp=4"));
    }
    if (key == "zero") {
      if (n != 0 && n != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "zero=", value, " is not supported; ptc models zero=0 and zero=1"));
      }
      c.zero1 = n == 1;
      continue;
    }
    const int axis = c.AxisIndex(key);
    if (axis < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown key '", key, "' in parallel config '", text,
          "'; this job's mesh has the axes ", absl::StrJoin(mesh, ", "),
          " (other keys: zero, layers, order)"));
    }
    if (n < 1 || n > kMaxWorldSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, "=", n, " in parallel config '", text,
          "': every degree must be between 1 and ", kMaxWorldSize));
    }
    c.sizes[axis] = n;
  }
  if (!order.empty()) {
    if (absl::Status s = ParseOrder(order, text, &c); !s.ok()) return s;
  }
  if (c.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel config '", text, "' has more than ",
                     kMaxWorldSize, " ranks"));
  }
  return c;
}

std::string ParallelConfig::ToString() const {
  std::vector<std::string> parts;
  std::vector<std::string> order = {"tp", "pp", "dp"};
  for (const std::string& a : mesh) {
    if (a != "tp" && a != "pp" && a != "dp") order.push_back(a);
  }
  for (const std::string& a : order) {
    if (AxisIndex(a) >= 0) parts.push_back(absl::StrCat(a, "=", size(a)));
  }
  if (zero1) parts.push_back("zero=1");
  if (!layers_per_stage.empty()) {
    parts.push_back(
        absl::StrCat("layers=", absl::StrJoin(layers_per_stage, "/")));
  }
  if (axes != mesh) {
    parts.push_back(absl::StrCat(
        "order=", absl::StrJoin(axes.rbegin(), axes.rend(), "-")));
  }
  return absl::StrJoin(parts, ",");
}

std::string ParallelConfig::CoordString(const MeshCoord& coord) const {
  std::vector<std::string> parts;
  for (const std::string& a : mesh) {
    parts.push_back(absl::StrCat(a, "=", IndexOn(coord, a)));
  }
  return absl::StrJoin(parts, ",");
}

absl::Status ParallelConfig::Validate(int num_layers) const {
  if (sizes.size() != axes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", ToString(), ": ", sizes.size(), " sizes for ",
        axes.size(), " axes"));
  }
  for (int n : sizes) {
    if (n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallel config ", ToString(), ": every degree must be at least 1"));
    }
  }
  if (world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", ToString(), " has more than ", kMaxWorldSize,
        " ranks"));
  }
  const int stages = pp();
  if (stages > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", ToString(), ": pp=", stages,
        " is larger than the ", num_layers,
        " layers of the model; every stage needs a layer"));
  }
  if (!layers_per_stage.empty()) {
    if (static_cast<int>(layers_per_stage.size()) != stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallel config ", ToString(), ": layers-per-stage lists ",
          layers_per_stage.size(), " stages but pp=", stages));
    }
    int64_t total = 0;
    for (int n : layers_per_stage) {
      if (n < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("parallel config ", ToString(),
                         ": every pipeline stage needs at least one layer"));
      }
      total += n;
    }
    if (total != num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallel config ", ToString(), ": layers per stage add up to ",
          total, " but the model has ", num_layers, " layers"));
    }
  }
  return absl::OkStatus();
}

std::pair<int, int> ParallelConfig::StageLayers(int stage,
                                                int num_layers) const {
  if (layers_per_stage.empty()) {
    auto [b, e] = ChunkOf(num_layers, pp(), stage);
    return {static_cast<int>(b), static_cast<int>(e - b)};
  }
  int first = 0;
  for (int s = 0; s < stage; ++s) first += layers_per_stage[s];
  return {first, layers_per_stage[stage]};
}

int ParallelConfig::StageOfLayer(int layer, int num_layers) const {
  const int stages = pp();
  for (int s = 0; s < stages; ++s) {
    auto [first, n] = StageLayers(s, num_layers);
    if (layer < first + n) return s;
  }
  return stages - 1;
}

}  // namespace ptc
