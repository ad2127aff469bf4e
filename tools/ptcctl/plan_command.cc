#include "tools/ptcctl/plan_command.h"

#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/json_writer.h"
#include "common/status_macros.h"
#include "plan/job_placement.h"
#include "plan/plan_json.h"
#include "plan/plan_scenario.h"
#include "plan/plan_svg.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "proto/enum_names.h"
#include "tools/internal/cli.h"
#include "tools/internal/format.h"
#include "tools/internal/layout_file.h"
#include "tools/internal/placement_text.h"

namespace ptc::tools {

const char kPlanUsage[] =
    R"(usage: ptcctl plan (--model MODEL | --layout FILE) --from CONFIG --to CONFIG --hosts NxG
                   [--to-hosts NxG] [--dead-hosts LIST] [--link-gbps GBPS]
                   [--placement ptc|contiguous|FILE] [--colocate AXES]
                   [--prefer-movement]
                   [--baseline tenplex [--baseline-out FILE]] [--json] [--out FILE]
                   [--svg FILE] [--html FILE]

Shows how a job's state would move from one parallel layout to another:
bytes kept in place, copied within hosts and sent across hosts (with the
lower bound), the largest per-host send (with its lower bound), pieces
and planning time. Nothing is sent; no daemon is contacted.

  --model       gpt3-125m ... gpt3-175b, llama2-7b, llama2-70b, llama3-8b,
                llama3-70b, llama3-405b, mixtral-8x7b, mixtral-8x22b, deepseek-moe-16b,
                moe-64x-136b, or a custom "gpt:layers=..,hidden=..,heads=.."
                (also llama:..., moe:...,experts=..)
  --layout      a JSON layout spec file instead (docs/layout-spec.md)
  --from, --to  parallel configs for the spec's mesh axes, e.g.
                tp=4,pp=2,dp=1 or ep=4,tp=2 (also zero=1,
                layers=10/14, order=tp-dp-pp)
  --hosts       the job's current hosts: N hosts with G GPUs (host0..)
  --to-hosts    the hosts the change may use (default: --hosts); the
                first hosts are the current ones, the rest join; the ptc
                placement releases those it does not need
  --dead-hosts  hosts that died: ids or names, e.g. 2 or 3,5-7 or host4;
                they are neither sources nor targets
  --link-gbps   every host's link, gigabits per second (default 200)
  --placement   where the target ranks run: ptc (default) chooses the hosts
                and GPUs that make the change shortest and then move the
                fewest bytes, as the coordinator does; contiguous fills the
                target hosts in order; FILE gives "HOST GPU" per rank
  --colocate    axes whose groups must share a host (default tp where a
                tp group fits a host; none for no constraint)
  --prefer-movement
                the ptc placement's shortest change and fewest bytes before
                recoverability (by default a placement whose hosts' loss
                leaves a copy of every region wins first)
  --baseline    also plan as Tenplex does (replica 0, per rank) and compare
  --json        print a JSON object instead of text
  --out FILE    write the whole plan (layouts, hosts, every transfer) as JSON
  --baseline-out FILE
                write the baseline's whole plan the same way
  --svg FILE    draw the plan: bytes from each host to each (a matrix;
                the diagonal stays on its host), and the ranks' hosts
                before and after
  --html FILE   the same picture in a page, with the per-host table
                (no script, nothing fetched: open it anywhere)
)";

namespace {

absl::StatusOr<std::pair<int, int>> ParseHosts(const std::string& text,
                                               const char* option) {
  std::vector<std::string> parts = absl::StrSplit(text, 'x');
  int n = 0, g = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n) ||
      !absl::SimpleAtoi(parts[1], &g) || n < 1 || g < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", option, " '", text, "' should be HOSTSxGPUS, e.g. 4x8"));
  }
  return std::make_pair(n, g);
}

absl::StatusOr<std::set<int>> ParseHostList(const std::string& text,
                                            const Cluster& cluster) {
  std::set<int> out;
  const int n = static_cast<int>(cluster.hosts.size());
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int id = cluster.FindHost(item);
    if (id >= 0) {
      out.insert(id);
      continue;
    }
    std::vector<std::string> range = absl::StrSplit(item, '-');
    int lo, hi;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      hi = lo;
    } else if (range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) ||
               !absl::SimpleAtoi(range[1], &hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dead-hosts: '", item,
                       "' is neither a host name, an id nor a range like 3-5"));
    }
    if (lo < 0 || hi >= n || lo > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dead-hosts: '", item,
                       "' is outside the cluster's hosts 0-", n - 1));
    }
    for (int h = lo; h <= hi; ++h) out.insert(h);
  }
  return out;
}

struct PlanRun {
  PlanScenario scenario;
  proto::PlanSummary placement;
  Plan plan;
  std::optional<Plan> baseline;
};

absl::StatusOr<PlanRun> Build(const Args& args) {
  PTC_ASSIGN_OR_RETURN(ModelSpec spec,
                       SpecFromOptions(args.Get("layout"), args.Get("model")));
  PTC_ASSIGN_OR_RETURN(std::string from, args.Required("from"));
  PTC_ASSIGN_OR_RETURN(std::string to, args.Required("to"));
  PTC_ASSIGN_OR_RETURN(std::string hosts_text, args.Required("hosts"));
  PTC_ASSIGN_OR_RETURN(auto from_hosts, ParseHosts(hosts_text, "hosts"));
  PTC_ASSIGN_OR_RETURN(
      auto to_hosts, ParseHosts(args.Get("to-hosts", hosts_text), "to-hosts"));
  if (to_hosts.second != from_hosts.second) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hosts has ", from_hosts.second, " GPUs per host but --to-hosts has ",
        to_hosts.second, "; ptcctl plan models hosts of one size"));
  }
  double gbps = 200;
  if (args.Has("link-gbps") &&
      (!absl::SimpleAtod(args.Get("link-gbps"), &gbps) || gbps <= 0)) {
    return absl::InvalidArgumentError("--link-gbps needs a positive number");
  }
  Cluster cluster = Cluster::Uniform(std::max(from_hosts.first, to_hosts.first),
                                     from_hosts.second, gbps * 1e9 / 8);
  std::vector<bool> alive(cluster.hosts.size(), true);
  if (args.Has("dead-hosts")) {
    PTC_ASSIGN_OR_RETURN(std::set<int> dead,
                         ParseHostList(args.Get("dead-hosts"), cluster));
    for (int h : dead) alive[h] = false;
  }
  std::vector<int> source, target;
  for (int h = 0; h < from_hosts.first; ++h) source.push_back(h);
  for (int h = 0; h < to_hosts.first; ++h) {
    if (alive[h]) target.push_back(h);
  }
  const std::string baseline = args.Get("baseline");
  if (!baseline.empty() && baseline != "tenplex") {
    return absl::InvalidArgumentError(
        absl::StrCat("--baseline '", baseline,
                     "' is unknown; the one baseline is 'tenplex'"));
  }
  PTC_ASSIGN_OR_RETURN(const proto::PlacementOptions placement,
                       PlacementFlags(args));
  PlanRun run;
  PTC_ASSIGN_OR_RETURN(run.scenario,
                       MakePlanScenario(std::move(spec), from, source, to, target,
                                        std::move(cluster), alive));
  PTC_RETURN_IF_ERROR(PlaceScenarioTarget(&run.scenario, placement, target));
  std::vector<std::string> names;
  for (const Host& h : run.scenario.cluster.hosts) names.push_back(h.name);
  SetPlacementSummary(run.scenario.placement, run.scenario.placement_strategy,
                      names, &run.placement);
  const absl::Time start = absl::Now();
  PTC_ASSIGN_OR_RETURN(run.plan, PlanReconfiguration(run.scenario.input()));
  run.plan.summary.plan_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  PTC_RETURN_IF_ERROR(
      Annotate(ValidatePlan(run.scenario.input(), run.plan),
               "the planner produced a plan that does not validate"));
  if (!baseline.empty()) {
    const absl::Time b = absl::Now();
    PTC_ASSIGN_OR_RETURN(run.baseline,
                         PlanTenplexBaseline(run.scenario.input()));
    run.baseline->summary.plan_seconds = absl::ToDoubleSeconds(absl::Now() - b);
  }
  return run;
}

void PrintText(const PlanRun& run) {
  const PlanScenario& s = run.scenario;
  const PlanSummary& p = run.plan.summary;
  int dead = 0;
  for (bool a : s.alive) dead += !a;
  std::cout << absl::StrFormat(
      "Plan for %s (%s of state with Adam): %s on %d ranks -> %s on %d ranks\n",
      s.spec.name, HumanBytes(s.spec.TotalBytes()),
      s.source().config()->ToString(), s.source().world_size(),
      s.target().config()->ToString(), s.target().world_size());
  std::cout << absl::StrFormat(
      "hosts: %d in the cluster, %d dead, link %s/s each\n\n",
      s.cluster.hosts.size(), dead, HumanBytes(s.cluster.hosts[0].bandwidth));
  const PlanSummary* b = run.baseline ? &run.baseline->summary : nullptr;
  auto row = [&](const char* name, const std::string& ours,
                 const std::string& theirs) {
    std::cout << absl::StrFormat("  %-26s %-34s %s\n", name, ours,
                                 b ? theirs : "");
  };
  row("", "ptc", "tenplex-style baseline");
  row("state on target hosts", HumanBytes(p.target_bytes),
      b ? HumanBytes(b->target_bytes) : "");
  row("kept in place", HumanBytes(p.kept_in_place_bytes), b ? "-" : "");
  row("copied within hosts", HumanBytes(p.copied_within_host_bytes),
      b ? HumanBytes(b->copied_within_host_bytes) : "");
  row("sent across hosts",
      absl::StrCat(HumanBytes(p.cross_host_bytes), " (bound ",
                   HumanBytes(p.cross_host_bytes_lower_bound), ")"),
      b ? absl::StrCat(HumanBytes(b->cross_host_bytes), " (",
                       PercentOver(b->cross_host_bytes, p.cross_host_bytes),
                       ")")
        : "");
  row("largest send of a host",
      absl::StrCat(
          HumanBytes(p.max_host_send_bytes), " (bound ",
          HumanBytes(p.max_host_send_bytes_lower_bound), ", ",
          PercentOver(p.max_host_send_bytes, p.max_host_send_bytes_lower_bound),
          ")"),
      b ? absl::StrCat(
              HumanBytes(b->max_host_send_bytes), " (",
              PercentOver(b->max_host_send_bytes, p.max_host_send_bytes), ")")
        : "");
  row("  at link speed", HumanSeconds(p.max_host_send_seconds),
      b ? HumanSeconds(b->max_host_send_seconds) : "");
  row("shared by ranks on a host", HumanBytes(p.dedup_saved_bytes),
      b ? "0 B" : "");
  row("pieces", absl::StrCat(p.transfers), b ? absl::StrCat(b->transfers) : "");
  row("placement time", HumanSeconds(s.placement_seconds), "");
  row("plan time", HumanSeconds(p.plan_seconds),
      b ? HumanSeconds(b->plan_seconds) : "");
  std::cout << "\n" << FormatPlacement(run.placement, /*max_hosts=*/8);
  std::cout << "\nvalidated: every target region covered exactly once, every "
               "piece held "
               "by its live source host\n";
}

void PrintJson(const PlanRun& run) {
  const PlanScenario& s = run.scenario;
  JsonWriter w(2);
  w.BeginObject();
  w.Key("model").String(s.spec.name);
  w.Key("state_bytes").Int(s.spec.TotalBytes());
  w.Key("from").String(s.source().config()->ToString());
  w.Key("to").String(s.target().config()->ToString());
  w.Key("validated").Bool(true);
  w.Key("placement_seconds").Double(s.placement_seconds);
  w.Key("placement");
  WritePlacement(run.placement, &w);
  w.Key("summary");
  WritePlanSummary(run.plan.summary, s.cluster, &w);
  if (run.baseline) {
    w.Key("baseline")
        .BeginObject()
        .Key("strategy")
        .String(StrategyName(run.baseline->strategy));
    w.Key("summary");
    WritePlanSummary(run.baseline->summary, s.cluster, &w);
    w.EndObject();
  }
  w.EndObject();
  std::cout << w.str() << "\n";
}

}  // namespace

int RunPlanCommand(int argc, const char* const* argv) {
  auto args = Args::Parse(argc, argv, 2,
                          {"model", "layout", "from", "to", "hosts", "to-hosts",
                           "dead-hosts", "link-gbps", "placement", "colocate",
                           "baseline", "out", "baseline-out", "svg", "html"},
                          {"json", "help", "prefer-movement"});
  if (args.ok() && args->Flag("help")) {
    std::cout << kPlanUsage;
    return 0;
  }
  const bool json = args.ok() && args->Flag("json");
  auto fail = [&](const absl::Status& status, int code) {
    return Fail("ptcctl plan", status, code, json, kPlanUsage);
  };

  if (!args.ok()) return fail(args.status(), 2);
  auto run = Build(*args);
  if (!run.ok()) {
    const bool usage =
        absl::StartsWith(run.status().message(), "missing required option");
    return fail(run.status(), usage ? 2 : 1);
  }
  if (args->Has("baseline-out") && !run->baseline) {
    return fail(
        absl::InvalidArgumentError("--baseline-out needs --baseline tenplex"),
        2);
  }
  for (auto [option, plan] :
       {std::make_pair("out", &run->plan),
        std::make_pair("baseline-out",
                       run->baseline ? &*run->baseline : nullptr)}) {
    if (!args->Has(option) || plan == nullptr) continue;
    std::ofstream out(args->Get(option));
    out << PlanJson(run->scenario.input(), *plan) << "\n";
    out.close();
    if (!out) {
      return fail(absl::UnavailableError(absl::StrCat(
                      "cannot write the plan to ", args->Get(option))),
                  1);
    }
  }
  for (const char* option : {"svg", "html"}) {
    if (!args->Has(option)) continue;
    const std::string title = absl::StrCat(
        args->Has("layout") ? args->Get("layout") : args->Get("model"), ": ",
        args->Get("from"), " on ", args->Get("hosts"), " -> ", args->Get("to"),
        args->Has("to-hosts") ? absl::StrCat(" on ", args->Get("to-hosts"))
                              : "");
    const PlanInput input = run->scenario.input();
    std::ofstream out(args->Get(option));
    out << (std::string(option) == "svg" ? PlanSvg(input, run->plan, title)
                                         : PlanHtml(input, run->plan, title));
    out.close();
    if (!out) {
      return fail(absl::UnavailableError(absl::StrCat(
                      "cannot write the picture to ", args->Get(option))),
                  1);
    }
  }
  if (json) {
    PrintJson(*run);
  } else {
    PrintText(*run);
    if (args->Has("out"))
      std::cout << "plan written to " << args->Get("out") << "\n";
    for (const char* option : {"svg", "html"}) {
      if (args->Has(option))
        std::cout << "picture written to " << args->Get(option) << "\n";
    }
  }
  return 0;
}

}  // namespace ptc::tools
