#include "ptc/parallel_config.h"

#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ptc {

absl::string_view AxisName(Axis axis) {
  switch (axis) {
    case Axis::kPipeline:
      return "pp";
    case Axis::kData:
      return "dp";
    case Axis::kTensor:
      return "tp";
  }
  return "?";
}

namespace {

absl::StatusOr<Axis> ParseAxis(absl::string_view name) {
  if (name == "pp") return Axis::kPipeline;
  if (name == "dp") return Axis::kData;
  if (name == "tp") return Axis::kTensor;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown axis '", name, "'; expected pp, dp or tp"));
}

}  // namespace

std::pair<int64_t, int64_t> ChunkOf(int64_t extent, int64_t parts, int64_t i) {
  const int64_t base = extent / parts, extra = extent % parts;
  const int64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

int ParallelConfig::size(Axis a) const {
  switch (a) {
    case Axis::kPipeline:
      return pp;
    case Axis::kData:
      return dp;
    case Axis::kTensor:
      return tp;
  }
  return 1;
}

MeshCoord ParallelConfig::CoordOf(int rank) const {
  MeshCoord c;
  for (Axis a : order) {
    c.index[static_cast<int>(a)] = rank % size(a);
    rank /= size(a);
  }
  return c;
}

int ParallelConfig::RankOf(const MeshCoord& coord) const {
  int rank = 0;
  for (int i = kNumAxes - 1; i >= 0; --i) {
    rank = rank * size(order[i]) + coord.at(order[i]);
  }
  return rank;
}

absl::StatusOr<ParallelConfig> ParallelConfig::Parse(absl::string_view text) {
  ParallelConfig c;
  for (absl::string_view token : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(token, absl::MaxSplits('=', 1));
    const absl::string_view key = kv.first, value = kv.second;
    if (key == "layers") {
      for (absl::string_view n : absl::StrSplit(value, '/')) {
        int layers;
        if (!absl::SimpleAtoi(n, &layers)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "bad layers-per-stage list '", value, "' in parallel config '",
              text, "'; expected e.g. layers=10/14"));
        }
        c.layers_per_stage.push_back(layers);
      }
      continue;
    }
    if (key == "order") {
      std::vector<absl::string_view> names = absl::StrSplit(value, '-');
      if (names.size() != kNumAxes) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad rank order '", value,
                         "'; expected the three axes fastest "
                         "first, e.g. order=tp-dp-pp"));
      }
      for (int i = 0; i < kNumAxes; ++i) {
        auto axis = ParseAxis(names[i]);
        if (!axis.ok()) return axis.status();
        c.order[i] = *axis;
      }
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
    auto axis = ParseAxis(key);
    if (!axis.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key '", key, "' in parallel config '", text,
                       "'; expected tp, pp, dp, zero, layers or order"));
    }
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, "=", n, " in parallel config '", text,
                       "': every degree must be at least 1"));
    }
    switch (*axis) {
      case Axis::kPipeline:
        c.pp = n;
        break;
      case Axis::kData:
        c.dp = n;
        break;
      case Axis::kTensor:
        c.tp = n;
        break;
    }
  }
  return c;
}

std::string ParallelConfig::ToString() const {
  std::string s = absl::StrCat("tp=", tp, ",pp=", pp, ",dp=", dp);
  if (zero1) absl::StrAppend(&s, ",zero=1");
  if (!layers_per_stage.empty()) {
    absl::StrAppend(&s, ",layers=", absl::StrJoin(layers_per_stage, "/"));
  }
  const ParallelConfig defaults;
  if (order != defaults.order) {
    absl::StrAppend(&s, ",order=", AxisName(order[0]), "-", AxisName(order[1]),
                    "-", AxisName(order[2]));
  }
  return s;
}

absl::Status ParallelConfig::Validate(int num_layers) const {
  if (tp < 1 || pp < 1 || dp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", ToString(), ": every degree must be at least 1"));
  }
  bool seen[kNumAxes] = {false, false, false};
  for (Axis a : order) {
    if (seen[static_cast<int>(a)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel config ", ToString(), ": rank order names ",
                       AxisName(a), " twice"));
    }
    seen[static_cast<int>(a)] = true;
  }
  if (pp > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", ToString(), ": pp=", pp, " is larger than the ",
        num_layers, " layers of the model; every stage needs a layer"));
  }
  if (!layers_per_stage.empty()) {
    if (static_cast<int>(layers_per_stage.size()) != pp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallel config ", ToString(), ": layers-per-stage lists ",
          layers_per_stage.size(), " stages but pp=", pp));
    }
    int total = 0;
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
    auto [b, e] = ChunkOf(num_layers, pp, stage);
    return {static_cast<int>(b), static_cast<int>(e - b)};
  }
  int first = 0;
  for (int s = 0; s < stage; ++s) first += layers_per_stage[s];
  return {first, layers_per_stage[stage]};
}

int ParallelConfig::StageOfLayer(int layer, int num_layers) const {
  for (int s = 0; s < pp; ++s) {
    auto [first, n] = StageLayers(s, num_layers);
    if (layer < first + n) return s;
  }
  return pp - 1;
}

}  // namespace ptc
