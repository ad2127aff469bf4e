#include "ptc/layout_spec_proto.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace ptc {
namespace {

template <typename... Args>
absl::Status Bad(Args&&... what) {
  return absl::InvalidArgumentError(absl::StrCat(what...));
}

absl::StatusOr<AxisPlacement> AxisPlacementFromProto(const proto::PlacementLayout& w,
                                             absl::string_view key) {
  AxisPlacement p;
  p.axes.assign(w.axes().begin(), w.axes().end());
  const std::string& kind = w.kind();
  if (kind == "replicate") {
    p.kind = AxisPlacement::Kind::kReplicate;
  } else if (kind == "shard") {
    p.kind = AxisPlacement::Kind::kShard;
  } else if (kind == "grouped_shard") {
    p.kind = AxisPlacement::Kind::kGroupedShard;
  } else if (kind == "select") {
    p.kind = AxisPlacement::Kind::kSelect;
  } else {
    return Bad("tensor '", key, "': placement kind '", kind,
               "' is unknown; use replicate, shard, grouped_shard or select");
  }
  p.dim = w.dim();
  p.pad_multiple = w.pad_multiple();
  if (w.groups_size() > 4096) {
    return Bad("tensor '", key, "': at most 4096 groups per placement");
  }
  p.groups.assign(w.groups().begin(), w.groups().end());
  p.repeats = w.repeats() == 0 ? 1 : w.repeats();
  p.item = w.item();
  p.items = w.items();
  p.even = w.even();
  p.unit_size = w.unit_size() == 0 ? 1 : w.unit_size();
  p.unit = w.unit().substr(0, 64);
  return p;
}

absl::StatusOr<StageRule> StageFromProto(const proto::StageLayout& w,
                                         absl::string_view key) {
  const std::string& kind = w.kind();
  if (kind.empty() || kind == "all") return StageRule::All();
  if (kind == "layer") return StageRule::Layer(w.layer());
  if (kind == "first") return StageRule::First();
  if (kind == "last") return StageRule::Last();
  if (kind == "first_and_last") return StageRule::FirstAndLast();
  if (kind == "list") {
    return StageRule::List(std::vector<int>(w.stages().begin(), w.stages().end()));
  }
  return Bad("tensor '", key, "': stage kind '", kind,
             "' is unknown; use all, layer, first, last, first_and_last or "
             "list");
}

absl::StatusOr<FlatBuffer::OwnBucket> OwnBucketFromName(
    absl::string_view name, absl::string_view buffer) {
  if (name.empty() || name == "never") return FlatBuffer::OwnBucket::kNever;
  if (name == "always") return FlatBuffer::OwnBucket::kAlways;
  if (name == "when_shared") return FlatBuffer::OwnBucket::kWhenShared;
  return Bad("flat buffer '", buffer, "': own_bucket '", name,
             "' is unknown; use never, always or when_shared");
}

const char* OwnBucketName(FlatBuffer::OwnBucket o) {
  switch (o) {
    case FlatBuffer::OwnBucket::kNever:
      return "";
    case FlatBuffer::OwnBucket::kAlways:
      return "always";
    case FlatBuffer::OwnBucket::kWhenShared:
      return "when_shared";
  }
  return "";
}

const char* AxisPlacementKindName(AxisPlacement::Kind k) {
  switch (k) {
    case AxisPlacement::Kind::kReplicate:
      return "replicate";
    case AxisPlacement::Kind::kShard:
      return "shard";
    case AxisPlacement::Kind::kGroupedShard:
      return "grouped_shard";
    case AxisPlacement::Kind::kSelect:
      return "select";
  }
  return "";
}

const char* StageKindName(StageRule::Kind k) {
  switch (k) {
    case StageRule::Kind::kLayer:
      return "layer";
    case StageRule::Kind::kFirst:
      return "first";
    case StageRule::Kind::kLast:
      return "last";
    case StageRule::Kind::kFirstAndLast:
      return "first_and_last";
    case StageRule::Kind::kAll:
      return "all";
    case StageRule::Kind::kList:
      return "list";
  }
  return "";
}

}  // namespace

absl::StatusOr<ModelSpec> SpecFromProto(const proto::LayoutSpec& w) {
  if (w.format_version() < 0 || w.format_version() > ModelSpec::kFormatVersion) {
    return Bad("layout spec format_version ", w.format_version(),
               " is not supported; this ptc reads version ",
               ModelSpec::kFormatVersion);
  }
  if (w.tensors_size() > kMaxSpecTensors) {
    return Bad("layout spec lists ", w.tensors_size(), " tensors; at most ",
               kMaxSpecTensors);
  }
  if (w.mesh_size() > kMaxMeshAxes || w.buffers_size() > 4096 ||
      w.small_objects_size() > 65536) {
    return Bad("layout spec: at most ", kMaxMeshAxes,
               " mesh axes, 4096 buffers and 65536 small objects");
  }
  ModelSpec spec;
  spec.name = w.name().empty() ? "layout" : w.name().substr(0, 256);
  if (w.mesh_size() > 0) spec.mesh.assign(w.mesh().begin(), w.mesh().end());
  spec.num_layers = w.num_layers() == 0 ? 1 : w.num_layers();
  absl::flat_hash_map<std::string, int> index;
  index.reserve(w.tensors_size());
  spec.tensors.reserve(w.tensors_size());
  for (const proto::TensorLayout& t : w.tensors()) {
    TensorSpec ts;
    ts.key = t.key();
    if (!index.emplace(ts.key, static_cast<int>(spec.tensors.size())).second) {
      return Bad("tensor '", ts.key, "' is listed twice");
    }
    auto dtype = ParseDType(t.dtype());
    if (!dtype.ok()) {
      return Bad("tensor '", ts.key, "': ", dtype.status().message());
    }
    ts.dtype = *dtype;
    if (t.shape_size() > 8) {
      return Bad("tensor '", ts.key, "' has rank ", t.shape_size(),
                 "; at most 8 dimensions");
    }
    ts.shape.assign(t.shape().begin(), t.shape().end());
    if (!t.role().empty()) {
      auto role = ParseRole(t.role());
      if (!role.ok()) return Bad("tensor '", ts.key, "': ", role.status().message());
      ts.role = *role;
    }
    if (t.placements_size() > kMaxMeshAxes) {
      return Bad("tensor '", ts.key, "' lists ", t.placements_size(),
                 " placements; at most one per mesh axis");
    }
    for (const proto::PlacementLayout& p : t.placements()) {
      PTC_ASSIGN_OR_RETURN(AxisPlacement placement, AxisPlacementFromProto(p, ts.key));
      ts.placements.push_back(std::move(placement));
    }
    PTC_ASSIGN_OR_RETURN(ts.stage, StageFromProto(t.stage(), ts.key));
    spec.tensors.push_back(std::move(ts));
  }
  absl::flat_hash_map<std::string, int> buffer_index;
  for (const proto::FlatBufferLayout& b : w.buffers()) {
    FlatBuffer buf;
    buf.name = b.name();
    buffer_index.emplace(buf.name, static_cast<int>(spec.buffers.size()));
    buf.axes.assign(b.axes().begin(), b.axes().end());
    for (const proto::FlatBufferLayout::Entry& e : b.entries()) {
      auto it = index.find(e.tensor());
      if (it == index.end()) {
        return Bad("flat buffer '", buf.name, "': entry '", e.tensor(),
                   "' is not a tensor of the spec");
      }
      PTC_ASSIGN_OR_RETURN(FlatBuffer::OwnBucket own,
                           OwnBucketFromName(e.own_bucket(), buf.name));
      FlatBuffer::Entry entry;
      entry.tensor = it->second;
      entry.own_bucket = own;
      entry.first_on_later_stages = e.first_on_later_stages();
      entry.with_padding = e.with_padding();
      if (!e.join_before().empty()) {
        auto before = index.find(e.join_before());
        if (before == index.end()) {
          return Bad("flat buffer '", buf.name, "': entry '", e.tensor(),
                     "' joins before '", e.join_before(),
                     "', which is not a tensor of the spec");
        }
        entry.join_before = before->second;
      }
      buf.entries.push_back(entry);
    }
    buf.align = b.align() == 0 ? 1 : b.align();
    buf.bucket_size = b.bucket_size();
    buf.bucket_pad = b.bucket_pad();
    buf.optional = b.optional();
    buf.bucket_first_stage_only = b.bucket_first_stage_only();
    buf.join_when_size_one.assign(b.join_when_size_one().begin(),
                                  b.join_when_size_one().end());
    spec.buffers.push_back(std::move(buf));
  }
  for (int i = 0; i < w.buffers_size(); ++i) {
    const std::string& join = w.buffers(i).join();
    if (join.empty()) continue;
    auto it = buffer_index.find(join);
    if (it == buffer_index.end()) {
      return Bad("flat buffer '", w.buffers(i).name(), "': join '", join,
                 "' is not a buffer of the spec");
    }
    spec.buffers[i].join = it->second;
  }
  for (int i = 0; i < w.tensors_size(); ++i) {
    const proto::TensorLayout& t = w.tensors(i);
    if (t.buffer().empty()) {
      if (!t.slot().empty()) {
        return Bad("tensor '", t.key(), "' names slot '", t.slot(),
                   "' but no buffer");
      }
      continue;
    }
    auto b = buffer_index.find(t.buffer());
    if (b == buffer_index.end()) {
      return Bad("tensor '", t.key(), "' names buffer '", t.buffer(),
                 "', which the spec does not declare");
    }
    spec.tensors[i].buffer = b->second;
    const std::string& slot = t.slot().empty() ? t.key() : t.slot();
    auto s = index.find(slot);
    if (s == index.end()) {
      return Bad("tensor '", t.key(), "': slot '", slot,
                 "' is not a tensor of the spec");
    }
    spec.tensors[i].slot = s->second;
  }
  for (const proto::SmallObjectLayout& o : w.small_objects()) {
    SmallObjectSpec so;
    so.name = o.name();
    so.scope.assign(o.scope().begin(), o.scope().end());
    if (o.new_ranks().empty() || o.new_ranks() == "copy") {
      so.new_ranks = NewRankRule::kCopy;
    } else if (o.new_ranks() == "derive") {
      so.new_ranks = NewRankRule::kDerive;
    } else {
      return Bad("small object '", so.name, "': new_ranks '", o.new_ranks(),
                 "' is unknown; use copy or derive");
    }
    so.bytes = o.bytes();
    spec.small_objects.push_back(std::move(so));
  }
  PTC_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

proto::LayoutSpec SpecToProto(const ModelSpec& spec) {
  proto::LayoutSpec w;
  w.set_format_version(ModelSpec::kFormatVersion);
  w.set_name(spec.name);
  for (const std::string& a : spec.mesh) w.add_mesh(a);
  w.set_num_layers(spec.num_layers);
  for (const TensorSpec& t : spec.tensors) {
    proto::TensorLayout* pt = w.add_tensors();
    pt->set_key(t.key);
    pt->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t e : t.shape) pt->add_shape(e);
    if (t.role != Role::kParameter) pt->set_role(std::string(RoleName(t.role)));
    if (t.slot < 0 || t.slot == &t - spec.tensors.data()) {
      for (const AxisPlacement& p : t.placements) {
        proto::PlacementLayout* pp = pt->add_placements();
        for (const std::string& a : p.axes) pp->add_axes(a);
        pp->set_kind(AxisPlacementKindName(p.kind));
        pp->set_dim(p.dim);
        pp->set_pad_multiple(p.pad_multiple);
        for (int64_t g : p.groups) pp->add_groups(g);
        if (p.repeats > 1) pp->set_repeats(p.repeats);
        pp->set_item(p.item);
        pp->set_items(p.items);
        pp->set_even(p.even);
        if (p.unit_size > 1) pp->set_unit_size(p.unit_size);
        pp->set_unit(p.unit);
      }
      if (t.stage.kind != StageRule::Kind::kAll) {
        proto::StageLayout* st = pt->mutable_stage();
        st->set_kind(StageKindName(t.stage.kind));
        st->set_layer(t.stage.layer);
        for (int s : t.stage.stages) st->add_stages(s);
      }
    }
    if (t.buffer >= 0) {
      pt->set_buffer(spec.buffers[t.buffer].name);
      if (t.slot >= 0 && spec.tensors[t.slot].key != t.key)
        pt->set_slot(spec.tensors[t.slot].key);
    }
  }
  for (const FlatBuffer& b : spec.buffers) {
    proto::FlatBufferLayout* pb = w.add_buffers();
    pb->set_name(b.name);
    for (const std::string& a : b.axes) pb->add_axes(a);
    for (const FlatBuffer::Entry& e : b.entries) {
      proto::FlatBufferLayout::Entry* pe = pb->add_entries();
      pe->set_tensor(spec.tensors[e.tensor].key);
      pe->set_own_bucket(OwnBucketName(e.own_bucket));
      pe->set_first_on_later_stages(e.first_on_later_stages);
      pe->set_with_padding(e.with_padding);
      if (e.join_before >= 0)
        pe->set_join_before(spec.tensors[e.join_before].key);
    }
    pb->set_align(b.align);
    pb->set_bucket_size(b.bucket_size);
    pb->set_bucket_pad(b.bucket_pad);
    pb->set_optional(b.optional);
    pb->set_bucket_first_stage_only(b.bucket_first_stage_only);
    if (b.join >= 0) pb->set_join(spec.buffers[b.join].name);
    for (const std::string& a : b.join_when_size_one)
      pb->add_join_when_size_one(a);
  }
  for (const SmallObjectSpec& o : spec.small_objects) {
    proto::SmallObjectLayout* po = w.add_small_objects();
    po->set_name(o.name);
    for (const std::string& a : o.scope) po->add_scope(a);
    if (o.new_ranks == NewRankRule::kDerive) po->set_new_ranks("derive");
    po->set_bytes(o.bytes);
  }
  return w;
}

absl::StatusOr<ModelSpec> SpecFromJson(absl::string_view json) {
  proto::LayoutSpec w;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      std::string(json), &w, options);
  if (!status.ok()) {
    return Bad("the layout spec is not valid JSON of a LayoutSpec: ",
               status.ToString());
  }
  return SpecFromProto(w);
}

std::string SpecToJson(const ModelSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(SpecToProto(spec), &out,
                                                    options);
  return out;
}

}  // namespace ptc
