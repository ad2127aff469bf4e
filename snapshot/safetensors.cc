#include "snapshot/safetensors.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/json_writer.h"

namespace ptc {

absl::string_view SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat8E4M3:
      return "F8_E4M3";
    case DType::kFloat8E5M2:
      return "F8_E5M2";
    case DType::kInt8:
      return "I8";
    case DType::kInt16:
      return "I16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kUInt8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kRaw:
      return "U8";
  }
  return "U8";
}

absl::StatusOr<std::string> SafetensorsHeader(
    std::vector<SafetensorsEntry>* entries,
    const std::map<std::string, std::string>& metadata) {
  std::set<absl::string_view> names;
  JsonWriter w;
  w.BeginObject();
  if (!metadata.empty()) {
    w.Key("__metadata__");
    w.BeginObject();
    for (const auto& [k, v] : metadata) w.Key(k).String(v);
    w.EndObject();
  }
  int64_t offset = 0;
  for (SafetensorsEntry& e : *entries) {
    if (e.name.empty() || e.name.rfind("__", 0) == 0 ||
        !names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors tensor name '", e.name,
                       "' is empty, reserved (\"__\") or used twice"));
    }
    const int64_t bytes = NumElements(e.shape) * ElementSize(e.dtype);
    e.begin = offset;
    e.end = offset + bytes;
    offset = e.end;
    w.Key(e.name);
    w.BeginObject();
    w.Key("dtype").String(SafetensorsDType(e.dtype));
    w.Key("shape");
    w.BeginArray();
    // A raw tensor is bytes: its shape is its byte count.
    if (e.dtype == DType::kRaw) {
      w.Int(bytes);
    } else {
      for (int64_t d : e.shape) w.Int(d);
    }
    w.EndArray();
    w.Key("data_offsets");
    w.BeginArray();
    w.Int(e.begin);
    w.Int(e.end);
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  std::string json = w.str();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

absl::StatusOr<SafetensorsIndex> ParseSafetensorsHeader(absl::string_view bytes,
                                                        int64_t file_size) {
  if (bytes.size() < 8) {
    return absl::DataLossError("shorter than a safetensors header (8 bytes)");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  constexpr uint64_t kMaxHeader = 100'000'000;
  if (n > kMaxHeader || 8 + n > static_cast<uint64_t>(file_size)) {
    return absl::DataLossError(absl::StrCat("safetensors header length ", n,
                                            " does not fit the file (",
                                            file_size, " bytes)"));
  }
  if (bytes.size() < 8 + n) {
    return absl::InvalidArgumentError("the header's bytes were not all given");
  }
  google::protobuf::Struct root;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      std::string(bytes.substr(8, n)), &root);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat(
        "the safetensors header is not a JSON object: ", parsed.ToString()));
  }
  SafetensorsIndex out;
  out.data_start = static_cast<int64_t>(8 + n);
  const int64_t data_bytes = file_size - out.data_start;
  for (const auto& [name, value] : root.fields()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : value.struct_value().fields())
        out.metadata[k] = v.string_value();
      continue;
    }
    const auto& f = value.struct_value().fields();
    auto get = [&](const char* k) -> const google::protobuf::Value* {
      auto it = f.find(k);
      return it == f.end() ? nullptr : &it->second;
    };
    const auto* dtype = get("dtype");
    const auto* shape = get("shape");
    const auto* offsets = get("data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr ||
        offsets->list_value().values_size() != 2) {
      return absl::DataLossError(absl::StrCat(
          "tensor '", name, "' lacks dtype, shape or two data_offsets"));
    }
    SafetensorsIndex::Tensor t;
    t.dtype = dtype->string_value();
    for (const auto& d : shape->list_value().values()) {
      if (d.number_value() < 0 || d.number_value() > 9.0e15) {
        return absl::DataLossError(
            absl::StrCat("tensor '", name, "' has a bad shape"));
      }
      t.shape.push_back(static_cast<int64_t>(d.number_value()));
    }
    t.begin =
        static_cast<int64_t>(offsets->list_value().values(0).number_value());
    t.end =
        static_cast<int64_t>(offsets->list_value().values(1).number_value());
    if (t.begin < 0 || t.end < t.begin || t.end > data_bytes) {
      return absl::DataLossError(absl::StrCat(
          "tensor '", name, "' has data offsets [", t.begin, ", ", t.end,
          ") outside the file's ", data_bytes, " data bytes"));
    }
    out.tensors[name] = std::move(t);
  }
  return out;
}

}  // namespace ptc
