#include "tools/ptcctl/layout_command.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/args.h"
#include "common/json_writer.h"
#include "common/status_macros.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "tools/internal/cli.h"
#include "tools/internal/format.h"
#include "tools/internal/layout_file.h"

namespace ptc::tools {
namespace {

const char kLayoutUsage[] =
    R"(usage: ptcctl layout check FILE [--config CONFIG] [--json]
       ptcctl layout show (FILE | --model MODEL) --config CONFIG [--rank R] [--json]
       ptcctl layout export --model MODEL

export prints a built-in model's spec as a JSON layout spec (to edit, or
       to register with --layout).

check  reads a JSON layout spec and validates every field; with --config
       (e.g. pp=2,dp=2,ep=4,tp=2) also that the spec can run with it and
       what each rank then holds. No cluster is needed.
show   per tensor, how it is cut on each axis; per rank, what it holds
       (--rank: that rank's regions, tensor by tensor).

  --model   a built-in model instead of a file (gpt3-175b, mixtral-8x7b, ...)
  --json    one JSON document on stdout
)";

struct Loaded {
  ModelSpec spec;
  std::optional<ParallelConfig> config;
  std::optional<Layout> layout;
};

absl::StatusOr<Loaded> Load(const Args& args, bool need_config) {
  const std::vector<std::string>& pos = args.positional();
  const std::string file = pos.size() > 1 ? pos[1] : "";
  Loaded l;
  PTC_ASSIGN_OR_RETURN(l.spec, SpecFromOptions(file, args.Get("model")));
  if (!args.Has("config")) {
    if (need_config)
      return absl::InvalidArgumentError("missing required option --config");
    return l;
  }
  PTC_ASSIGN_OR_RETURN(l.config, l.spec.ParseConfig(args.Get("config")));
  PTC_ASSIGN_OR_RETURN(l.layout, BuildLayout(l.spec, *l.config));
  return l;
}

std::string Cuts(const TensorSpec& t, const ModelSpec& spec) {
  const TensorSpec& rules = t.slot >= 0 ? spec.tensors[t.slot] : t;
  std::vector<std::string> parts;
  for (const AxisPlacement& p : rules.placements) parts.push_back(p.ToString());
  if (parts.empty()) parts.push_back("replicated");
  std::string s = absl::StrJoin(parts, "; ");
  if (t.buffer >= 0) {
    absl::StrAppend(&s, "; flat in buffer '", spec.buffers[t.buffer].name, "'");
  }
  return absl::StrCat(s, "; ", rules.stage.ToString());
}

void PrintText(const Loaded& l, int rank) {
  const ModelSpec& spec = l.spec;
  std::cout << absl::StrFormat(
      "spec %s: mesh %s, %d layers, %d tensors (%s), %d flat buffers, %d "
      "small objects\n",
      spec.name, absl::StrJoin(spec.mesh, ","), spec.num_layers,
      spec.tensors.size(), HumanBytes(spec.TotalBytes()), spec.buffers.size(),
      spec.small_objects.size());
  if (!l.layout) {
    std::cout << "valid (give --config to check a parallel config)\n";
    return;
  }
  const Layout& layout = *l.layout;
  std::cout << absl::StrFormat("config %s: %d ranks\n", l.config->ToString(),
                               layout.world_size());
  if (rank >= 0) {
    std::cout << absl::StrFormat("rank %d (%s) holds %s:\n", rank,
                                 l.config->CoordString(l.config->CoordOf(rank)),
                                 HumanBytes(layout.RankBytes(spec, rank)));
    for (int t = 0; t < layout.num_tensors(); ++t) {
      std::vector<std::string> regions;
      for (const Shard& s : layout.shards(t)) {
        if (s.rank == rank) regions.push_back(s.region.ToString());
      }
      if (regions.empty()) continue;
      std::cout << "  " << spec.tensors[t].key << " "
                << absl::StrJoin(regions, " ") << "\n";
    }
    return;
  }
  std::cout << "tensors:\n";
  for (const TensorSpec& t : spec.tensors) {
    std::cout << absl::StrFormat("  %-44s %-9s [%s]  %s\n", t.key,
                                 DTypeName(t.dtype), absl::StrJoin(t.shape, ","),
                                 Cuts(t, spec));
  }
  std::cout << "ranks:\n";
  for (int r = 0; r < layout.world_size(); ++r) {
    std::cout << absl::StrFormat("  rank %-5d %-28s %s\n", r,
                                 l.config->CoordString(l.config->CoordOf(r)),
                                 HumanBytes(layout.RankBytes(spec, r)));
  }
}

void PrintJson(const Loaded& l, int rank) {
  const ModelSpec& spec = l.spec;
  JsonWriter w;
  w.BeginObject().Key("name").String(spec.name).Key("mesh").BeginArray();
  for (const std::string& a : spec.mesh) w.String(a);
  w.EndArray().Key("num_layers").Int(spec.num_layers);
  w.Key("state_bytes").Int(spec.TotalBytes()).Key("valid").Bool(true);
  w.Key("tensors").BeginArray();
  for (const TensorSpec& t : spec.tensors) {
    w.BeginObject().Key("key").String(t.key).Key("dtype").String(
        DTypeName(t.dtype));
    w.Key("shape").BeginArray();
    for (int64_t e : t.shape) w.Int(e);
    w.EndArray().Key("cut").String(Cuts(t, spec)).EndObject();
  }
  w.EndArray();
  if (l.layout) {
    const Layout& layout = *l.layout;
    w.Key("config").String(l.config->ToString());
    w.Key("ranks").BeginArray();
    for (int r = 0; r < layout.world_size(); ++r) {
      if (rank >= 0 && r != rank) continue;
      w.BeginObject().Key("rank").Int(r).Key("coord").String(
          l.config->CoordString(l.config->CoordOf(r)));
      w.Key("bytes").Int(layout.RankBytes(spec, r));
      if (rank >= 0) {
        w.Key("regions").BeginArray();
        for (int t = 0; t < layout.num_tensors(); ++t) {
          for (const Shard& s : layout.shards(t)) {
            if (s.rank != r) continue;
            w.BeginObject().Key("tensor").String(spec.tensors[t].key);
            w.Key("region").String(s.region.ToString()).EndObject();
          }
        }
        w.EndArray();
      }
      w.EndObject();
    }
    w.EndArray();
  }
  w.EndObject();
  std::cout << w.str() << "\n";
}

}  // namespace

int RunLayoutCommand(int argc, const char* const* argv) {
  auto args = Args::Parse(argc, argv, 2, {"config", "model", "rank", "coordinator"},
                          {"json", "help"});
  if (args.ok() && args->Flag("help")) {
    std::cout << kLayoutUsage;
    return 0;
  }
  const bool json = args.ok() && args->Flag("json");
  auto fail = [&](const absl::Status& status, int code) {
    return Fail("ptcctl layout", status, code, json, kLayoutUsage);
  };
  if (!args.ok()) return fail(args.status(), 2);
  const std::vector<std::string>& pos = args->positional();
  const std::string sub = pos.empty() ? "" : pos[0];
  if (sub != "check" && sub != "show" && sub != "export") {
    return fail(absl::InvalidArgumentError(
                    "missing required option: say check, show or export"),
                2);
  }
  if (sub == "export") {
    auto spec = SpecFromOptions("", args->Get("model"));
    if (!spec.ok()) return fail(spec.status(), 1);
    std::cout << SpecToJson(*spec) << "\n";
    return 0;
  }
  int rank = -1;
  if (args->Has("rank") && (!absl::SimpleAtoi(args->Get("rank"), &rank) ||
                            rank < 0)) {
    return fail(absl::InvalidArgumentError("--rank needs a rank number"), 2);
  }
  auto loaded = Load(*args, sub == "show");
  if (!loaded.ok()) {
    const bool usage = absl::StartsWith(loaded.status().message(), "missing");
    return fail(loaded.status(), usage ? 2 : 1);
  }
  if (rank >= 0 && (!loaded->layout || rank >= loaded->layout->world_size())) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--rank ", rank, " is not a rank of the config")),
                2);
  }
  if (json) {
    PrintJson(*loaded, rank);
  } else {
    PrintText(*loaded, rank);
  }
  return 0;
}

}  // namespace ptc::tools
