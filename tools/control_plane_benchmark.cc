// What the control plane's per-save and per-change work costs at scale,
// with no bytes moved:
// - a save's commit at the coordinator: building each host's share (what
//   it must prove it holds of every version) from the job's layout and
//   placement, once per layout; the requests, with the expectations at a
//   layout's first save and naming them at every later one (their size on
//   the wire and the time to build them); and comparing the copies'
//   checksums once every host answered (the layout itself is not counted:
//   the coordinator keeps the committed one, LayoutCache);
// - a training process's look at its new layout after a change (the
//   client's Refresh): its own rank's regions, against the whole layout it
//   built before 2026-11-28;
// - a save's writes to the coordinator's records (JobTable::Writes): the
//   job's small record, against its whole record, which every save
//   rewrote before 2026-11-29, and the time to find what changed;
// - the automatic changes' look at a quiet job (AutoChanges::Judge), which
//   the coordinator takes five times a second under its lock: against the
//   same look scanning the job's hosts for every host of its pool first,
//   as it did before 2026-11-30;
// - every process's question after a change, which ranks run on its host
//   (from the job's index, against scanning every rank's host per
//   question as before 2026-12-02), and a save's list of hosts to prove;
// - the computations a change's start makes from its plan under the
//   coordinator's lock (StartChange): the event's plan summary (from the
//   summary alone, against converting the whole plan to its wire form
//   first as before 2026-12-02), the bytes between hosts, each target
//   host's share, and the small objects the target keeps.
//
//   bazel build -c opt //tools:control_plane_benchmark
//   bazel-bin/tools/control_plane_benchmark [--runs N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "coordinator/auto_changes.h"
#include "coordinator/host_registry.h"
#include "coordinator/job_table.h"
#include "coordinator/kept_small_objects.h"
#include "coordinator/save_proof.h"
#include "plan/plan_flows.h"
#include "plan/plan_proto.h"
#include "plan/plan_scenario.h"
#include "plan/planner.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "tools/internal/stats.h"

namespace ptc::tools {
namespace {

struct Case {
  const char* what;
  const char* model;
  const char* config;
  int gpus_per_host;
};

// The second to sixth tables' rows, printed after the first.
std::string process_rows_, record_rows_, look_rows_, question_rows_,
    start_rows_;

// What a save writes to the coordinator's records: the job placed as
// `rank_hosts`, its committed version moved on `runs` times.
absl::Status MeasureRecords(const Case& c, const ModelSpec& spec,
                            const std::vector<std::string>& rank_hosts,
                            int runs) {
  auto job = std::make_unique<JobTable::Job>();
  proto::CoordinatorState::Job& s = job->state;
  s.set_job("job");
  s.set_model(c.model);
  s.set_config(c.config);
  s.set_layout_epoch(1);
  s.set_next_version(1);
  for (size_t r = 0; r < rank_hosts.size(); ++r) {
    s.add_rank_hosts(rank_hosts[r]);
    s.add_rank_devices(static_cast<int32_t>(r % c.gpus_per_host));
    if (r % c.gpus_per_host == 0) {
      s.add_hosts(rank_hosts[r]);
      s.add_pool(rank_hosts[r]);
    }
  }
  job->spec = std::make_shared<const ModelSpec>(spec);
  JobTable table;
  JobTable::Job& added = table.Add(std::move(job));
  ControlStore::Writes first;
  table.Persisted(table.Writes(&first));
  std::vector<double> write_s;
  int64_t written = 0;
  for (int i = 0; i < runs; ++i) {
    added.state.set_committed_version(added.NewVersion());
    added.state.set_committed_step(i + 1);
    ControlStore::Writes writes;
    const absl::Time t = absl::Now();
    JobTable::Records records = table.Writes(&writes);
    write_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    written = 0;
    for (const auto& [key, bytes] : writes)
      written += static_cast<int64_t>(key.size() + (bytes ? bytes->size() : 0));
    table.Persisted(std::move(records));
  }
  const Stats w = Summarize(write_s);
  record_rows_ +=
      absl::StrFormat("| %s | %d | %d B | %d B | %.2f / %.2f / %.2f |\n",
                      c.what, static_cast<int>(rank_hosts.size()),
                      static_cast<int64_t>(added.state.ByteSizeLong()), written,
                      w.min * 1e3, w.median * 1e3, w.max * 1e3);
  return absl::OkStatus();
}

// The automatic changes' look at a quiet job on `hosts` hosts (its pool),
// `runs` times; and the pool's check as it was (the job's hosts scanned
// for each pool host before asking whether the host is held back).
void MeasureQuietLook(int hosts, int runs) {
  HostRegistry registry;
  const absl::Time now = absl::Now();
  auto job = std::make_unique<JobTable::Job>();
  proto::CoordinatorState::Job& s = job->state;
  s.set_job("job");
  s.set_committed_version(4);
  s.mutable_auto_policy()->set_enabled(true);
  for (int i = 0; i < hosts; ++i) {
    proto::HostStatus h;
    h.set_name(absl::StrFormat("hollow-%05d", i));
    h.set_address(absl::StrCat(h.name(), ":7070"));
    h.set_gpus(8);
    h.set_incarnation(1);
    registry.Register(h, now);
    s.add_hosts(h.name());
    s.add_pool(h.name());
  }
  AutoChanges changes;
  changes.Judge("job", *job, registry, now);  // the first look remembers
  std::vector<double> look, before;
  size_t placeable = 0;
  for (int r = 0; r < runs; ++r) {
    absl::Time t = absl::Now();
    if (changes.Judge("job", *job, registry, now).has_value()) {
      std::cerr << "a quiet job was judged to change\n";
      std::exit(1);
    }
    look.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    for (const std::string& h : s.pool()) {
      placeable += registry.Usable(h) &&
                   (std::find(s.hosts().begin(), s.hosts().end(), h) !=
                        s.hosts().end() ||
                    !registry.HeldBack(h, now));
    }
    before.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  if (placeable != static_cast<size_t>(hosts) * runs) {
    std::cerr << "the old pool check found a host it could not place on\n";
    std::exit(1);
  }
  const Stats l = Summarize(look), b = Summarize(before);
  look_rows_ += absl::StrFormat(
      "| %d | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f |\n", hosts, l.min * 1e3,
      l.median * 1e3, l.max * 1e3, b.min * 1e3, b.median * 1e3, b.max * 1e3);
}

// Every process of a job on `hosts` hosts of 8 GPUs asking which ranks
// run on its host (ListJobs brief, after every change), `runs` times: from
// the job's index (JobTable::Job::RanksOn), and scanning every rank's host
// per question as the coordinator did before 2026-12-02. And a save's
// list of hosts to prove (the job's hosts, then any other rank's): in a
// set, and looked up linearly per rank as before.
void MeasureHostQuestions(int hosts, int runs) {
  constexpr int kGpus = 8;
  auto job = std::make_unique<JobTable::Job>();
  proto::CoordinatorState::Job& s = job->state;
  s.set_job("job");
  s.set_layout_epoch(2);
  for (int h = 0; h < hosts; ++h) {
    s.add_hosts(absl::StrFormat("hollow-%05d", h));
    for (int g = 0; g < kGpus; ++g) {
      s.add_rank_hosts(s.hosts(h));
      s.add_rank_devices(g);
    }
  }
  job->ranks = hosts * kGpus;
  std::vector<double> index_s, scan_s, set_s, linear_s;
  size_t found = 0, scanned = 0, listed = 0, listed_before = 0;
  for (int i = 0; i < runs; ++i) {
    s.set_layout_epoch(2 + i);  // a change: the index is built again
    absl::Time t = absl::Now();
    for (int r = 0; r < job->ranks; ++r)
      found += job->RanksOn(s.rank_hosts(r))->size();
    index_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    for (int r = 0; r < job->ranks; ++r) {
      const std::string& host = s.rank_hosts(r);
      for (int q = 0; q < s.rank_hosts_size(); ++q)
        scanned += s.rank_hosts(q) == host;
    }
    scan_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    {
      std::vector<std::string> list(s.hosts().begin(), s.hosts().end());
      std::set<std::string_view> named(s.hosts().begin(), s.hosts().end());
      for (const std::string& h : s.rank_hosts())
        if (named.insert(h).second) list.push_back(h);
      listed += list.size();
    }
    set_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    {
      std::vector<std::string> list(s.hosts().begin(), s.hosts().end());
      for (const std::string& h : s.rank_hosts())
        if (std::find(list.begin(), list.end(), h) == list.end())
          list.push_back(h);
      listed_before += list.size();
    }
    linear_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  const size_t expected = static_cast<size_t>(runs) * job->ranks * kGpus;
  if (found != expected || scanned != expected ||
      listed != static_cast<size_t>(runs) * hosts || listed_before != listed) {
    std::cerr << "the host questions' answers differ\n";
    std::exit(1);
  }
  const Stats a = Summarize(index_s), b = Summarize(scan_s);
  const Stats c = Summarize(set_s), d = Summarize(linear_s);
  question_rows_ += absl::StrFormat(
      "| %d | %d | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | "
      "%.2f / %.2f / %.2f | %.2f / %.2f / %.2f |\n",
      hosts, job->ranks, a.min * 1e3, a.median * 1e3, a.max * 1e3, b.min * 1e3,
      b.median * 1e3, b.max * 1e3, c.min * 1e3, c.median * 1e3, c.max * 1e3,
      d.min * 1e3, d.median * 1e3, d.max * 1e3);
}

// A change after `dead` of `hosts` hosts (every hosts/dead-th; `dead`
// divides `hosts`) died: the job `from` on all of them, `to` on the live
// ones, placed contiguously. The plan is made once (the planner's own
// table is plan_benchmark's); the computations StartChange makes from it
// under the coordinator's lock are measured `runs` times (not the event's
// flows and progress entries built from them, the placement's summary or
// writing the change's record).
absl::Status MeasureChangeStart(const char* what, const char* model,
                                const char* from, const char* to, int hosts,
                                int dead, int runs) {
  if (dead <= 0 || dead > hosts || hosts % dead != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        dead, " dead hosts do not divide ", hosts, " hosts evenly"));
  }
  std::vector<bool> alive(hosts, true);
  std::vector<int> from_hosts, to_hosts;
  for (int h = 0; h < hosts; ++h) {
    from_hosts.push_back(h);
    if (h % (hosts / dead) == 0) {
      alive[h] = false;
    } else {
      to_hosts.push_back(h);
    }
  }
  PTC_ASSIGN_OR_RETURN(PlanScenario scenario,
                       MakePlanScenario(model, from, from_hosts, to, to_hosts,
                                        Cluster::Uniform(hosts, 8), alive));
  const PlanInput input = scenario.input();
  PTC_ASSIGN_OR_RETURN(const Plan plan, PlanReconfiguration(input));
  std::vector<std::string> rank_hosts;
  for (int h : scenario.target_placement.host)
    rank_hosts.push_back(scenario.cluster.hosts[h].name);
  int64_t entries = 0;
  for (const HostFragment& f : plan.fragments) {
    entries += static_cast<int64_t>(f.holds.size());
    ForEachPiece(f, [&](const Transfer&) { ++entries; });
  }
  std::vector<double> whole_s, alone_s, flows_s, shares_s, keep_s;
  size_t sink = 0;
  for (int i = 0; i < runs; ++i) {
    absl::Time t = absl::Now();
    sink += PlanToProto(plan).summary().ByteSizeLong();
    whole_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    sink += SummaryToProto(plan.summary).ByteSizeLong();
    alone_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    sink += HostFlows(input, plan).size();
    flows_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    sink += FragmentBytes(input, plan).size();
    shares_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    PTC_ASSIGN_OR_RETURN(KeepPlan keep,
                         MakeKeepPlan(scenario.spec, to, rank_hosts));
    sink += static_cast<size_t>(keep.objects);
    keep_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  if (sink == 0) return absl::InternalError("nothing was computed");
  const Stats a = Summarize(whole_s), b = Summarize(alone_s),
              c = Summarize(flows_s), d = Summarize(shares_s),
              e = Summarize(keep_s);
  auto ms = [](const Stats& x) {
    return absl::StrFormat("%.2f / %.2f / %.2f", x.min * 1e3, x.median * 1e3,
                           x.max * 1e3);
  };
  start_rows_ +=
      absl::StrFormat("| %s | %d | %.2fM | %s | %s | %s | %s | %s |\n", what,
                      static_cast<int>(rank_hosts.size()), entries / 1e6, ms(b),
                      ms(a), ms(c), ms(d), ms(e));
  return absl::OkStatus();
}

absl::Status RunCase(const Case& c, int runs) {
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, SpecForModel(c.model));
  PTC_ASSIGN_OR_RETURN(const ParallelConfig config, spec.ParseConfig(c.config));
  PTC_ASSIGN_OR_RETURN(const Layout layout, BuildLayout(spec, config));
  // Ranks in order on hosts of `gpus_per_host`, as the placement packs
  // them (a tp group on one host, dp replicas on other hosts).
  std::vector<std::string> rank_hosts(layout.world_size());
  for (int r = 0; r < layout.world_size(); ++r)
    rank_hosts[r] = absl::StrCat("host", r / c.gpus_per_host);
  size_t shards = 0;
  for (int t = 0; t < layout.num_tensors(); ++t)
    shards += layout.shards(t).size();

  std::vector<double> build_s, whole_s, by_id_s, check_s;
  int64_t expected = 0, whole_wire = 0, by_id_wire = 0;
  for (int i = 0; i < runs; ++i) {
    absl::Time t = absl::Now();
    PTC_ASSIGN_OR_RETURN(auto shares,
                         SharesOf("job", spec, layout, rank_hosts));
    build_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    // The requests of a layout's first save (each host is sent its
    // expectations, and keeps them) and of every later one (by id).
    // (Built, then measured and freed outside the time: as the shares
    // before 2026-11-28, which held their requests.)
    expected = whole_wire = by_id_wire = 0;
    std::vector<proto::CommitVersionRequest> requests;
    requests.reserve(shares.size());
    t = absl::Now();
    for (const auto& [host, share] : shares) {
      requests.push_back(
          ShareRequest("job", 2 + i, spec, layout, share, /*whole=*/true));
    }
    whole_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    for (const proto::CommitVersionRequest& r : requests) {
      expected += r.expect_regions_size();
      whole_wire += static_cast<int64_t>(r.ByteSizeLong());
    }
    requests.clear();
    t = absl::Now();
    for (const auto& [host, share] : shares) {
      requests.push_back(
          ShareRequest("job", 2 + i, spec, layout, share, /*whole=*/false));
    }
    by_id_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    for (const proto::CommitVersionRequest& r : requests)
      by_id_wire += static_cast<int64_t>(r.ByteSizeLong());
    // Every host's answer: each region's checksum, the same for every copy
    // (a function of its tensor and region id), as hosts that agree.
    std::map<std::string, proto::CommitVersionResponse> answers;
    for (const auto& [host, share] : shares) {
      proto::CommitVersionResponse& a = answers[host];
      for (const HostShare::Expected& e : share.expected)
        a.add_checksums(static_cast<uint64_t>(e.tensor) << 32 | e.region);
    }
    t = absl::Now();
    PTC_RETURN_IF_ERROR(CheckReplicas(spec, layout, shares, answers));
    check_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  // The process's view: rank 0's regions alone, and the whole layout.
  std::vector<double> rank_s, whole_layout_s;
  for (int i = 0; i < runs; ++i) {
    absl::Time t = absl::Now();
    PTC_ASSIGN_OR_RETURN(auto mine, BuildRankRegions(spec, config, 0));
    rank_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    t = absl::Now();
    PTC_ASSIGN_OR_RETURN(const Layout whole, BuildLayout(spec, config));
    whole_layout_s.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  PTC_RETURN_IF_ERROR(MeasureRecords(c, spec, rank_hosts, runs));
  const Stats b = Summarize(build_s), k = Summarize(check_s);
  const Stats wh = Summarize(whole_s), id = Summarize(by_id_s);
  const Stats m = Summarize(rank_s), w = Summarize(whole_layout_s);
  process_rows_ += absl::StrFormat(
      "| %s | %d | %.4f / %.4f / %.4f | %.3f / %.3f / %.3f |\n", c.what,
      layout.world_size(), m.min, m.median, m.max, w.min, w.median, w.max);
  std::cout << absl::StrFormat(
      "| %s | %d | %d | %.1fM | %.2fM | %.3f / %.3f / %.3f | %.0f MiB, "
      "%.3f / %.3f / %.3f | %.2f MiB, %.4f / %.4f / %.4f | "
      "%.3f / %.3f / %.3f |\n",
      c.what, layout.world_size(), layout.world_size() / c.gpus_per_host,
      shards / 1e6, expected / 1e6, b.min, b.median, b.max,
      whole_wire / 1048576.0, wh.min, wh.median, wh.max, by_id_wire / 1048576.0,
      id.min, id.median, id.max, k.min, k.median, k.max);
  return absl::OkStatus();
}

int Run(int runs) {
  const Case cases[] = {
      {"LLaMA-3 70B, tp=8,pp=8,dp=4", "llama3-70b", "tp=8,pp=8,dp=4", 8},
      {"LLaMA-3 70B, tp=8,pp=8,dp=32", "llama3-70b", "tp=8,pp=8,dp=32", 8},
      {"LLaMA 405B, tp=8,pp=16,dp=16", "llama3-405b", "tp=8,pp=16,dp=16", 8},
      {"LLaMA 405B, tp=8,pp=16,dp=128", "llama3-405b", "tp=8,pp=16,dp=128", 8},
  };
  std::cout << "save's proof, seconds min / median / max of " << runs
            << " runs\n\n"
            << "| job | ranks | hosts | layout's shards | expected regions | "
               "build the shares, once per layout (s) | requests of a "
               "layout's first save | requests of every later save (by id) | "
               "compare the copies, every save (s) |\n"
            << "|---|---|---|---|---|---|---|---|---|\n";
  for (const Case& c : cases) {
    const absl::Status s = RunCase(c, runs);
    if (!s.ok()) {
      std::cerr << c.what << ": " << s << "\n";
      return 1;
    }
  }
  std::cout << "\na process's regions after a change (the client's Refresh), "
               "seconds min / median / max\n\n"
            << "| job | ranks | its rank's regions | the whole layout |\n"
            << "|---|---|---|---|\n"
            << process_rows_
            << "\na save's writes to the coordinator's records, finding them: "
               "milliseconds min / median / max\n\n"
            << "| job | ranks | the job's whole record (every save wrote it "
               "before 2026-11-29) | a save writes | finding what changed |\n"
            << "|---|---|---|---|---|\n"
            << record_rows_;
  for (int hosts : {256, 2048}) MeasureQuietLook(hosts, runs);
  std::cout << "\nthe automatic changes' look at a quiet job, five times a "
               "second under the coordinator's lock: milliseconds min / "
               "median / max\n\n"
            << "| hosts (the job's pool) | the look (AutoChanges::Judge) | "
               "before 2026-11-30: its pool's check alone, scanning the "
               "job's hosts first |\n"
            << "|---|---|---|\n"
            << look_rows_;
  for (int hosts : {128, 512, 2048}) MeasureHostQuestions(hosts, runs);
  std::cout << "\nevery process asking which ranks run on its host (after "
               "every change), and a save's list of hosts to prove, under "
               "the coordinator's lock: milliseconds min / median / max\n\n"
            << "| hosts | processes | every process's question, from the "
               "job's index | the same, each scanning every rank's host "
               "(before 2026-12-02) | a save's hosts, in a set | the same, "
               "looked up linearly per rank (before) |\n"
            << "|---|---|---|---|---|---|\n"
            << question_rows_;
  struct Change {
    const char *what, *model, *from, *to;
    int hosts, dead;
  };
  const Change changes[] = {
      {"GPT (400 tensors), dp 512 -> 480 on 512 hosts, 32 dead",
       "gpt:layers=8,hidden=64,heads=4,vocab=512,positions=64",
       "tp=2,pp=4,dp=512", "tp=2,pp=4,dp=480", 512, 32},
      {"LLaMA 405B, dp 128 -> 120 on 2,048 hosts, 16 dead", "llama3-405b",
       "tp=8,pp=16,dp=128", "tp=8,pp=16,dp=120", 2048, 16},
  };
  for (const Change& c : changes) {
    const absl::Status s = MeasureChangeStart(c.what, c.model, c.from, c.to,
                                              c.hosts, c.dead, runs);
    if (!s.ok()) {
      std::cerr << c.what << ": " << s << "\n";
      return 1;
    }
  }
  std::cout << "\nthe computations a change's start makes from its plan "
               "under the coordinator's lock: milliseconds min / median / "
               "max\n\n"
            << "| change | target ranks | the plan's held regions and "
               "transfers | the event's plan summary | the same, converting "
               "the whole plan first (before 2026-12-02) | bytes between "
               "hosts | each target host's share | the small objects kept |\n"
            << "|---|---|---|---|---|---|---|---|\n"
            << start_rows_;
  return 0;
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  ptc::ConfigureMutexChecks();  // as in the daemons: off unless
                                // PTC_MUTEX_CHECKS=1
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::cerr << "usage: control_plane_benchmark [--runs N]\n";
      return 2;
    }
  }
  return ptc::tools::Run(runs);
}
