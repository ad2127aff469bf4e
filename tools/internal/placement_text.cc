#include "tools/internal/placement_text.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace ptc::tools {

// {"strategy", "ranks": [{"rank", "host", "gpu"}], "released_hosts",
// "survival", "survives_host_loss"}.
void WritePlacement(const proto::PlanSummary& p, JsonWriter* w) {
  w->BeginObject().Key("strategy").String(p.placement());
  w->Key("ranks").BeginArray();
  for (int r = 0; r < p.rank_hosts_size(); ++r) {
    w->BeginObject().Key("rank").Int(r).Key("host").String(p.rank_hosts(r));
    w->Key("gpu").Int(r < p.rank_devices_size() ? p.rank_devices(r) : -1);
    w->EndObject();
  }
  w->EndArray().Key("released_hosts").BeginArray();
  for (const std::string& h : p.released_hosts()) w->String(h);
  w->EndArray();
  w->Key("survival").String(p.survival());
  w->Key("survives_host_loss").Bool(p.survives_host_loss());
  w->EndObject();
}

// "ranks 0-3" / "ranks 0, 2, 4" of a sorted list.
std::string Spans(const std::vector<int>& v) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(v[i]) : absl::StrCat(v[i], "-", v[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string FormatPlacement(const proto::PlanSummary& p, int max_hosts) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::vector<int>, std::vector<int>>> on;
  for (int r = 0; r < p.rank_hosts_size(); ++r) {
    auto [it, fresh] = on.try_emplace(p.rank_hosts(r));
    if (fresh) order.push_back(p.rank_hosts(r));
    it->second.first.push_back(r);
    if (r < p.rank_devices_size()) it->second.second.push_back(p.rank_devices(r));
  }
  std::string out = absl::StrFormat("  placement (%s):\n", p.placement());
  for (size_t i = 0; i < order.size(); ++i) {
    if (max_hosts > 0 && static_cast<int>(i) == max_hosts && order.size() > i + 1) {
      absl::StrAppend(&out, "    ... and ", order.size() - i,
                      " more hosts (--json or --out list every rank)\n");
      break;
    }
    const std::string& h = order[i];
    auto& [ranks, gpus] = on[h];
    std::vector<int> sorted_gpus = gpus;
    std::sort(sorted_gpus.begin(), sorted_gpus.end());
    absl::StrAppend(&out, "    ", h, ": ranks ", Spans(ranks), " on GPUs ",
                    Spans(sorted_gpus), "\n");
  }
  if (p.released_hosts_size() > 0) {
    const int n = p.released_hosts_size();
    const int shown = max_hosts > 0 ? std::min(n, 2 * max_hosts) : n;
    absl::StrAppend(&out, "    released (no rank there): ",
                    absl::StrJoin(p.released_hosts().begin(),
                                  p.released_hosts().begin() + shown, ", "),
                    shown < n ? absl::StrCat(" and ", n - shown, " more") : "",
                    "\n");
  }
  if (!p.survival().empty()) absl::StrAppend(&out, "    ", p.survival(), "\n");
  return out;
}

absl::StatusOr<proto::PlacementOptions> PlacementFlags(const Args& args) {
  proto::PlacementOptions o;
  const std::string how = args.Get("placement");
  if (how.empty() || how == "ptc" || how == "contiguous") {
    o.set_strategy(how == "contiguous" ? proto::PLACEMENT_CONTIGUOUS
                                       : proto::PLACEMENT_PTC);
  } else {
    PTC_ASSIGN_OR_RETURN(const std::optional<std::string> file,
                         ReadFileIfExists(how));
    if (!file) {
      return absl::NotFoundError(absl::StrCat(
          "--placement: '", how, "' is neither ptc, contiguous nor a file"));
    }
    const std::string& text = *file;
    o.set_strategy(proto::PLACEMENT_EXPLICIT);
    int line_no = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++line_no;
      line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
      if (line.empty()) continue;
      std::vector<std::string> f =
          absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
      int gpu = -1;
      if (f.size() != 2 || !absl::SimpleAtoi(f[1], &gpu) || gpu < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            how, ":", line_no, ": expected \"HOST GPU\" (one line per rank, in "
            "rank order), got \"", line, "\""));
      }
      o.add_rank_hosts(f[0]);
      o.add_rank_devices(gpu);
    }
  }
  for (absl::string_view a :
       absl::StrSplit(args.Get("colocate"), ',', absl::SkipEmpty())) {
    o.add_colocate(std::string(a));
  }
  o.set_prefer_movement(args.Flag("prefer-movement"));
  return o;
}

}  // namespace ptc::tools
