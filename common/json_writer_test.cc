#include "common/json_writer.h"

#include <catch2/catch.hpp>

namespace ptc {
namespace {

TEST_CASE("json writer: nested objects and arrays are well formed",
          "[common]") {
  JsonWriter w;
  w.BeginObject();
  w.Key("a").Int(-5);
  w.Key("b").BeginArray().String("x\"y").Bool(true).Null().EndArray();
  w.Key("c").BeginObject().EndObject();
  w.Key("d").BeginArray().EndArray();
  w.Key("e").Double(0.5);
  w.EndObject();
  CHECK(w.str() == R"({"a":-5,"b":["x\"y",true,null],"c":{},"d":[],"e":0.5})");
}

TEST_CASE("json writer: control characters are escaped", "[common]") {
  CHECK(JsonEscape("a\nb\x01") == "a\\nb\\u0001");
}

TEST_CASE("json writer: pretty printing indents each level", "[common]") {
  JsonWriter w(2);
  w.BeginObject().Key("k").BeginArray().Int(1).Int(2).EndArray().EndObject();
  CHECK(w.str() == "{\n  \"k\": [\n    1,\n    2\n  ]\n}");
}

}  // namespace
}  // namespace ptc
