#include "ptc/model_spec.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ptc {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kParameter:
      return "parameter";
    case Role::kOptimizerState:
      return "optimizer_state";
    case Role::kDataset:
      return "dataset";
    case Role::kOther:
      return "other";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kParameter, Role::kOptimizerState, Role::kDataset,
                 Role::kOther}) {
    if (RoleName(r) == name) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name,
      "'; use parameter, optimizer_state, dataset or other"));
}

int64_t ModelSpec::TotalBytes() const {
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.bytes();
  return total;
}

int ModelSpec::FindTensor(absl::string_view key) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].key == key) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<ParallelConfig> ModelSpec::ParseConfig(
    absl::string_view text) const {
  return ParallelConfig::Parse(text, mesh);
}

namespace {

// Bounds that keep every count in a spec far from overflow.
constexpr int64_t kMaxExtent = int64_t{1} << 48;
constexpr int kMaxRank = 8;
constexpr int kMaxLayers = 1 << 20;

absl::Status ValidateMesh(const ModelSpec& spec) {
  if (spec.mesh.empty() ||
      spec.mesh.size() > static_cast<size_t>(kMaxMeshAxes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec '", spec.name, "': the mesh must have 1 to ", kMaxMeshAxes,
        " axes; it has ", spec.mesh.size()));
  }
  std::set<std::string> seen;
  for (const std::string& a : spec.mesh) {
    const bool ok_name =
        !a.empty() && a.size() <= 32 &&
        std::all_of(a.begin(), a.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        });
    if (!ok_name || a == "zero" || a == "layers" || a == "order") {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec '", spec.name, "': mesh axis '", a,
          "' must be 1-32 characters of a-z, 0-9 and _, and not zero, "
          "layers or order"));
    }
    if (!seen.insert(a).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec '", spec.name, "': mesh axis '", a, "' is listed twice"));
    }
  }
  if (spec.num_layers < 1 || spec.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec '", spec.name, "': num_layers ", spec.num_layers,
                     " is not between 1 and ", kMaxLayers));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const ModelSpec& spec, const TensorSpec& t) {
  if (t.key.empty() || t.key.size() > 1024) {
    return absl::InvalidArgumentError(
        "a tensor key must be 1 to 1024 characters");
  }
  if (t.shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.key, "' has rank ", t.shape.size(),
                     "; at most ", kMaxRank, " dimensions"));
  }
  int64_t elements = 1;
  for (int64_t e : t.shape) {
    if (e < 0 || e > kMaxExtent) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.key, "' has extent ", e, " in shape [",
          absl::StrJoin(t.shape, ", "), "]; extents are 0 to 2^48"));
    }
    if (e != 0 && elements > kMaxExtent / e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.key, "' of shape [", absl::StrJoin(t.shape, ", "),
          "] has more than 2^48 elements"));
    }
    elements *= e;
  }
  std::set<std::string> axes_used;
  for (const AxisPlacement& p : t.placements) {
    PTC_RETURN_IF_ERROR(ValidateAxisPlacement(p, t.shape, spec.mesh, t.key));
    for (const std::string& a : p.axes) {
      if (!axes_used.insert(a).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.key, "': axis '", a,
                         "' appears in two placements"));
      }
    }
  }
  if (t.stage.kind == StageRule::Kind::kLayer &&
      (t.stage.layer < 0 || t.stage.layer >= spec.num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.key, "' belongs to layer ", t.stage.layer,
                     " but the model has ", spec.num_layers, " layers"));
  }
  if (t.stage.kind == StageRule::Kind::kList) {
    if (t.stage.stages.empty() || t.stage.stages.size() > 65536) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.key, "': an explicit stage list needs 1 to 65536 "
          "stages"));
    }
    for (int s : t.stage.stages) {
      if (s < 0 || s >= spec.num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.key, "': stage ", s,
                         " is out of range for a model of ", spec.num_layers,
                         " layers"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBuffers(const ModelSpec& spec) {
  const int n = static_cast<int>(spec.tensors.size());
  std::vector<int> entry_of(n, -1);  // buffer whose entry tensor t is
  std::set<std::string> names;
  for (size_t b = 0; b < spec.buffers.size(); ++b) {
    const FlatBuffer& buf = spec.buffers[b];
    auto bad = [&](auto&&... what) {
      return absl::InvalidArgumentError(
          absl::StrCat("flat buffer '", buf.name, "': ", what...));
    };
    if (buf.name.empty() || !names.insert(buf.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flat buffer #", b, ": names must be non-empty and unique ('",
          buf.name, "')"));
    }
    if (buf.axes.empty()) return bad("names no axis to shard over");
    std::set<std::string> axes;
    for (const std::string& a : buf.axes) {
      if (std::find(spec.mesh.begin(), spec.mesh.end(), a) == spec.mesh.end())
        return bad("unknown axis '", a, "'; the mesh has ",
                   absl::StrJoin(spec.mesh, ", "));
      if (a == kPipelineAxis) return bad("cannot shard over the pipeline axis");
      if (!axes.insert(a).second) return bad("names axis '", a, "' twice");
    }
    if (buf.align < 1 || buf.align > (1 << 20))
      return bad("align ", buf.align, " is not between 1 and 2^20");
    if (buf.bucket_size < 0 || buf.bucket_size > kMaxExtent)
      return bad("bucket_size ", buf.bucket_size, " is out of range");
    if (buf.bucket_pad < 0 || buf.bucket_pad > (1 << 20))
      return bad("bucket_pad ", buf.bucket_pad, " is not between 0 and 2^20");
    if (buf.entries.empty()) return bad("has no entries");
    for (const FlatBuffer::Entry& e : buf.entries) {
      if (e.tensor < 0 || e.tensor >= n) return bad("entry out of range");
      const TensorSpec& t = spec.tensors[e.tensor];
      if (entry_of[e.tensor] >= 0) {
        return bad("tensor '", t.key, "' is already an entry of buffer '",
                   spec.buffers[entry_of[e.tensor]].name,
                   "'; buffers must not overlap");
      }
      entry_of[e.tensor] = static_cast<int>(b);
      if (e.with_padding) {
        int padded = 0, cuts = 0;
        for (const AxisPlacement& p : t.placements) {
          if (p.kind == AxisPlacement::Kind::kReplicate ||
              p.kind == AxisPlacement::Kind::kSelect || p.dim != 0)
            continue;
          ++cuts;
          padded += p.kind == AxisPlacement::Kind::kShard && p.pad_multiple > 0;
        }
        if (padded != 1 || cuts != 1) {
          return bad("entry '", t.key, "' is with_padding but is not cut on "
                     "dimension 0 by exactly one placement, a shard with "
                     "pad_multiple");
        }
      }
      for (const AxisPlacement& p : t.placements) {
        for (const std::string& a : p.axes) {
          if (axes.count(a) && p.kind != AxisPlacement::Kind::kReplicate) {
            return bad("entry '", t.key, "' is cut over axis '", a,
                       "', which the buffer shards; an entry must be whole "
                       "on the buffer's axes");
          }
        }
      }
    }
  }
  // Buffers that join another under some configs.
  for (size_t b = 0; b < spec.buffers.size(); ++b) {
    const FlatBuffer& buf = spec.buffers[b];
    auto bad = [&](auto&&... what) {
      return absl::InvalidArgumentError(
          absl::StrCat("flat buffer '", buf.name, "': ", what...));
    };
    if (buf.join < 0) {
      if (!buf.join_when_size_one.empty())
        return bad("join_when_size_one needs join");
      for (const FlatBuffer::Entry& e : buf.entries) {
        if (e.join_before >= 0)
          return bad("entry '", spec.tensors[e.tensor].key,
                     "' names join_before but the buffer joins none");
      }
      continue;
    }
    if (buf.join >= static_cast<int>(spec.buffers.size()) ||
        buf.join == static_cast<int>(b)) {
      return bad("join must name another buffer");
    }
    const FlatBuffer& into = spec.buffers[buf.join];
    if (into.join >= 0) {
      return bad("joins '", into.name, "', which joins another buffer");
    }
    if (into.optional != buf.optional) {
      return bad("joins '", into.name, "', whose optional differs");
    }
    if (buf.join_when_size_one.empty())
      return bad("join needs join_when_size_one (at least one axis)");
    std::set<std::string> when;
    for (const std::string& a : buf.join_when_size_one) {
      if (std::find(spec.mesh.begin(), spec.mesh.end(), a) == spec.mesh.end())
        return bad("join_when_size_one: unknown axis '", a, "'; the mesh has ",
                   absl::StrJoin(spec.mesh, ", "));
      if (!when.insert(a).second)
        return bad("join_when_size_one names axis '", a, "' twice");
    }
    for (const FlatBuffer::Entry& e : buf.entries) {
      const TensorSpec& t = spec.tensors[e.tensor];
      if (e.join_before >= 0 &&
          (e.join_before >= n || entry_of[e.join_before] != buf.join)) {
        return bad("entry '", t.key, "' joins before a tensor that is not an "
                   "entry of '", into.name, "'");
      }
      for (const AxisPlacement& p : t.placements) {
        for (const std::string& a : p.axes) {
          if (p.kind != AxisPlacement::Kind::kReplicate && !when.count(a) &&
              std::find(into.axes.begin(), into.axes.end(), a) !=
                  into.axes.end()) {
            return bad("entry '", t.key, "' is cut over axis '", a,
                       "', which '", into.name,
                       "' shards; an entry must be whole on the axes of the "
                       "buffer it joins");
          }
        }
      }
    }
  }
  for (int t = 0; t < n; ++t) {
    const TensorSpec& ts = spec.tensors[t];
    if (ts.buffer < 0 && ts.slot < 0) continue;
    if (ts.buffer < 0 || ts.buffer >= static_cast<int>(spec.buffers.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.key, "' names buffer #", ts.buffer,
          ", which does not exist"));
    }
    if (ts.slot < 0 || ts.slot >= n || entry_of[ts.slot] != ts.buffer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.key, "' is in buffer '", spec.buffers[ts.buffer].name,
          "' but its slot is not an entry of that buffer"));
    }
    const TensorSpec& slot = spec.tensors[ts.slot];
    if (slot.shape != ts.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ts.key, "' of shape [", absl::StrJoin(ts.shape, ", "),
          "] shares the buffer slot of '", slot.key, "' of shape [",
          absl::StrJoin(slot.shape, ", "), "]; shapes must match"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSmallObjects(const ModelSpec& spec) {
  std::set<std::string> names;
  for (const SmallObjectSpec& o : spec.small_objects) {
    if (o.name.empty() || o.name.size() > 256 || !names.insert(o.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "small object '", o.name,
          "': names must be 1 to 256 characters and unique"));
    }
    std::set<std::string> seen;
    for (const std::string& a : o.scope) {
      if (std::find(spec.mesh.begin(), spec.mesh.end(), a) == spec.mesh.end() ||
          !seen.insert(a).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "small object '", o.name, "': scope axis '", a,
            "' is unknown or repeated; the mesh has ",
            absl::StrJoin(spec.mesh, ", ")));
      }
    }
    if (o.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("small object '", o.name, "': bytes is negative"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelSpec::Validate() const {
  PTC_RETURN_IF_ERROR(ValidateMesh(*this));
  absl::flat_hash_set<absl::string_view> keys;
  keys.reserve(tensors.size());
  for (const TensorSpec& t : tensors) {
    PTC_RETURN_IF_ERROR(ValidateTensor(*this, t));
    if (!keys.insert(t.key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.key, "' is listed twice"));
    }
  }
  PTC_RETURN_IF_ERROR(ValidateBuffers(*this));
  return ValidateSmallObjects(*this);
}

absl::Status CheckConfig(const ModelSpec& spec, const ParallelConfig& config) {
  if (config.mesh != spec.mesh) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel config ", config.ToString(), " is for the mesh ",
        absl::StrJoin(config.mesh, ","), " but spec '", spec.name,
        "' has the mesh ", absl::StrJoin(spec.mesh, ",")));
  }
  PTC_RETURN_IF_ERROR(config.Validate(spec.num_layers));
  for (const TensorSpec& t : spec.tensors) {
    const TensorSpec& rules = t.slot >= 0 ? spec.tensors[t.slot] : t;
    for (const AxisPlacement& p : rules.placements) {
      PTC_RETURN_IF_ERROR(CheckAxisPlacementFits(p, t.shape, config, t.key));
    }
    if (rules.stage.kind == StageRule::Kind::kList) {
      for (int s : rules.stage.stages) {
        if (s >= config.pp()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor '", t.key, "' is placed on pipeline stage ", s,
              " but pp=", config.pp(), "; choose pp > ", s));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ptc
