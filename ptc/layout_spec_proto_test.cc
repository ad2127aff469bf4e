#include "ptc/layout_spec_proto.h"

#include <catch2/catch.hpp>
#include <functional>

#include "ptc/families.h"
#include "ptc/layout.h"

namespace ptc {
namespace {

TEST_CASE("layout spec: built-in specs survive JSON and give the same layout",
          "[ptc][layout_spec]") {
  for (const char* model :
       {"gpt:layers=2,hidden=16,heads=4,vocab=50,positions=8",
        "gpt:layers=2,hidden=16,heads=4,vocab=50,positions=8,mcore=1,"
        "bucket=300",
        "llama:layers=3,hidden=32,heads=8,kv_heads=4,ffn=40,vocab=77,mcore=1,"
        "bucket=300",
        "moe:layers=2,hidden=16,heads=4,kv_heads=2,ffn=12,experts=4,"
        "shared_ffn=8,stacked=0"}) {
    INFO(model);
    auto spec = SpecForModel(model);
    REQUIRE(spec.ok());
    auto back = SpecFromJson(SpecToJson(*spec));
    REQUIRE(back.ok());
    REQUIRE(back->tensors.size() == spec->tensors.size());
    for (const char* config : {"tp=2,pp=2,dp=2,zero=1", "tp=1,pp=1,dp=3"}) {
      auto c = spec->ParseConfig(config);
      REQUIRE(c.ok());
      auto a = BuildLayout(*spec, *c);
      auto b = BuildLayout(*back, *c);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      for (int t = 0; t < a->num_tensors(); ++t) {
        REQUIRE(a->shards(t).size() == b->shards(t).size());
        for (size_t i = 0; i < a->shards(t).size(); ++i) {
          CHECK(a->shards(t)[i].rank == b->shards(t)[i].rank);
          CHECK(a->shards(t)[i].region == b->shards(t)[i].region);
        }
      }
    }
  }
}

proto::LayoutSpec Small() {
  proto::LayoutSpec w;
  w.set_name("small");
  proto::TensorLayout* t = w.add_tensors();
  t->set_key("w");
  t->set_dtype("float32");
  t->add_shape(8);
  t->add_shape(4);
  proto::PlacementLayout* p = t->add_placements();
  p->add_axes("tp");
  p->set_kind("shard");
  return w;
}

TEST_CASE("layout spec: hostile fields get INVALID_ARGUMENT naming them",
          "[ptc][layout_spec]") {
  REQUIRE(SpecFromProto(Small()).ok());
  struct Case {
    const char* what;
    std::function<void(proto::LayoutSpec*)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"huge extent", [](auto* w) { w->mutable_tensors(0)->set_shape(0, int64_t{1} << 62); },
       "extents are 0 to 2^48"},
      {"overflowing product",
       [](auto* w) {
         w->mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
         w->mutable_tensors(0)->set_shape(1, int64_t{1} << 40);
       },
       "more than 2^48 elements"},
      {"rank 9", [](auto* w) {
         for (int i = 0; i < 7; ++i) w->mutable_tensors(0)->add_shape(1);
       }, "at most 8 dimensions"},
      {"negative dim", [](auto* w) {
         w->mutable_tensors(0)->mutable_placements(0)->set_dim(-1);
       }, "dimension -1 does not exist"},
      {"unknown dtype", [](auto* w) { w->mutable_tensors(0)->set_dtype("float128"); },
       "float128"},
      {"empty key", [](auto* w) { w->mutable_tensors(0)->set_key(""); },
       "tensor key"},
      {"axis twice", [](auto* w) {
         w->mutable_tensors(0)->mutable_placements(0)->add_axes("tp");
       }, "names axis 'tp' twice"},
      {"layer out of range", [](auto* w) {
         w->mutable_tensors(0)->mutable_stage()->set_kind("layer");
         w->mutable_tensors(0)->mutable_stage()->set_layer(7);
       }, "belongs to layer 7"},
      {"mesh axis twice", [](auto* w) {
         w->add_mesh("tp");
         w->add_mesh("tp");
       }, "listed twice"},
      {"bad mesh name", [](auto* w) { w->add_mesh("Tensor Parallel"); },
       "must be 1-32 characters"},
      {"newer format", [](auto* w) { w->set_format_version(2); },
       "format_version 2"},
      {"negative layers", [](auto* w) { w->set_num_layers(-3); },
       "num_layers -3"},
      {"buffer over pp", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("pp");
         b->add_entries()->set_tensor("w");
       }, "cannot shard over the pipeline axis"},
      {"entry cut by the buffer's axis", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("tp");
         b->add_entries()->set_tensor("w");
       }, "must be whole on the buffer's axes"},
      {"join an unknown buffer", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("dp");
         b->add_entries()->set_tensor("w");
         b->set_join("nope");
         b->add_join_when_size_one("tp");
       }, "join 'nope' is not a buffer"},
      {"join without axes", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("dp");
         b->add_entries()->set_tensor("w");
         auto* c = w->add_buffers();
         c->set_name("c");
         c->add_axes("dp");
         auto* t = w->add_tensors();
         t->set_key("v");
         t->set_dtype("float32");
         c->add_entries()->set_tensor("v");
         b->set_join("c");
       }, "join needs join_when_size_one"},
      {"join_before not in the joined buffer", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("dp");
         auto* e = b->add_entries();
         e->set_tensor("w");
         e->set_join_before("w");
       }, "names join_before but the buffer joins none"},
      {"with_padding without a padded shard", [](auto* w) {
         auto* b = w->add_buffers();
         b->set_name("b");
         b->add_axes("dp");
         auto* e = b->add_entries();
         e->set_tensor("w");
         e->set_with_padding(true);
       }, "is with_padding but is not cut on dimension 0"},
      {"unknown buffer", [](auto* w) { w->mutable_tensors(0)->set_buffer("nope"); },
       "names buffer 'nope'"},
      {"scope axis unknown", [](auto* w) {
         auto* o = w->add_small_objects();
         o->set_name("rng");
         o->add_scope("ep");
       }, "scope axis 'ep'"},
      {"bad new-rank rule", [](auto* w) {
         auto* o = w->add_small_objects();
         o->set_name("rng");
         o->set_new_ranks("clone");
       }, "new_ranks 'clone'"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    proto::LayoutSpec w = Small();
    c.mutate(&w);
    auto spec = SpecFromProto(w);
    REQUIRE(!spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(spec.status().message().find(c.message) != std::string::npos);
  }
}

}  // namespace
}  // namespace ptc
