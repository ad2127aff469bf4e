// Planner benchmark (not a test): plans GPT-3 175B reconfigurations on
// 128 hosts x 8 GPUs and reports plan time (median/min/max over --runs),
// plan size, and ptc vs the Tenplex-style plan in cross-host bytes and
// largest per-host send.
//
//   bazel run -c opt //tools:plan_benchmark -- --runs 5 [--zero]
#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/plan_scenario.h"
#include "coordinator/plan_validator.h"
#include "coordinator/planner.h"
#include "tools/internal/format.h"

namespace ptc::tools {
namespace {

struct Case {
  const char* name;
  const char* to;
  std::vector<int> to_hosts;
  std::vector<bool> alive;
};

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<Case> Cases() {
  // Source tp=8,pp=16,dp=8: rank = tp + 8 * (dp + 8 * pp), so host
  // dp + 8 * pp holds one tp group. Killing host (pp % 8) + 8 * pp takes one
  // of the 8 replicas of every stage and leaves 7.
  std::vector<bool> alive(128, true);
  std::vector<int> survivors;
  for (int pp = 0; pp < 16; ++pp) alive[(pp % 8) + 8 * pp] = false;
  for (int h = 0; h < 128; ++h) {
    if (alive[h]) survivors.push_back(h);
  }
  return {
      {"(a) scale out: tp=8,pp=8,dp=16 on the same 128 hosts",
       "tp=8,pp=8,dp=16",
       Range(128),
       {}},
      {"(b) scale in: tp=8,pp=8,dp=8 on 64 of the hosts",
       "tp=8,pp=8,dp=8",
       Range(64),
       {}},
      {"(c) recover: tp=8,pp=8,dp=14 on the 112 hosts left after 16 died",
       "tp=8,pp=8,dp=14", survivors, alive},
  };
}

struct Stats {
  double min, median, max;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

int Run(int runs, bool zero) {
  const std::string suffix = zero ? ",zero=1" : "";
  std::cout << absl::StrFormat(
      "GPT-3 175B, tp=8,pp=16,dp=8%s on 128 hosts x 8 GPUs, %d runs per "
      "case\n\n",
      suffix, runs);
  bool all_under_a_second = true;
  for (const Case& c : Cases()) {
    auto scenario = MakePlanScenario("gpt3-175b", "tp=8,pp=16,dp=8" + suffix,
                                     Range(128), c.to + suffix, c.to_hosts,
                                     Cluster::Uniform(128, 8), c.alive);
    if (!scenario.ok()) {
      std::cerr << c.name << ": " << scenario.status() << "\n";
      return 1;
    }
    std::vector<double> ours_s, base_s;
    absl::StatusOr<Plan> ours, base;
    for (int i = 0; i < runs; ++i) {
      absl::Time t = absl::Now();
      ours = PlanReconfiguration(scenario->input());
      ours_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
      t = absl::Now();
      base = PlanTenplexBaseline(scenario->input());
      base_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
      if (!ours.ok() &&
          ours.status().code() == absl::StatusCode::kFailedPrecondition) {
        // Expected with ZeRO-1 after host failures: the optimizer state has
        // no replica, so only a snapshot could restore it.
        std::cout << c.name << "\n  not plannable from live hosts: "
                  << ours.status().message() << "\n\n";
        break;
      }
      if (!ours.ok() || !base.ok()) {
        std::cerr << c.name << ": "
                  << (ours.ok() ? base.status() : ours.status()) << "\n";
        return 1;
      }
    }
    if (!ours.ok()) continue;
    const absl::Time v = absl::Now();
    const absl::Status valid = ValidatePlan(scenario->input(), *ours);
    const double validate_s = absl::ToDoubleSeconds(absl::Now() - v);
    const Stats t = Summarize(ours_s), b = Summarize(base_s);
    const PlanSummary& p = ours->summary;
    const PlanSummary& q = base->summary;
    all_under_a_second &= t.max < 1.0;
    std::cout << c.name << "\n";
    std::cout << absl::StrFormat(
        "  plan time       ptc median %s (min %s, max %s); tenplex-style "
        "median %s\n",
        HumanSeconds(t.median), HumanSeconds(t.min), HumanSeconds(t.max),
        HumanSeconds(b.median));
    std::cout << absl::StrFormat(
        "  plan size       %d pieces to %d hosts, %d small-object moves; "
        "tenplex-style "
        "%d pieces\n",
        p.transfers, ours->fragments.size(), p.small_object_moves, q.transfers);
    std::cout << absl::StrFormat(
        "  across hosts    ptc %s (lower bound %s); tenplex-style %s (%.2fx)\n",
        HumanBytes(p.cross_host_bytes),
        HumanBytes(p.cross_host_bytes_lower_bound),
        HumanBytes(q.cross_host_bytes),
        p.cross_host_bytes
            ? static_cast<double>(q.cross_host_bytes) / p.cross_host_bytes
            : 0);
    std::cout << absl::StrFormat(
        "  largest send    ptc %s (lower bound %s, %s); tenplex-style %s "
        "(%.2fx)\n",
        HumanBytes(p.max_host_send_bytes),
        HumanBytes(p.max_host_send_bytes_lower_bound),
        PercentOver(p.max_host_send_bytes, p.max_host_send_bytes_lower_bound),
        HumanBytes(q.max_host_send_bytes),
        p.max_host_send_bytes
            ? static_cast<double>(q.max_host_send_bytes) / p.max_host_send_bytes
            : 0);
    std::cout << absl::StrFormat(
        "  validation      %s in %s\n\n",
        valid.ok() ? "passed" : std::string(valid.message()),
        HumanSeconds(validate_s));
    if (!valid.ok()) return 1;
  }
  std::cout << (all_under_a_second ? "every plan took under 1 second\n"
                                   : "SOME PLANS TOOK 1 SECOND OR MORE\n");
  return 0;
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  int runs = 5;
  bool zero = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--zero")) {
      zero = true;
    } else {
      std::cerr << "usage: plan_benchmark [--runs N] [--zero]\n";
      return 2;
    }
  }
  return ptc::tools::Run(runs, zero);
}
