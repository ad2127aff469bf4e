// Planner benchmark (not a test): realistic changes of GPT-3, LLaMA and MoE
// jobs, up to a 405B-class LLaMA on 2,048 hosts x 8 GPUs (16,384 ranks).
// For each: bytes across hosts and the largest per-host send with today's
// contiguous placement, with ptc's placement, and with the Tenplex-style
// per-rank plan (contiguous, replica 0, no dedup); the time to build the
// target's layout, place and plan (median/min/max over --runs; a
// coordinator keeps the committed layout) and the peak memory of the case.
//
// Each case runs in a child process of its own, so that its peak resident
// memory is its own.
//
//   bazel run //tools:plan_benchmark -- --runs 5 [--case N] [--markdown]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "plan/plan_scenario.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "tools/internal/format.h"
#include "tools/internal/stats.h"

namespace ptc::tools {
namespace {

struct Case {
  std::string name;
  std::string model;
  std::string from;
  int from_hosts;      // host0 .. host{from_hosts-1}
  std::string to;
  int cluster_hosts;   // hosts in the cluster (>= from_hosts)
  std::vector<int> candidates;  // hosts the change may use (empty: all live)
  std::vector<int> dead;
  int gpus = 8;
  // The Tenplex-style plan searches every source rank for every target
  // rank: quadratic, minutes at 16,384 ranks; skipped there.
  bool baseline = true;
  // > 0: the hosts are in this many racks (failure domains "rackK"), host
  // h in rack h % racks, or with `racks_in_order` h / (hosts / racks).
  int racks = 0;
  bool racks_in_order = false;
};

std::vector<int> Range(int lo, int hi, int step = 1) {
  std::vector<int> v;
  for (int i = lo; i < hi; i += step) v.push_back(i);
  return v;
}

std::vector<Case> Cases() {
  // GPT-3 175B, tp=8,pp=16,dp=8 on 128 hosts: host dp + 8 * pp holds one
  // tp group; killing host (pp % 8) + 8 * pp takes one replica of every
  // stage.
  std::vector<int> one_per_stage;
  for (int pp = 0; pp < 16; ++pp) one_per_stage.push_back(pp % 8 + 8 * pp);
  // LLaMA 405B-class, tp=8,pp=16,dp=128 on 2,048 hosts: hosts 0-15 are 16
  // of stage 0's 128 replicas.
  return {
      {"GPT-3 175B: pp 16 -> 8, dp 8 -> 16 on the same 128 hosts",
       "gpt3-175b",
       "tp=8,pp=16,dp=8",
       128,
       "tp=8,pp=8,dp=16",
       128,
       {},
       {}},
      {"GPT-3 175B: scale-down to 64 hosts, ptc picks which of the 128",
       "gpt3-175b",
       "tp=8,pp=16,dp=8",
       128,
       "tp=8,pp=16,dp=4",
       128,
       {},
       {}},
      {"GPT-3 175B: 16 hosts die (one per stage) -> dp=7 on 112",
       "gpt3-175b",
       "tp=8,pp=16,dp=8",
       128,
       "tp=8,pp=16,dp=7",
       128,
       {},
       one_per_stage},
      {"GPT-3 175B zero=1: pp 16 -> 8, dp 8 -> 16 on the same hosts",
       "gpt3-175b",
       "tp=8,pp=16,dp=8,zero=1",
       128,
       "tp=8,pp=8,dp=16,zero=1",
       128,
       {},
       {}},
      {"GPT-3 2.7B: 4x4 GPUs -> tp=2,pp=2,dp=8 on 8x4",
       "gpt3-2.7b",
       "tp=4,pp=2,dp=2",
       4,
       "tp=2,pp=2,dp=8",
       8,
       {},
       {},
       4},
      {"LLaMA-2 70B: host1 of 8 dies -> dp=1 on the 7 left",
       "llama2-70b",
       "tp=8,pp=4,dp=2",
       8,
       "tp=8,pp=4,dp=1",
       8,
       {},
       {1}},
      {"LLaMA-3 70B: 3 of 32 hosts die -> dp=3 on 24 of the 29 left",
       "llama3-70b",
       "tp=8,pp=8,dp=4",
       32,
       "tp=8,pp=8,dp=3",
       32,
       {},
       {3, 12, 21}},
      {"LLaMA-3 70B: redeploy 32 hosts to 16 old + 16 new ones",
       "llama3-70b",
       "tp=8,pp=8,dp=4",
       32,
       "tp=8,pp=8,dp=4",
       48,
       Range(16, 48),
       {}},
      {"LLaMA-3 70B: tp 8 -> 4, pp 8 -> 16 on the same 32 hosts",
       "llama3-70b",
       "tp=8,pp=8,dp=4",
       32,
       "tp=4,pp=16,dp=4",
       32,
       {},
       {}},
      {"Mixtral 8x7B: ep 4 -> 8 on 2 -> 4 hosts",
       "mixtral-8x7b",
       "tp=2,ep=4,pp=2",
       2,
       "tp=2,ep=8,pp=2",
       4,
       {},
       {}},
      {"MoE 64x 136B: ep 8 -> 16 on 8 -> 16 hosts",
       "moe-64x-136b",
       "tp=2,ep=8,pp=4",
       8,
       "tp=2,ep=16,pp=4",
       16,
       {},
       {}},
      {"LLaMA 405B: 16 of 2,048 hosts die -> dp=120 on 1,920",
       "llama3-405b",
       "tp=8,pp=16,dp=128",
       2048,
       "tp=8,pp=16,dp=120",
       2048,
       {},
       Range(0, 16),
       8,
       false},
      {"LLaMA 405B: scale-up to 2,304 hosts, dp=144",
       "llama3-405b",
       "tp=8,pp=16,dp=128",
       2048,
       "tp=8,pp=16,dp=144",
       2304,
       {},
       {},
       8,
       false},
      // Racks: hosts taken in turns (each stage's replicas in every rack),
      // rack 0's 128 hosts die: 8 replicas of every stage.
      {"LLaMA 405B on 16 racks (hosts in turns): rack 0 dies -> dp=120",
       "llama3-405b",
       "tp=8,pp=16,dp=128",
       2048,
       "tp=8,pp=16,dp=120",
       2048,
       {},
       Range(0, 2048, 16),
       8,
       false,
       16},
      // Racks in order: each stage's 128 replicas in one rack of 128 hosts,
      // as a job placed before ptc knew the racks; the same config.
      {"LLaMA 405B on 16 racks (a stage per rack): the same config",
       "llama3-405b",
       "tp=8,pp=16,dp=128",
       2048,
       "tp=8,pp=16,dp=128",
       2048,
       {},
       {},
       8,
       false,
       16,
       true},
  };
}

// One case's figures; the child writes them as one line of numbers.
struct Result {
  int64_t contiguous_bytes = -1, contiguous_send = -1;
  int64_t ptc_bytes = -1, ptc_send = -1, bound = -1;
  int64_t tenplex_bytes = -1, tenplex_send = -1;
  int64_t pieces = 0, released = 0, peak = 0;
  double place_min = 0, place_median = 0, place_max = 0;
  double plan_min = 0, plan_median = 0, plan_max = 0;
  // Building the target's layout: what a change adds to placing and
  // planning (the coordinator keeps the committed layout; LayoutCache).
  double layout_min = 0, layout_median = 0, layout_max = 0;
  double total_median = 0;
  bool valid = false;
  // The ptc placement survives any one host's loss from memory; and the
  // bytes across hosts of the placement that puts movement first
  // (PlacementOptions.prefer_movement): what survivability costs.
  bool survives = false;
  int64_t movement_first_bytes = -1;
  // With racks: the racks whose loss the ptc placement, and the one that
  // puts movement first, does not survive (-1: no racks).
  int64_t racks_lost = -1, movement_first_racks_lost = -1;
};

absl::StatusOr<Result> RunCase(const Case& c, int runs) {
  Cluster cluster = Cluster::Uniform(c.cluster_hosts, c.gpus);
  for (int h = 0; c.racks > 0 && h < c.cluster_hosts; ++h) {
    const int rack =
        c.racks_in_order ? h / (c.cluster_hosts / c.racks) : h % c.racks;
    cluster.hosts[h].domain = absl::StrCat("rack", rack);
  }
  std::vector<bool> alive(c.cluster_hosts, true);
  for (int h : c.dead) alive[h] = false;
  std::vector<int> candidates;
  for (int h : c.candidates.empty() ? Range(0, c.cluster_hosts) : c.candidates)
    if (alive[h]) candidates.push_back(h);
  PTC_ASSIGN_OR_RETURN(
      PlanScenario s,
      MakePlanScenario(c.model, c.from, Range(0, c.from_hosts), c.to,
                       candidates, cluster, alive));
  Result r;
  Plan plan;
  std::vector<double> place_s, plan_s, total_s, layout_s;
  PTC_ASSIGN_OR_RETURN(const ParallelConfig to, s.spec.ParseConfig(c.to));
  for (int i = 0; i < runs; ++i) {
    plan = Plan();  // one plan at a time, as a coordinator holds it
    {
      const absl::Time t = absl::Now();
      PTC_ASSIGN_OR_RETURN(const Layout built, BuildLayout(s.spec, to));
      layout_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    }
    PTC_RETURN_IF_ERROR(PlaceScenarioTarget(&s, proto::PlacementOptions(), candidates));
    const absl::Time t = absl::Now();
    PTC_ASSIGN_OR_RETURN(plan, PlanReconfiguration(s.input()));
    plan_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    place_s.push_back(s.placement_seconds);
    total_s.push_back(layout_s.back() + s.placement_seconds + plan_s.back());
  }
  r.ptc_bytes = plan.summary.cross_host_bytes;
  r.ptc_send = plan.summary.max_host_send_bytes;
  r.bound = plan.summary.cross_host_bytes_lower_bound;
  r.pieces = plan.summary.transfers;
  r.released = static_cast<int64_t>(s.placement.released.size());
  const Stats p = Summarize(place_s), q = Summarize(plan_s);
  r.place_min = p.min, r.place_median = p.median, r.place_max = p.max;
  r.plan_min = q.min, r.plan_median = q.median, r.plan_max = q.max;
  const Stats l = Summarize(layout_s);
  r.layout_min = l.min, r.layout_median = l.median, r.layout_max = l.max;
  r.total_median = Summarize(total_s).median;
  // The peak so far: both layouts, the placement and the plan (what a
  // coordinator holds); the validation and the comparisons come after.
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  r.peak = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  r.valid = ValidatePlan(s.input(), plan).ok();
  r.survives = s.placement.survival.SurvivesAnyHost();
  if (c.racks > 0) r.racks_lost = s.placement.survival.domains_lost.size();
  plan = Plan();
  proto::PlacementOptions movement_first;
  movement_first.set_prefer_movement(true);
  PTC_RETURN_IF_ERROR(PlaceScenarioTarget(&s, movement_first, candidates));
  PTC_ASSIGN_OR_RETURN(plan, PlanReconfiguration(s.input()));
  r.movement_first_bytes = plan.summary.cross_host_bytes;
  if (c.racks > 0)
    r.movement_first_racks_lost = s.placement.survival.domains_lost.size();
  plan = Plan();
  proto::PlacementOptions contiguous;
  contiguous.set_strategy(proto::PLACEMENT_CONTIGUOUS);
  PTC_RETURN_IF_ERROR(PlaceScenarioTarget(&s, contiguous, candidates));
  PTC_ASSIGN_OR_RETURN(plan, PlanReconfiguration(s.input()));
  r.contiguous_bytes = plan.summary.cross_host_bytes;
  r.contiguous_send = plan.summary.max_host_send_bytes;
  if (c.baseline) {
    PTC_ASSIGN_OR_RETURN(Plan base, PlanTenplexBaseline(s.input()));
    r.tenplex_bytes = base.summary.cross_host_bytes;
    r.tenplex_send = base.summary.max_host_send_bytes;
  }
  return r;
}

std::string Encode(const Result& r) {
  return absl::StrFormat(
      "%d %d %d %d %d %d %d %d %d %d %.9f %.9f %.9f %.9f %.9f %.9f %.9f %d %d "
      "%d "
      "%.9f %.9f %.9f %d %d",
      r.contiguous_bytes, r.contiguous_send, r.ptc_bytes, r.ptc_send, r.bound,
      r.tenplex_bytes, r.tenplex_send, r.pieces, r.released, r.peak,
      r.place_min, r.place_median, r.place_max, r.plan_min, r.plan_median,
      r.plan_max, r.total_median, r.valid ? 1 : 0, r.survives ? 1 : 0,
      r.movement_first_bytes, r.layout_min, r.layout_median, r.layout_max,
      r.racks_lost, r.movement_first_racks_lost);
}

bool Decode(const std::string& line, Result* r) {
  int valid = 0, survives = 0;
  long long v[10], movement_first = -1, racks_lost = -1, first_racks_lost = -1;
  const int n = std::sscanf(
      line.c_str(),
      "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lf %lf %lf %lf %lf "
      "%lf %lf %d %d %lld "
      "%lf %lf %lf %lld %lld",
      &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
      &r->place_min, &r->place_median, &r->place_max, &r->plan_min,
      &r->plan_median, &r->plan_max, &r->total_median, &valid, &survives,
      &movement_first, &r->layout_min, &r->layout_median, &r->layout_max,
      &racks_lost, &first_racks_lost);
  if (n != 25) return false;
  r->racks_lost = racks_lost;
  r->movement_first_racks_lost = first_racks_lost;
  r->survives = survives;
  r->movement_first_bytes = movement_first;
  r->contiguous_bytes = v[0], r->contiguous_send = v[1], r->ptc_bytes = v[2];
  r->ptc_send = v[3], r->bound = v[4], r->tenplex_bytes = v[5];
  r->tenplex_send = v[6], r->pieces = v[7], r->released = v[8], r->peak = v[9];
  r->valid = valid;
  return true;
}

// Runs case `i` in a child; its result line and its peak resident memory.
bool RunInChild(const Case& c, int runs, Result* r, int64_t* peak_bytes,
                std::string* error) {
  int fd[2];
  if (pipe(fd) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    auto result = RunCase(c, runs);
    const std::string line = result.ok()
                                 ? Encode(*result)
                                 : absl::StrCat("error ", result.status().ToString());
    if (write(fd[1], line.data(), line.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fd[1]);
  std::string line;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd[0], buf, sizeof(buf))) > 0) line.append(buf, n);
  close(fd[0]);
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  *peak_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  if (line.rfind("error ", 0) == 0 || !Decode(line, r)) {
    *error = line.empty() ? "the case's process died" : line;
    return false;
  }
  return true;
}

std::string Bytes(int64_t b) { return b < 0 ? "-" : HumanBytes(b); }

// ", racks whose loss is not survived: N" (empty without racks).
std::string Racks(int64_t lost) {
  if (lost < 0) return "";
  return lost == 0 ? std::string(", any one rack's too")
                   : absl::StrCat(", not ", lost, " of the racks'");
}

std::string Times(double median, double min, double max) {
  return absl::StrCat(HumanSeconds(median), " (", HumanSeconds(min), "-",
                      HumanSeconds(max), ")");
}

int Run(int runs, int only, bool markdown) {
  const std::vector<Case> cases = Cases();
  if (markdown) {
    std::cout << "| case | contiguous: across / largest send | ptc placement: "
                 "across / largest send | Tenplex-style: across / largest "
                 "send | target layout, median (min-max) | place, median "
                 "(min-max) | plan, median (min-max) | "
                 "peak memory: ptc / with comparisons | ptc survives any one "
                 "host's loss / across with movement first |\n"
                 "|---|---|---|---|---|---|---|---|---|\n";
  } else {
    std::cout << absl::StrFormat(
        "%d runs per case; times are median (min-max); every plan validated\n\n",
        runs);
  }
  bool ok = true, under_a_second = true;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (only >= 0 && static_cast<int>(i) != only) continue;
    const Case& c = cases[i];
    Result r;
    int64_t peak = 0;
    std::string error;
    if (!RunInChild(c, runs, &r, &peak, &error)) {
      std::cerr << c.name << ": " << error << "\n";
      ok = false;
      continue;
    }
    ok &= r.valid;
    const bool big = c.from_hosts >= 128;
    if (big) under_a_second &= r.layout_max + r.place_max + r.plan_max < 1.0;
    const std::string pair_c =
        absl::StrCat(Bytes(r.contiguous_bytes), " / ", Bytes(r.contiguous_send));
    const std::string pair_p =
        absl::StrCat(Bytes(r.ptc_bytes), " / ", Bytes(r.ptc_send));
    const std::string pair_t =
        c.baseline ? absl::StrCat(Bytes(r.tenplex_bytes), " / ", Bytes(r.tenplex_send))
                   : std::string("not run (quadratic)");
    const std::string place = Times(r.place_median, r.place_min, r.place_max);
    const std::string plan = Times(r.plan_median, r.plan_min, r.plan_max);
    const std::string layout =
        Times(r.layout_median, r.layout_min, r.layout_max);
    if (markdown) {
      std::cout << absl::StrFormat(
          "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.name, pair_c,
          pair_p, pair_t, layout, place, plan,
          absl::StrCat(HumanBytes(r.peak), " / ", HumanBytes(peak)),
          absl::StrCat(r.survives ? "yes" : "no", Racks(r.racks_lost), " / ",
                       Bytes(r.movement_first_bytes),
                       Racks(r.movement_first_racks_lost)));
    } else {
      std::cout << c.name << "\n"
                << absl::StrFormat("  %s %s -> %s\n", c.model, c.from, c.to)
                << absl::StrFormat(
                       "  across hosts / largest send: contiguous %s; "
                       "ptc %s (bound %s); tenplex-style %s\n",
                       pair_c, pair_p, Bytes(r.bound), pair_t)
                << absl::StrFormat(
                       "  survives any one host's loss: %s%s; across "
                       "hosts with movement first: %s%s\n",
                       r.survives ? "yes" : "no", Racks(r.racks_lost),
                       Bytes(r.movement_first_bytes),
                       Racks(r.movement_first_racks_lost))
                << absl::StrFormat(
                       "  target layout %s, place %s, plan %s; %d "
                       "pieces, %d hosts released; peak memory %s "
                       "(%s with the comparisons)%s\n\n",
                       layout, place, plan, r.pieces, r.released,
                       HumanBytes(r.peak), HumanBytes(peak),
                       r.valid ? "" : "; PLAN DID NOT VALIDATE");
    }
  }
  if (!markdown) {
    std::cout << (under_a_second
                      ? "every case on 128 hosts or more built its target "
                        "layout, placed and planned in under 1 second\n"
                      : "SOME CASES ON 128 HOSTS OR MORE TOOK 1 SECOND OR "
                        "MORE\n");
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  ptc::ConfigureMutexChecks();  // as in the daemons: off unless
                                // PTC_MUTEX_CHECKS=1
  int runs = 5, only = -1;
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) {
      only = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--markdown")) {
      markdown = true;
    } else {
      std::cerr << "usage: plan_benchmark [--runs N] [--case N] [--markdown]\n";
      return 2;
    }
  }
  return ptc::tools::Run(runs, only, markdown);
}
