// A small streaming JSON writer for machine-readable CLI output and plans.
// Integers are written as JSON numbers (protobuf's JSON mapping writes int64
// as strings, which scripts must then convert).
//
//   JsonWriter w;
//   w.BeginObject();
//   w.Key("cross_host_bytes").Int(1 << 20);
//   w.Key("hosts").BeginArray().String("h0").String("h1").EndArray();
//   w.EndObject();
//   std::cout << w.str();
#ifndef PTC_COMMON_JSON_WRITER_H_
#define PTC_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ptc {

class JsonWriter {
 public:
  // `indent` > 0 pretty-prints with that many spaces per level.
  explicit JsonWriter(int indent = 0) : indent_(indent) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();
  void NewLine();

  int indent_;
  std::string out_;
  // One entry per open container: number of elements written so far.
  std::vector<int> counts_;
  bool after_key_ = false;
};

// Escapes `s` as the inside of a JSON string literal.
std::string JsonEscape(absl::string_view s);

}  // namespace ptc

#endif  // PTC_COMMON_JSON_WRITER_H_
