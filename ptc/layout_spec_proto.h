// Layout specs on the wire and on disk: ModelSpec <-> proto::LayoutSpec,
// and the same content as JSON (proto3's JSON mapping with the field names
// of proto/layout_spec.proto).
//
//   PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromJson(ReadFile(path)));
//   proto::LayoutSpec wire = SpecToProto(spec);
#ifndef PTC_PTC_LAYOUT_SPEC_PROTO_H_
#define PTC_PTC_LAYOUT_SPEC_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/layout_spec.pb.h"
#include "ptc/model_spec.h"

namespace ptc {

// At most this many tensors in one spec.
inline constexpr int kMaxSpecTensors = 1 << 20;

// Reads and validates a spec: every unknown name, out-of-range number or
// inconsistency is INVALID_ARGUMENT naming the tensor, buffer or field.
absl::StatusOr<ModelSpec> SpecFromProto(const proto::LayoutSpec& wire);
proto::LayoutSpec SpecToProto(const ModelSpec& spec);

absl::StatusOr<ModelSpec> SpecFromJson(absl::string_view json);
// Pretty-printed, field names as in the proto.
std::string SpecToJson(const ModelSpec& spec);

}  // namespace ptc

#endif  // PTC_PTC_LAYOUT_SPEC_PROTO_H_
