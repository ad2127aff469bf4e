#include "tools/ptcctl/cluster_command.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/json_writer.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "coordinator/status_json.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/enum_names.h"
#include "proto/tensor_store.grpc.pb.h"
#include "ptc/families.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/region_proto.h"
#include "snapshot/safetensors.h"
#include "snapshot/snapshot_dir.h"
#include "snapshot/snapshot_reader.h"
#include "tools/internal/cli.h"
#include "tools/internal/format.h"
#include "tools/internal/layout_file.h"
#include "tools/internal/placement_text.h"

namespace ptc::tools {

const char kClusterUsage[] =
    R"(usage (all take --coordinator HOST:PORT[,HOST:PORT...] (several: the one
that leads), default $PTC_COORDINATOR or 127.0.0.1:7000, --json, and
the TLS options: --tls-ca, --tls-cert, --tls-key, default $PTC_TLS_CA,
$PTC_TLS_CERT, $PTC_TLS_KEY, the operator's certificate from tools/ptc-certs
DIR admin; or --insecure for a cluster without TLS):
  ptcctl register    --job J (--model MODEL | --layout FILE) --config CONFIG --hosts h1,h2,...
                     [--placement ptc|contiguous|FILE] [--colocate tp,...|none]
                     [--prefer-movement]
                     [--auto on [--live] ...]  (automatic changes: see ptcctl auto)
  ptcctl reconfigure --job J --to CONFIG [--hosts h1,h2,...] [--parallel-pulls N]
                     [--after-save [--hot]]  (live jobs: start from the processes'
                     next save; --hot: they move the state between themselves)
                     [--transport ucx|grpc]   (default: UCX, gRPC where UCX cannot)
                     [--strategy ptc|tenplex] (tenplex: the per-rank baseline plan)
                     [--placement ptc|contiguous|FILE] [--colocate tp,...|none]
                     [--prefer-movement]
                     (asked again for up to a minute while the job commits a
                     save, or changed while the change was planned)
  ptcctl prepare     --job J --to CONFIG [--hosts h1,h2,...] [--wait] [--placement ...]
  ptcctl hosts
  ptcctl jobs
  ptcctl status J
  ptcctl ranks       --job J --host H      (the ranks a launcher on H starts, and their GPUs)
  ptcctl abort J
  ptcctl forget J
  ptcctl token J     (the job's token, for its processes' PTC_JOB_TOKEN)
  ptcctl snapshot    --job J --to DIR [--keep K] [--rate BYTES_PER_S]
                     [--every-versions N] [--every-minutes M] [--policy-only]
  ptcctl restore     --job J --from DIR --config CONFIG --hosts h1,h2,...
                     [--placement ...]
  ptcctl export      --job J --to FILE.safetensors [--from DIR] [--all]
  ptcctl advise      --job J [--gpus N] [--hosts h1,h2,...]
                     (the configs the advisor considers and the one it chooses)
  ptcctl auto        J on|off [--live [--hot|--no-hot]] [--pin CONFIG | --unpin] [--margin F]
                     [--global-batch N] [--micro-batches N] [--tokens-per-step N]
                     [--max-gpus N] [--save-timeout SECONDS]
  ptcctl hosts       add h1,h2,... [--job J]   (into J's pool, or back in service)
  ptcctl hosts       drain h1,h2,...           (every job leaves them)
  ptcctl run         --job J [--log-dir DIR] [--master-port P] [--mode auto|live|restart]
                     [--python PYTHON] -- COMMAND ARGS...
                     (runs the job's processes on this machine until they finish)

Automatic changes (register --auto on, or ptcctl auto J on): when a host
of the job dies, is drained, or joins its pool, the coordinator changes
the job by itself to the config `ptcctl advise` shows. With --live its
processes follow without restarting (ptc.torch.elastic): a change while
every host is alive first asks them to save at their next step.
reconfigure --after-save does the same for a change by hand. With --hot,
a change whose target GPUs all run a process of the job is a hot switch:
the processes move the state between themselves over their process groups
(ptc's plan) and save the new layout; the change commits with that save.

The coordinator places the ranks: --hosts are candidates, and it picks
the hosts and GPUs that leave a copy of every region on another host (a
stage's dp replicas on different hosts) where the layout allows, then make
the change shortest and move the fewest bytes across hosts
(--prefer-movement: those first) (a tp group stays on one host;
--colocate names other axes, or none), within each host's free GPUs and
store memory; hosts it leaves without a rank are released. --placement contiguous fills the hosts in the
order named (for comparison); --placement FILE gives every rank's "HOST
GPU", one line per rank in rank order. register and reconfigure print the
placement; ptcctl ranks tells each host's launcher what to start.

register prints the job's token where the cluster has a token key: the
job's processes show it (PTC_JOB_TOKEN) with a "client" certificate to act
on this job and no other. token prints it again.

snapshot writes the job's committed version to DIR (an absolute path, the
same on every host: a shared filesystem) as safetensors files and a
manifest, every host its share in parallel; DIR keeps the newest K (3)
complete snapshots. --every-versions / --every-minutes make the
coordinator take them by itself (0 or negative: off); --policy-only sets
DIR and the policy without writing now. A later change that finds a
region on no live host reads it from the newest snapshot of the
committed version. restore loads the newest snapshot in DIR into the
cluster under CONFIG on the hosts (registering the job if it is unknown):
the job's state becomes the snapshot's (its step). export writes the
consolidated full tensors of the job's newest snapshot (parameters only;
--all for optimizer state too) to one safetensors file, a tensor at a
time, names from the model spec.

reconfigure plans the change, runs it with a live progress line and ends
with a report: time, bytes kept in place / copied within hosts / sent
across hosts, throughput, fingerprints verified. It exits 1 if the change
aborted (the job stays at its committed version).

prepare plans the same change and has every target host prepare the
memory it will stage (within its ptcd's --spare-pool), so that the change
itself writes into ready memory: run it as soon as the new allocation is
known, while the job still trains. Nothing moves. --wait returns when the
memory is ready, showing progress.

run is the launcher of a job on one machine (a local cluster): it starts
ptc's agent (python3 -m ptc.agent) for every live ptcd of this machine
(a host whose registered socket is here), which runs COMMAND once for
each rank the placement gives its GPUs, with the variables torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) and PTC_JOB, PTC_SOCKET,
PTC_DEVICE. A restart-style job's processes are stopped when a change
starts and the new layout's are started after it commits; a live job's
follow changes themselves. It ends when the job's processes have
finished, with the status of one that failed. On a cluster, each host
runs the agent under systemd instead. PYTHON (default $PTC_PYTHON, else
python3) must import ptc: the wheel, or the package this checkout built.

forget removes a job that has ended: the coordinator forgets it and every
live host deletes all its versions. Refused while the job is being
reconfigured. It exits 1 if a host could not be cleared (run it again).
)";

namespace {

using Stub = proto::Coordinator::Stub;

// A call to the coordinator, asked again within `timeout` while the
// coordinator refuses it for load (IsBusy: it never ran): at 2,048 hosts a
// change's burst of calls took every thread for longer than the channel's
// own five retries. Any other error returns at once: UNAVAILABLE (where no
// coordinator listens), a quota's refusal (etcd's space).
template <typename Req, typename Resp>
absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&,
                                               Resp*),
                  Stub* stub, const Req& req, Resp* resp,
                  absl::Duration timeout = absl::Seconds(30)) {
  int unavailable = 0;
  return AskPatiently(
      absl::Now() + timeout, 0,
      [&](grpc::ClientContext* ctx) { return (stub->*method)(ctx, req, resp); },
      &unavailable);
}

// A change's request (or an advice), asked again for up to a minute while
// the coordinator answers ABORTED: the job was committing a save that every
// rank reported, or changed while the change was planned (the change then
// starts from the new committed version). A scheduler need not retry these
// itself.
template <typename Req, typename Resp>
absl::Status AskWhileAborted(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                          const Req&, Resp*),
                             Stub* stub, const Req& req, Resp* resp,
                             absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  absl::Duration pause = absl::Milliseconds(100);
  bool told = false;
  while (true) {
    const absl::Status s = Call(method, stub, req, resp, timeout);
    if (!absl::IsAborted(s) || absl::Now() + pause > deadline) return s;
    if (!told) {
      std::cerr << s.message() << "; asking again\n";
      told = true;
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(2));
  }
}

void WriteSummary(const proto::PlanSummary& p, JsonWriter* w) {
  w->BeginObject();
  w->Key("target_bytes").Int(p.target_bytes());
  w->Key("kept_in_place_bytes").Int(p.kept_in_place_bytes());
  w->Key("copied_within_host_bytes").Int(p.copied_within_host_bytes());
  w->Key("cross_host_bytes").Int(p.cross_host_bytes());
  w->Key("cross_host_bytes_lower_bound").Int(p.cross_host_bytes_lower_bound());
  w->Key("snapshot_bytes").Int(p.snapshot_bytes());
  w->Key("max_host_send_bytes").Int(p.max_host_send_bytes());
  w->Key("max_host_send_bytes_lower_bound")
      .Int(p.max_host_send_bytes_lower_bound());
  w->Key("placement");
  WritePlacement(p, w);
  w->EndObject();
}

// --auto on|off, --live, --pin/--unpin and the advisor's constraints onto
// `p` (flags not given keep their value).
absl::Status AutoPolicyFlags(const Args& args, proto::AutoPolicy* p) {
  if (args.Has("auto")) {
    const std::string v = args.Get("auto");
    if (v != "on" && v != "off")
      return absl::InvalidArgumentError("--auto takes on or off");
    p->set_enabled(v == "on");
  }
  if (args.Flag("live")) p->set_live(true);
  if (args.Flag("hot")) {
    p->set_live(true);
    p->set_hot(true);
  }
  if (args.Flag("no-hot")) p->set_hot(false);
  if (args.Has("pin")) p->set_pinned_config(args.Get("pin"));
  if (args.Flag("unpin")) p->clear_pinned_config();
  auto number = [&](const char* flag, auto set) -> absl::Status {
    if (!args.Has(flag)) return absl::OkStatus();
    double v = 0;
    if (!absl::SimpleAtod(args.Get(flag), &v) || !(v >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " needs a number >= 0, not '",
                       args.Get(flag), "'"));
    }
    set(v);
    return absl::OkStatus();
  };
  PTC_RETURN_IF_ERROR(number("margin", [&](double v) { p->set_margin(v); }));
  PTC_RETURN_IF_ERROR(number("global-batch", [&](double v) {
    p->set_global_batch(static_cast<int64_t>(std::min(v, 1e15)));
  }));
  PTC_RETURN_IF_ERROR(number("micro-batches", [&](double v) {
    p->set_micro_batches(static_cast<int32_t>(std::min(v, 1e9)));
  }));
  PTC_RETURN_IF_ERROR(number("tokens-per-step", [&](double v) {
    p->set_tokens_per_step(static_cast<int64_t>(std::min(v, 1e18)));
  }));
  PTC_RETURN_IF_ERROR(number("max-gpus", [&](double v) {
    p->set_max_gpus(static_cast<int32_t>(std::min(v, 1e9)));
  }));
  PTC_RETURN_IF_ERROR(number("save-timeout", [&](double v) {
    p->set_save_timeout_seconds(v);
  }));
  return absl::OkStatus();
}

std::string DescribePolicy(const proto::AutoPolicy& p) {
  if (!p.enabled()) return "automatic changes off";
  std::string out = absl::StrCat("automatic changes on",
                                 p.live() ? (p.hot() ? ", live processes (hot switch)"
                                                     : ", live processes")
                                          : "");
  if (!p.pinned_config().empty())
    absl::StrAppend(&out, ", pinned to ", p.pinned_config());
  return out;
}

absl::Status Register(Stub* stub, const Args& args, bool json) {
  proto::RegisterJobRequest req;
  PTC_ASSIGN_OR_RETURN(*req.mutable_job(), args.Required("job"));
  if (args.Has("layout")) {
    PTC_ASSIGN_OR_RETURN(ModelSpec spec, ReadLayoutFile(args.Get("layout")));
    *req.mutable_layout() = SpecToProto(spec);
    if (args.Has("model")) {
      return absl::InvalidArgumentError(
          "give --model or --layout, not both");
    }
  } else {
    PTC_ASSIGN_OR_RETURN(*req.mutable_model(), args.Required("model"));
  }
  PTC_ASSIGN_OR_RETURN(*req.mutable_config(), args.Required("config"));
  PTC_ASSIGN_OR_RETURN(std::string hosts, args.Required("hosts"));
  for (absl::string_view h : absl::StrSplit(hosts, ',', absl::SkipEmpty()))
    req.add_hosts(std::string(h));
  PTC_ASSIGN_OR_RETURN(*req.mutable_placement(), PlacementFlags(args));
  PTC_RETURN_IF_ERROR(AutoPolicyFlags(args, req.mutable_auto_policy()));
  proto::RegisterJobResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::RegisterJob, stub, req, &resp));
  const int used = req.hosts_size() - resp.placement().released_hosts_size();
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("job").String(req.job()).Key("ranks").Int(resp.ranks());
    w.Key("state_bytes").Int(resp.state_bytes()).Key("placement");
    WritePlacement(resp.placement(), &w);
    w.Key("token").String(resp.token());
    w.EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << absl::StrFormat(
        "registered job %s: %s, %s, %d ranks on %d hosts, %s of state\n%s",
        req.job(),
        req.has_layout() ? absl::StrCat("layout ", req.layout().name())
                         : req.model(),
        req.config(), resp.ranks(), used, HumanBytes(resp.state_bytes()),
        FormatPlacement(resp.placement()));
    if (!resp.token().empty()) {
      std::cout << "job token (give it to the job's processes as "
                   "PTC_JOB_TOKEN; keep it secret):\n  "
                << resp.token() << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status Token(Stub* stub, const std::string& job, bool json) {
  proto::JobTokenRequest req;
  req.set_job(job);
  proto::JobTokenResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::JobToken, stub, req, &resp));
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("job").String(job).Key("token").String(resp.token());
    w.EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << resp.token() << "\n";
  }
  return absl::OkStatus();
}

std::string Bar(double fraction, int width) {
  const int full = static_cast<int>(fraction * width + 0.5);
  return absl::StrCat("[", std::string(full, '#'),
                      std::string(width - full, '.'), "]");
}

// The change --job, --to and --hosts name (reconfigure and prepare).
absl::StatusOr<proto::ReconfigureRequest> ChangeRequest(const Args& args) {
  proto::ReconfigureRequest req;
  PTC_ASSIGN_OR_RETURN(*req.mutable_job(), args.Required("job"));
  PTC_ASSIGN_OR_RETURN(*req.mutable_to(), args.Required("to"));
  for (absl::string_view h :
       absl::StrSplit(args.Get("hosts"), ',', absl::SkipEmpty())) {
    req.add_hosts(std::string(h));
  }
  PTC_ASSIGN_OR_RETURN(*req.mutable_placement(), PlacementFlags(args));
  return req;
}

absl::Status FollowChange(Stub* stub, const proto::ReconfigureRequest& req,
                          const proto::ReconfigureResponse& started,
                          bool json);

absl::Status AutoJob(Stub* stub, const std::string& job, const Args& args,
                     bool json) {
  proto::ListJobsRequest list;
  list.set_job(job);
  proto::ListJobsResponse jobs;
  PTC_RETURN_IF_ERROR(Call(&Stub::ListJobs, stub, list, &jobs));
  proto::SetAutoPolicyRequest req;
  req.set_job(job);
  *req.mutable_policy() = jobs.jobs(0).auto_policy();
  if (args.positional().size() >= 2) {
    const std::string& v = args.positional()[1];
    if (v != "on" && v != "off")
      return absl::InvalidArgumentError("ptcctl auto J on|off");
    req.mutable_policy()->set_enabled(v == "on");
  }
  PTC_RETURN_IF_ERROR(AutoPolicyFlags(args, req.mutable_policy()));
  proto::SetAutoPolicyResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::SetAutoPolicy, stub, req, &resp));
  if (json) {
    JsonWriter w;
    const proto::AutoPolicy& p = resp.policy();
    w.BeginObject().Key("job").String(job).Key("enabled").Bool(p.enabled());
    w.Key("live").Bool(p.live()).Key("pinned_config").String(p.pinned_config());
    w.Key("margin").Double(p.margin()).Key("global_batch").Int(p.global_batch());
    w.Key("max_gpus").Int(p.max_gpus()).EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << "job " << job << ": " << DescribePolicy(resp.policy()) << "\n";
  }
  return absl::OkStatus();
}

absl::Status Advise(Stub* stub, const Args& args, bool json) {
  proto::AdviseRequest req;
  PTC_ASSIGN_OR_RETURN(*req.mutable_job(), args.Required("job"));
  if (args.Has("gpus")) {
    int gpus = 0;
    if (!absl::SimpleAtoi(args.Get("gpus"), &gpus) || gpus < 1)
      return absl::InvalidArgumentError("--gpus needs a number >= 1");
    req.set_gpus(gpus);
  }
  for (absl::string_view h :
       absl::StrSplit(args.Get("hosts"), ',', absl::SkipEmpty()))
    req.add_hosts(std::string(h));
  proto::AdviseResponse resp;
  PTC_RETURN_IF_ERROR(
      AskWhileAborted(&Stub::Advise, stub, req, &resp, absl::Minutes(5)));
  if (json) {
    JsonWriter w(2);
    w.BeginObject().Key("job").String(req.job()).Key("chosen").Int(resp.chosen());
    w.Key("explanation").String(resp.explanation());
    w.Key("gpu_memory_bytes").Int(resp.gpu_memory_bytes());
    w.Key("hosts").BeginArray();
    for (const auto& h : resp.hosts()) w.String(h);
    w.EndArray().Key("candidates").BeginArray();
    for (const auto& c : resp.candidates()) {
      w.BeginObject().Key("config").String(c.config()).Key("gpus").Int(c.gpus());
      w.Key("fits").Bool(c.fits()).Key("why_not").String(c.why_not());
      w.Key("state_bytes_per_gpu").Int(c.state_bytes_per_gpu());
      w.Key("gpu_bytes_needed").Int(c.gpu_bytes_needed());
      w.Key("step_seconds").Double(c.step_seconds());
      w.Key("compute_seconds").Double(c.compute_seconds());
      w.Key("bubble_seconds").Double(c.bubble_seconds());
      w.Key("tp_seconds").Double(c.tp_seconds());
      w.Key("dp_seconds").Double(c.dp_seconds());
      w.Key("bytes_moved").Int(c.bytes_moved());
      w.Key("survives_host_loss").Bool(c.survives_host_loss());
      w.Key("change_seconds").Double(c.change_seconds()).EndObject();
    }
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat(
      "job %s on %s (%s per GPU):\n  %-3s %-22s %5s %10s %10s %12s %-14s %s\n",
      req.job(), absl::StrJoin(resp.hosts(), ","),
      HumanBytes(resp.gpu_memory_bytes()), "", "CONFIG", "GPUS", "GPU MEM",
      "STEP (est)", "MOVES", "ANY HOST LOST", "");
  for (int i = 0; i < resp.candidates_size(); ++i) {
    const auto& c = resp.candidates(i);
    std::cout << absl::StrFormat(
        "  %-3s %-22s %5d %10s %9.3fs %12s %-14s %s\n", i == resp.chosen() ? "->" : "",
        c.config(), c.gpus(), HumanBytes(c.gpu_bytes_needed()),
        c.step_seconds(),
        c.bytes_moved() >= 0 ? HumanBytes(c.bytes_moved()) : "-",
        c.bytes_moved() < 0 ? "-" : c.survives_host_loss() ? "survives" : "loses state",
        c.fits() ? c.why_not() : "does not fit: " + c.why_not());
  }
  std::cout << (resp.chosen() >= 0 ? "chosen: " : "no choice: ")
            << resp.explanation() << "\n";
  return absl::OkStatus();
}

absl::Status ChangeHostsCommand(Stub* stub, const Args& args, bool json) {
  proto::ChangeHostsRequest req;
  const std::string& op = args.positional()[0];
  if (op != "add" && op != "drain")
    return absl::InvalidArgumentError("ptcctl hosts add|drain h1,h2,...");
  if (args.positional().size() < 2)
    return absl::InvalidArgumentError(
        absl::StrCat("ptcctl hosts ", op, " needs host names"));
  req.set_op(op == "add" ? proto::ChangeHostsRequest::OP_ADD
                         : proto::ChangeHostsRequest::OP_DRAIN);
  for (absl::string_view h :
       absl::StrSplit(args.positional()[1], ',', absl::SkipEmpty()))
    req.add_hosts(std::string(h));
  req.set_job(args.Get("job"));
  proto::ChangeHostsResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::ChangeHosts, stub, req, &resp));
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("changing").BeginArray();
    for (const auto& j : resp.changing()) w.String(j);
    w.EndArray().Key("manual").BeginArray();
    for (const auto& j : resp.manual()) w.String(j);
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat("%s %s\n", op == "add" ? "added" : "drained",
                               absl::StrJoin(req.hosts(), ", "));
  if (!resp.changing().empty())
    std::cout << "  changing by themselves: "
              << absl::StrJoin(resp.changing(), ", ") << "\n";
  if (!resp.manual().empty())
    std::cout << "  still on a drained host, automatic changes off (move them "
                 "with ptcctl reconfigure): "
              << absl::StrJoin(resp.manual(), ", ") << "\n";
  return absl::OkStatus();
}

absl::Status Reconfigure(Stub* stub, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(proto::ReconfigureRequest req, ChangeRequest(args));
  req.set_after_save(args.Flag("after-save"));
  req.set_hot(args.Flag("hot"));
  if (req.hot() && !req.after_save()) {
    return absl::InvalidArgumentError(
        "--hot is for live jobs' changes: give --after-save with it");
  }
  int pulls = 0;
  if (args.Has("parallel-pulls") &&
      (!absl::SimpleAtoi(args.Get("parallel-pulls"), &pulls) || pulls < 1 ||
       pulls > kMaxParallelPulls)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--parallel-pulls needs a number from 1 to ", kMaxParallelPulls));
  }
  req.set_parallel_pulls(pulls);
  PTC_ASSIGN_OR_RETURN(proto::Transport transport,
                       ParseTransport(args.Get("transport")));
  PTC_ASSIGN_OR_RETURN(proto::PlanStrategy strategy,
                       ParseStrategy(args.Get("strategy")));
  req.set_transport(transport);
  req.set_strategy(strategy);
  proto::ReconfigureResponse started;
  PTC_RETURN_IF_ERROR(AskWhileAborted(&Stub::Reconfigure, stub, req, &started));
  if (req.after_save()) {
    if (json) {
      JsonWriter w;
      w.BeginObject().Key("job").String(req.job()).Key("pending").String(req.to());
      w.Key("plan");
      WriteSummary(started.plan(), &w);
      w.EndObject();
      std::cout << w.str() << "\n";
    } else {
      std::cout << absl::StrFormat(
          "job %s: the change to %s (%s across hosts) starts when its "
          "processes have saved their next step (ptcctl status %s)\n",
          req.job(), req.to(), HumanBytes(started.plan().cross_host_bytes()),
          req.job());
    }
    return absl::OkStatus();
  }
  return FollowChange(stub, req, started, json);
}

// Prints a started change's plan, follows it to its end with a progress
// line, and reports (reconfigure and restore).
absl::Status FollowChange(Stub* stub, const proto::ReconfigureRequest& req,
                          const proto::ReconfigureResponse& started,
                          bool json) {
  const proto::PlanSummary& plan = started.plan();
  if (!json) {
    std::cout << absl::StrFormat(
        "job %s: epoch %d, version %d -> %d, to %s\n  plan: %s kept in place, "
        "%s copied within "
        "hosts, %s across hosts (lower bound %s), largest send %s\n",
        req.job(), started.plan_epoch(), started.source_version(),
        started.target_version(), req.to(),
        HumanBytes(plan.kept_in_place_bytes()),
        HumanBytes(plan.copied_within_host_bytes()),
        HumanBytes(plan.cross_host_bytes()),
        HumanBytes(plan.cross_host_bytes_lower_bound()),
        HumanBytes(plan.max_host_send_bytes()));
    std::cout << FormatPlacement(plan) << std::flush;
  }
  grpc::ClientContext ctx;
  proto::WatchRequest watch;
  watch.set_job(req.job());
  auto reader = stub->Watch(&ctx, watch);
  proto::ReconfigureEvent e, last;
  const bool tty = isatty(STDERR_FILENO);
  const absl::Time start = absl::Now();
  absl::Time printed = absl::InfinitePast();
  while (reader->Read(&e)) {
    if (e.plan_epoch() != started.plan_epoch()) continue;
    last = e;
    if (json) continue;
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    const double frac =
        e.bytes_total() > 0
            ? static_cast<double>(e.bytes_done()) / e.bytes_total()
            : 0;
    const double rate = secs > 0 ? e.bytes_done() / secs : 0;
    // No estimate before bytes move, and none left to give once all moved.
    const std::string eta =
        e.bytes_done() >= e.bytes_total()
            ? "-"
            : rate > 0 ? HumanSeconds((e.bytes_total() - e.bytes_done()) / rate)
                       : "?";
    const std::string line = absl::StrFormat(
        "  %-10s %s %5.1f%%  %s / %s  %s/s  ETA %s  hosts %d/%d",
        PhaseName(e.phase()),
        Bar(frac, 30), 100 * frac, HumanBytes(e.bytes_done()),
        HumanBytes(e.bytes_total()), HumanBytes(rate), eta,
        e.hosts_done(), e.hosts_total());
    if (tty) {
      std::cerr << "\r" << line << std::flush;
    } else if (absl::Now() - printed > absl::Seconds(1) ||
               PhaseEnded(e.phase())) {
      std::cerr << line << "\n";
      printed = absl::Now();
    }
  }
  if (tty && !json) std::cerr << "\n";
  PTC_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  const bool ok = last.phase() == proto::PHASE_COMMITTED;
  const double secs = last.seconds();
  // The plan that ran: the coordinator plans again around a source that
  // did not answer at the change's start.
  const bool replanned = last.replanned();
  if (replanned && !json) {
    std::cout << absl::StrFormat(
        "  planned again (a source did not answer at the start): %s across "
        "hosts, largest send %s\n",
        HumanBytes(last.plan().cross_host_bytes()),
        HumanBytes(last.plan().max_host_send_bytes()));
  }
  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("job").String(req.job()).Key("plan_epoch").Int(started.plan_epoch());
    w.Key("phase")
        .String(PhaseName(last.phase()))
        .Key("source_version")
        .Int(started.source_version());
    w.Key("target_version")
        .Int(started.target_version())
        .Key("seconds")
        .Double(secs);
    w.Key("staging_seconds").Double(last.staging_seconds());
    w.Key("verifying_seconds").Double(last.verifying_seconds());
    w.Key("bytes_moved").Int(last.bytes_done());
    w.Key("bytes_from_peers").Int(last.bytes_from_peers());
    w.Key("throughput_bytes_per_second")
        .Double(secs > 0 ? last.bytes_done() / secs : 0);
    w.Key("tensors_verified").Int(last.tensors_verified());
    w.Key("snapshot_bytes_read").Int(last.snapshot_bytes_read());
    w.Key("snapshot_dir").String(last.snapshot_dir());
    w.Key("strategy").String(StrategyName(req.strategy()));
    if (!ok) w.Key("error").String(last.error());
    w.Key("replanned").Bool(replanned);
    w.Key("plan");
    WriteSummary(replanned ? last.plan() : plan, &w);
    w.EndObject();
    std::cout << w.str() << "\n";
  } else if (ok) {
    std::cout << absl::StrFormat(
        "committed version %d in %s (staging %s, verifying %s): %s moved "
        "(%s kept in place, %s copied within hosts, %s across hosts), %s/s; "
        "%d tensors' fingerprints verified\n",
        started.target_version(), HumanSeconds(secs),
        HumanSeconds(last.staging_seconds()),
        HumanSeconds(last.verifying_seconds()), HumanBytes(last.bytes_done()),
        HumanBytes(plan.kept_in_place_bytes()),
        HumanBytes(plan.copied_within_host_bytes()),
        HumanBytes(last.bytes_from_peers()),
        HumanBytes(secs > 0 ? last.bytes_done() / secs : 0),
        last.tensors_verified());
    if (last.snapshot_bytes_read() > 0) {
      std::cout << absl::StrFormat("  %s read from the snapshot %s\n",
                                   HumanBytes(last.snapshot_bytes_read()),
                                   last.snapshot_dir());
    }
  }
  if (!ok) {
    absl::Status s = absl::AbortedError(absl::StrCat(
        "the reconfiguration ",
        last.phase() == proto::PHASE_NONE ? "ended" : PhaseName(last.phase()),
        ": ", last.error(), "; the job stays at version ",
        started.source_version()));
    return json ? ReportedInJson(s) : s;  // the report says it
  }
  return absl::OkStatus();
}

absl::Status Prepare(Stub* stub, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(proto::ReconfigureRequest req, ChangeRequest(args));
  proto::PrepareResponse resp;
  PTC_RETURN_IF_ERROR(AskWhileAborted(&Stub::Prepare, stub, req, &resp));
  int64_t needed = 0, prepared = 0;
  for (const auto& h : resp.hosts()) {
    needed += h.bytes_needed();
    prepared += h.bytes_prepared();
    if (!json) {
      std::cout << absl::StrFormat(
          "  %-12s stages %9s; %9s ready or being prepared (spare pool %s)\n",
          h.name(), HumanBytes(h.bytes_needed()),
          HumanBytes(h.bytes_prepared()),
          h.capacity_bytes() > 0 ? HumanBytes(h.capacity_bytes())
                                 : std::string("off"));
    }
  }
  const absl::Time start = absl::Now();
  int64_t pending = 0;
  // With --wait: spares ready on the target hosts at the end (a pool may
  // skip some when the machine is short of memory).
  int64_t ready = 0;
  if (args.Flag("wait") && prepared > 0) {
    // Until no target host has spares left to prepare.
    std::map<std::string, std::string> addresses;
    proto::ListHostsResponse hosts;
    PTC_RETURN_IF_ERROR(
        Call(&Stub::ListHosts, stub, proto::ListHostsRequest(), &hosts));
    for (const auto& h : hosts.hosts()) addresses[h.name()] = h.address();
    std::vector<std::unique_ptr<proto::TensorStore::Stub>> stores;
    for (const auto& h : resp.hosts()) {
      if (h.bytes_prepared() == 0 || !addresses.count(h.name())) continue;
      stores.push_back(proto::TensorStore::NewStub(OpenChannel(
          addresses[h.name()], grpc::ChannelArguments(), h.name())));
    }
    const bool tty = !json && isatty(STDOUT_FILENO);
    while (true) {
      pending = ready = 0;
      for (auto& store : stores) {
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
        proto::StatsResponse stats;
        PTC_RETURN_IF_ERROR(
            FromGrpcStatus(store->Stats(&ctx, proto::StatsRequest(), &stats)));
        pending += stats.spare_queued_bytes();
        ready += stats.spare_bytes();
      }
      if (tty) {
        const double done = 1.0 - static_cast<double>(pending) / prepared;
        std::cout << absl::StrFormat("\r  %s %5.1f%% of %s ready",
                                     Bar(std::max(0.0, done), 30),
                                     100 * std::max(0.0, done),
                                     HumanBytes(prepared))
                  << std::flush;
      }
      if (pending == 0) break;
      if (absl::Now() - start > absl::Minutes(30)) {
        return absl::DeadlineExceededError(
            absl::StrCat("memory still being prepared after 30 minutes (",
                         HumanBytes(pending),
                         " left); the hosts may be short of free memory"));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (tty) std::cout << "\n";
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("job").String(req.job()).Key("to").String(req.to());
    w.Key("bytes_needed").Int(needed).Key("bytes_prepared").Int(prepared);
    if (args.Flag("wait")) w.Key("bytes_ready").Int(std::min(ready, prepared));
    w.Key("waited_seconds").Double(seconds);
    w.Key("hosts").BeginArray();
    for (const auto& h : resp.hosts()) {
      w.BeginObject().Key("name").String(h.name());
      w.Key("bytes_needed").Int(h.bytes_needed());
      w.Key("bytes_prepared").Int(h.bytes_prepared());
      w.Key("capacity_bytes").Int(h.capacity_bytes()).EndObject();
    }
    w.EndArray().Key("plan");
    WriteSummary(resp.plan(), &w);
    w.EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << absl::StrFormat(
        "job %s: the change to %s stages %s on %d hosts; %s %s\n", req.job(),
        req.to(), HumanBytes(needed), resp.hosts_size(),
        args.Flag("wait") ? HumanBytes(std::min(ready, prepared))
                          : HumanBytes(prepared),
        args.Flag("wait") ? absl::StrFormat("ready after %.1f s", seconds)
                          : std::string("ready or being prepared"));
    if (prepared < needed) {
      std::cout << "  (the rest will be allocated when the change runs: "
                   "raise ptcd --spare-pool to prepare more)\n";
    }
    std::cout << FormatPlacement(resp.plan());
  }
  return absl::OkStatus();
}

absl::Status Hosts(Stub* stub, bool json) {
  proto::ListHostsResponse resp;
  PTC_RETURN_IF_ERROR(
      Call(&Stub::ListHosts, stub, proto::ListHostsRequest(), &resp));
  if (json) {
    std::cout << HostsJson(resp) << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat("%-16s %-22s %5s %-6s %10s  %s\n", "HOST",
                               "ADDRESS", "GPUS", "STATE", "MEMORY",
                               "LAST HEARTBEAT");
  for (const auto& h : resp.hosts()) {
    std::cout << absl::StrFormat("%-16s %-22s %5d %-6s %10s  %s ago\n",
                                 h.name(), h.address(), h.gpus(),
                                 !h.alive()                  ? "DEAD"
                                 : h.draining()              ? "drain"
                                 : h.held_back_seconds() > 0 ? "held"
                                                             : "alive",
                                 HumanBytes(h.memory_bytes()),
                                 HumanSeconds(h.seconds_since_heartbeat()));
  }
  return absl::OkStatus();
}

absl::Status Jobs(Stub* stub, const std::string& job, bool json) {
  proto::ListJobsRequest req;
  req.set_job(job);
  proto::ListJobsResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::ListJobs, stub, req, &resp));
  if (json) {
    std::cout << JobsJson(resp) << "\n";
    return absl::OkStatus();
  }
  for (const auto& j : resp.jobs()) {
    std::cout << absl::StrFormat(
        "job %s: %s, %s on %s (layout epoch %d), committed version %d of step "
        "%d (%d ranks, %s)\n",
        j.job(), j.model(), j.config(), absl::StrJoin(j.hosts(), ","),
        j.layout_epoch(), j.committed_version(), j.committed_step(), j.ranks(),
        HumanBytes(j.state_bytes()));
    if (!j.survival().empty()) std::cout << "  " << j.survival() << "\n";
    if (j.small_objects_to_keep() > 0) {
      std::cout << absl::StrFormat(
          "  small objects with every copy on one host: %d, of which the "
          "coordinator keeps a copy of %d (%s)\n",
          j.small_objects_to_keep(), j.kept_small_objects(),
          HumanBytes(j.kept_small_object_bytes()));
    }
    if (j.dropped_save() > j.committed_version()) {
      std::cout << absl::StrFormat(
          "  version %d could not commit and was deleted (a host of its "
          "placement was dead, or a rank gave it up); its ranks save again\n",
          j.dropped_save());
    }
    if (j.lost_hosts_size() > 0) {
      std::cout << absl::StrFormat(
          "  no longer holding their share: %s (restarted, or not proven "
          "since they came back)\n",
          absl::StrJoin(j.lost_hosts(), ", "));
    }
    const auto& r = j.reconfiguration();
    if (r.phase() != proto::PHASE_NONE) {
      std::cout << absl::StrFormat(
          "  reconfiguration epoch %d: %s, %s%s%s\n", r.plan_epoch(),
          PhaseName(r.phase()),
          r.path() == "hot switch"
              ? "by a hot switch between the processes"
              : absl::StrCat(HumanBytes(r.bytes_done()), " of ",
                             HumanBytes(r.bytes_total())),
          r.reason().empty() ? "" : absl::StrCat("; ", r.reason()),
          r.error().empty() ? "" : absl::StrCat(" (", r.error(), ")"));
    }
    std::cout << absl::StrFormat("  %s; pool %s\n",
                                 DescribePolicy(j.auto_policy()),
                                 absl::StrJoin(j.pool(), ","));
    if (!j.pending_config().empty()) {
      std::cout << absl::StrFormat(
          "  pending: %s (%s), %s\n", j.pending_config(), j.pending_reason(),
          j.pending_hot() ? "a hot switch at the processes' next step"
                          : "once the processes saved their next step");
    }
    if (j.ranks_saved() > 0) {
      std::cout << absl::StrFormat(
          "  %d of %d ranks saved the newest save in progress (versions %s)\n",
          j.ranks_saved(), j.ranks(), absl::StrJoin(j.open_saves(), ", "));
    }
  }
  return absl::OkStatus();
}

// The ranks of `job` that run on `host`, and their GPUs: what a launcher
// there starts.
absl::Status Ranks(Stub* stub, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(const std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(const std::string host, args.Required("host"));
  proto::ListJobsRequest req;
  req.set_job(job);
  proto::ListJobsResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::ListJobs, stub, req, &resp));
  const proto::JobStatus& j = resp.jobs(0);
  std::vector<std::pair<int, int>> mine;  // (rank, gpu)
  for (int r = 0; r < j.rank_hosts_size(); ++r) {
    if (j.rank_hosts(r) == host)
      mine.push_back({r, r < j.rank_devices_size() ? j.rank_devices(r) : -1});
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("job").String(job).Key("host").String(host);
    w.Key("config").String(j.config()).Key("world_size").Int(j.ranks());
    w.Key("layout_epoch").Int(j.layout_epoch()).Key("ranks").BeginArray();
    for (const auto& [r, g] : mine) w.BeginObject().Key("rank").Int(r).Key("gpu").Int(g).EndObject();
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
  } else if (mine.empty()) {
    std::cout << "job " << job << " (" << j.config() << ") runs no rank on "
              << host << "\n";
  } else {
    std::cout << "job " << job << " (" << j.config() << ", " << j.ranks()
              << " ranks) on " << host << ":\n";
    for (const auto& [r, g] : mine)
      std::cout << "  rank " << r << " on GPU " << g << "\n";
  }
  return absl::OkStatus();
}

absl::Status AbortJob(Stub* stub, const std::string& job, bool json) {
  proto::AbortRequest req;
  req.set_job(job);
  proto::AbortResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::Abort, stub, req, &resp));
  if (json) {
    std::cout << "{\"job\":\"" << JsonEscape(job)
              << "\",\"aborting\":" << (resp.aborting() ? "true" : "false")
              << "}\n";
  } else {
    std::cout << (resp.aborting() ? "aborting the reconfiguration of "
                                  : "nothing in flight for ")
              << job << "\n";
  }
  return absl::OkStatus();
}

absl::Status ForgetJob(Stub* stub, const std::string& job, bool json) {
  proto::ForgetJobRequest req;
  req.set_job(job);
  proto::ForgetJobResponse resp;
  PTC_RETURN_IF_ERROR(Call(&Stub::ForgetJob, stub, req, &resp));
  int64_t bytes = 0;
  int versions = 0;
  std::vector<std::string> hosts;
  for (const auto& c : resp.cleared()) {
    bytes += c.bytes();
    versions += c.versions();
    hosts.push_back(c.host());
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("job").String(job);
    w.Key("was_registered").Bool(resp.was_registered());
    w.Key("bytes_deleted").Int(bytes);
    w.Key("cleared").BeginArray();
    for (const auto& c : resp.cleared()) {
      w.BeginObject().Key("host").String(c.host());
      w.Key("versions").Int(c.versions()).Key("bytes").Int(c.bytes());
      w.EndObject();
    }
    w.EndArray().Key("not_cleared").BeginArray();
    for (const std::string& n : resp.not_cleared()) w.String(n);
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << "job " << job
              << (resp.was_registered() ? " forgotten"
                                        : " was not registered any more")
              << ": "
              << (hosts.empty()
                      ? std::string("no live host held any of it")
                      : absl::StrCat(HumanBytes(bytes), " in ", versions,
                                     " versions deleted on ",
                                     absl::StrJoin(hosts, ", ")))
              << "\n";
  }
  if (resp.not_cleared_size() > 0) {
    absl::Status s = absl::AbortedError(absl::StrCat(
        "these hosts could not be cleared (run ptcctl forget again when they "
        "answer): ",
        absl::StrJoin(resp.not_cleared(), "; ")));
    return json ? ReportedInJson(s) : s;
  }
  return absl::OkStatus();
}

absl::Status SnapshotJob(Stub* stub, const Args& args, bool json) {
  proto::SnapshotRequest req;
  PTC_ASSIGN_OR_RETURN(*req.mutable_job(), args.Required("job"));
  PTC_ASSIGN_OR_RETURN(*req.mutable_root(), args.Required("to"));
  auto number = [&](const char* flag, int64_t* out) -> absl::Status {
    if (args.Has(flag) && !absl::SimpleAtoi(args.Get(flag), out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " needs a whole number"));
    }
    return absl::OkStatus();
  };
  int64_t keep = 0, every_versions = 0, every_minutes = 0, rate = 0;
  PTC_RETURN_IF_ERROR(number("keep", &keep));
  PTC_RETURN_IF_ERROR(number("every-versions", &every_versions));
  PTC_RETURN_IF_ERROR(number("every-minutes", &every_minutes));
  if (args.Has("rate")) {
    PTC_ASSIGN_OR_RETURN(rate, ParseBytes(args.Get("rate")));
  }
  req.set_keep(static_cast<int32_t>(std::clamp<int64_t>(keep, -1, 100000)));
  req.set_every_versions(every_versions);
  req.set_every_seconds(every_minutes * 60);
  req.set_max_bytes_per_second(rate);
  req.set_policy_only(args.Flag("policy-only"));
  grpc::ClientContext ctx;
  auto reader = stub->Snapshot(&ctx, req);
  proto::SnapshotEvent e, last;
  const bool tty = isatty(STDERR_FILENO);
  const absl::Time start = absl::Now();
  absl::Time printed = absl::InfinitePast();
  while (reader->Read(&e)) {
    last = e;
    if (json || e.done()) continue;
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    const double frac =
        e.bytes_total() > 0 ? static_cast<double>(e.bytes_done()) / e.bytes_total()
                            : 0;
    const std::string line = absl::StrFormat(
        "  writing %s %5.1f%%  %s / %s  %s/s  hosts %d", Bar(frac, 30),
        100 * frac, HumanBytes(e.bytes_done()), HumanBytes(e.bytes_total()),
        HumanBytes(secs > 0 ? e.bytes_done() / secs : 0), e.hosts());
    if (tty) {
      std::cerr << "\r" << line << std::flush;
    } else if (absl::Now() - printed > absl::Seconds(1)) {
      std::cerr << line << "\n";
      printed = absl::Now();
    }
  }
  if (tty && !json) std::cerr << "\n";
  PTC_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (json) {
    JsonWriter w(2);
    w.BeginObject().Key("job").String(req.job());
    w.Key("dir").String(last.dir()).Key("version").Int(last.version());
    w.Key("step").Int(last.step()).Key("bytes").Int(last.bytes_done());
    w.Key("files").Int(last.files()).Key("hosts").Int(last.hosts());
    w.Key("seconds").Double(last.seconds());
    w.Key("bytes_per_second")
        .Double(last.seconds() > 0 ? last.bytes_done() / last.seconds() : 0);
    w.Key("removed").BeginArray();
    for (const std::string& r : last.removed()) w.String(r);
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
  } else if (req.policy_only()) {
    std::cout << "job " << req.job() << ": snapshots go to " << req.root()
              << "\n";
  } else {
    std::cout << absl::StrFormat(
        "job %s: snapshot of version %d (step %d) in %s: %s in %d files from "
        "%d hosts, %s (%s/s)\n",
        req.job(), last.version(), last.step(), last.dir(),
        HumanBytes(last.bytes_done()), last.files(), last.hosts(),
        HumanSeconds(last.seconds()),
        HumanBytes(last.seconds() > 0 ? last.bytes_done() / last.seconds()
                                      : 0));
    for (const std::string& r : last.removed())
      std::cout << "  removed the older snapshot " << r << "\n";
  }
  return absl::OkStatus();
}

absl::Status RestoreJob(Stub* stub, const Args& args, bool json) {
  proto::RestoreRequest req;
  PTC_ASSIGN_OR_RETURN(*req.mutable_job(), args.Required("job"));
  PTC_ASSIGN_OR_RETURN(*req.mutable_root(), args.Required("from"));
  PTC_ASSIGN_OR_RETURN(*req.mutable_config(), args.Required("config"));
  PTC_ASSIGN_OR_RETURN(const std::string hosts, args.Required("hosts"));
  for (absl::string_view h : absl::StrSplit(hosts, ',', absl::SkipEmpty()))
    req.add_hosts(std::string(h));
  PTC_ASSIGN_OR_RETURN(*req.mutable_placement(), PlacementFlags(args));
  proto::ReconfigureResponse started;
  PTC_RETURN_IF_ERROR(Call(&Stub::Restore, stub, req, &started));
  proto::ReconfigureRequest change;
  change.set_job(req.job());
  change.set_to(req.config());
  return FollowChange(stub, change, started, json);
}

// The consolidated full tensors of the job's newest snapshot, one
// safetensors file: each tensor assembled a slab of rows at a time from
// the snapshot's regions (only the blocks each slab needs are read).
absl::Status ExportJob(Stub* stub, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(const std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(const std::string out, args.Required("to"));
  std::string root = args.Get("from");
  if (root.empty()) {
    proto::ListJobsRequest list;
    list.set_job(job);
    proto::ListJobsResponse jobs;
    PTC_RETURN_IF_ERROR(Call(&Stub::ListJobs, stub, list, &jobs));
    if (jobs.jobs_size() == 0 || jobs.jobs(0).snapshot_root().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job, "' has no snapshots; take one with ptcctl snapshot "
          "--job ", job, " --to DIR, or name one with --from DIR"));
    }
    root = jobs.jobs(0).snapshot_root();
  }
  PTC_ASSIGN_OR_RETURN(LatestSnapshotResult snap, LatestSnapshot(root, job));
  const proto::SnapshotManifest& m = snap.manifest;
  absl::StatusOr<ModelSpec> spec = m.has_layout() ? SpecFromProto(m.layout())
                                                  : SpecForModel(m.model());
  PTC_RETURN_IF_ERROR(Annotate(spec.status(), "the snapshot's model"));
  if (static_cast<int>(spec->tensors.size()) != m.tensors_size()) {
    return absl::DataLossError("the snapshot's tensors are not its model's");
  }
  const bool all = args.Flag("all");
  std::vector<int> chosen;
  std::vector<SafetensorsEntry> entries;
  for (int t = 0; t < m.tensors_size(); ++t) {
    const TensorSpec& ts = spec->tensors[t];
    if (!all && ts.role != Role::kParameter) continue;
    chosen.push_back(t);
    entries.push_back({ts.key, ts.dtype, ts.shape});
  }
  PTC_ASSIGN_OR_RETURN(
      const std::string header,
      SafetensorsHeader(&entries, {{"format", "pt"},
                                   {"job", job},
                                   {"step", absl::StrCat(m.step())},
                                   {"version", absl::StrCat(m.version())}}));
  std::vector<std::vector<const proto::SnapshotRegion*>> regions(
      m.tensors_size());
  for (const proto::SnapshotRegion& r : m.regions())
    regions[r.tensor()].push_back(&r);
  const std::string tmp = out + ".tmp";
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  if (!file) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tmp));
  }
  // Readable by its owner and group only, as the snapshot's own files.
  chmod(tmp.c_str(), 0640);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  SnapshotReader reader(snap.dir);
  constexpr int64_t kSlabBytes = int64_t{64} << 20;
  std::vector<char> slab, piece;
  int64_t written = 0;
  for (int t : chosen) {
    const TensorSpec& ts = spec->tensors[t];
    const int64_t elem = ElementSize(ts.dtype);
    const Region full = Region::Full(ts.shape);
    const int64_t rows = ts.shape.empty() ? 1 : ts.shape[0];
    const int64_t row_bytes =
        rows > 0 ? full.volume() * elem / std::max<int64_t>(rows, 1) : 0;
    const int64_t per_slab =
        row_bytes > 0 ? std::max<int64_t>(1, kSlabBytes / row_bytes) : rows;
    for (int64_t r0 = 0; r0 < rows && full.volume() > 0; r0 += per_slab) {
      Region box = full;
      if (!ts.shape.empty()) {
        box.mutable_dim(0) = {r0, std::min(rows, r0 + per_slab)};
      }
      slab.assign(static_cast<size_t>(box.volume() * elem), 0);
      int64_t covered = 0;
      for (const proto::SnapshotRegion* e : regions[t]) {
        PTC_ASSIGN_OR_RETURN(const Region stored, RegionFromProto(e->region()));
        const Region part = stored.Intersect(box);
        if (part.empty()) continue;
        piece.resize(static_cast<size_t>(part.volume() * elem));
        PTC_RETURN_IF_ERROR(reader.Read(
            *e, ts.key, part, elem,
            [&](int64_t off, const char* src, int64_t n) {
              std::memcpy(piece.data() + off, src, static_cast<size_t>(n));
            }));
        CopyRegion(piece.data(), part, slab.data(), box, part, elem);
        covered += part.volume();
      }
      if (covered != box.volume()) {
        return absl::DataLossError(absl::StrCat(
            "the snapshot's regions of tensor '", ts.key, "' do not cover ",
            box.ToString()));
      }
      file.write(slab.data(), static_cast<std::streamsize>(slab.size()));
      written += static_cast<int64_t>(slab.size());
    }
  }
  file.flush();
  if (!file) return absl::UnavailableError(absl::StrCat("writing ", tmp));
  file.close();
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("renaming ", tmp, " to ", out));
  }
  if (json) {
    JsonWriter w(2);
    w.BeginObject().Key("job").String(job).Key("file").String(out);
    w.Key("snapshot").String(snap.dir).Key("step").Int(m.step());
    w.Key("tensors").Int(static_cast<int64_t>(chosen.size()));
    w.Key("bytes").Int(written).EndObject();
    std::cout << w.str() << "\n";
  } else {
    std::cout << absl::StrFormat(
        "exported %d tensors (%s) of job %s, step %d, from %s to %s\n",
        chosen.size(), HumanBytes(written), job, m.step(), snap.dir, out);
  }
  return absl::OkStatus();
}

// The hosts of this machine: alive, with a registered socket that is a
// Unix socket here. (A host elsewhere may name the same path; its file
// here would not be a socket, or would be one of this machine's ptcds,
// whose names it registered under.)
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> LocalHosts(
    Stub* stub) {
  proto::ListHostsResponse resp;
  PTC_RETURN_IF_ERROR(
      Call(&Stub::ListHosts, stub, proto::ListHostsRequest(), &resp));
  std::vector<std::pair<std::string, std::string>> local;
  for (const proto::HostStatus& h : resp.hosts()) {
    struct stat st = {};
    if (!h.alive() || h.socket().empty() ||
        stat(h.socket().c_str(), &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    local.emplace_back(h.name(), h.socket());
  }
  return local;
}

// The Python package this ptcctl was built beside (bazel-bin/tools/ptcctl
// -> bazel-bin/client/python/pkg), if there is one.
std::string PackageBeside(const char* argv0) {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path = n > 0 ? std::string(self, n) : std::string(argv0);
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  const std::string pkg = path.substr(0, slash) + "/../client/python/pkg";
  struct stat st = {};
  return stat((pkg + "/ptc/agent.py").c_str(), &st) == 0 ? pkg : "";
}

}  // namespace

int RunRunCommand(int argc, const char* const* argv) {
  int cut = 2;
  while (cut < argc && std::strcmp(argv[cut], "--") != 0) ++cut;
  auto args = Args::Parse(
      cut, argv, 2,
      WithSecurityOptions({"coordinator", "job", "log-dir", "master-port",
                           "mode", "python", "status", "grace"}),
      {"help", kSecurityFlag});
  auto fail = [&](const absl::Status& s, int code) {
    return Fail("ptcctl run", s, code, false, kClusterUsage);
  };
  if (args.ok() && args->Flag("help")) {
    std::cout << kClusterUsage;
    return 0;
  }
  if (!args.ok()) return fail(args.status(), 2);
  if (cut + 1 >= argc) {
    return fail(absl::InvalidArgumentError(
                    "give the command that runs one process after --, e.g. "
                    "ptcctl run --job J -- python3 train.py"),
                2);
  }
  const std::string job =
      args->positional().empty() ? args->Get("job") : args->positional()[0];
  if (job.empty())
    return fail(absl::InvalidArgumentError("--job is required"), 2);
  if (absl::Status s = ConfigureCommandSecurity(*args); !s.ok())
    return fail(s, 2);
  const char* from_env = std::getenv("PTC_COORDINATOR");
  const std::string address = args->Get(
      "coordinator",
      from_env != nullptr && *from_env != '\0' ? from_env : "127.0.0.1:7000");
  auto stub = proto::Coordinator::NewStub(
      OpenChannel(address, grpc::ChannelArguments(), "coordinator"));
  auto local = LocalHosts(stub.get());
  if (!local.ok()) return fail(local.status(), 1);
  if (local->empty()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
                    "no live ptcd of the coordinator at ", address,
                    " has its socket on this machine; start them first "
                    "(tools/local_cluster.sh up DIR)")),
                1);
  }
  // The agent gets the security settings as the environment (what the
  // client library reads).
  auto export_env = [](const char* name, const std::string& value) {
    if (!value.empty()) setenv(name, value.c_str(), 1);
  };
  export_env("PTC_TLS_CA", args->Get("tls-ca"));
  export_env("PTC_TLS_CERT", args->Get("tls-cert"));
  export_env("PTC_TLS_KEY", args->Get("tls-key"));
  if (args->Flag(kSecurityFlag)) setenv("PTC_INSECURE", "1", 1);
  if (const std::string pkg = PackageBeside(argv[0]); !pkg.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path =
        old != nullptr && *old != '\0' ? absl::StrCat(pkg, ":", old) : pkg;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  const char* python_env = std::getenv("PTC_PYTHON");
  std::vector<std::string> agent = {
      args->Get("python", python_env != nullptr && *python_env != '\0'
                              ? python_env
                              : "python3"),
      "-m",
      "ptc.agent",
      "--job",
      job,
      "--coordinator",
      address,
      "--until-done"};
  for (const auto& [host, socket] : *local)
    agent.push_back(absl::StrCat("--local=", host, "=", socket));
  for (const char* option :
       {"log-dir", "master-port", "mode", "status", "grace"}) {
    if (args->Has(option))
      agent.push_back(absl::StrCat("--", option, "=", args->Get(option)));
  }
  for (int i = cut; i < argc; ++i) agent.push_back(argv[i]);  // -- COMMAND...
  std::vector<char*> exec_argv;
  for (std::string& a : agent) exec_argv.push_back(a.data());
  exec_argv.push_back(nullptr);
  std::cerr << "ptcctl run: the agent for " << local->size()
            << " hosts of this machine (";
  for (size_t i = 0; i < local->size(); ++i)
    std::cerr << (i ? "," : "") << (*local)[i].first;
  std::cerr << ") runs job " << job << "\n";
  execvp(exec_argv[0], exec_argv.data());
  return fail(absl::NotFoundError(absl::StrCat(
                  "cannot run ", agent[0], ": ", std::strerror(errno),
                  " (give --python or PTC_PYTHON)")),
              1);
}

bool IsClusterCommand(const char* c) {
  for (const char* name : {"register", "reconfigure", "prepare", "hosts",
                           "jobs", "status", "abort", "forget", "ranks",
                           "token", "snapshot", "restore", "export",
                           "advise", "auto"}) {
    if (!std::strcmp(c, name)) return true;
  }
  return false;
}

int RunClusterCommand(int argc, const char* const* argv) {
  const std::string cmd = argv[1];
  auto args = Args::Parse(
      argc, argv, 2,
      WithSecurityOptions({"coordinator", "job", "model", "layout", "config",
                           "hosts", "to", "parallel-pulls", "transport",
                           "strategy", "placement", "colocate", "host",
                           "from", "keep", "every-versions", "every-minutes",
                           "rate", "gpus", "auto", "pin", "margin",
                           "global-batch", "micro-batches", "tokens-per-step",
                           "max-gpus", "save-timeout"}),
      {"json", "help", "wait", "policy-only", "all", "live", "unpin",
       "after-save", "hot", "no-hot", "prefer-movement", kSecurityFlag});
  const bool json = args.ok() && args->Flag("json");
  auto fail = [&](const absl::Status& s, int code) {
    return Fail("ptcctl " + cmd, s, code, json, kClusterUsage);
  };

  if (!args.ok()) return fail(args.status(), 2);
  if (args->Flag("help")) {
    std::cout << kClusterUsage;
    return 0;
  }
  if (absl::Status s = ConfigureCommandSecurity(*args); !s.ok())
    return fail(s, 2);
  const char* from_env = std::getenv("PTC_COORDINATOR");
  const std::string address = args->Get(
      "coordinator", from_env != nullptr && *from_env != '\0' ? from_env
                                                               : "127.0.0.1:7000");
  const std::shared_ptr<grpc::Channel> channel =
      OpenChannel(address, grpc::ChannelArguments(), "coordinator");
  auto stub = proto::Coordinator::NewStub(channel);
  std::string job =
      args->positional().empty() ? args->Get("job") : args->positional()[0];
  absl::Status s;
  if (cmd == "register") {
    s = Register(stub.get(), *args, json);
  } else if (cmd == "reconfigure") {
    s = Reconfigure(stub.get(), *args, json);
  } else if (cmd == "prepare") {
    s = Prepare(stub.get(), *args, json);
  } else if (cmd == "hosts" && !args->positional().empty()) {
    s = ChangeHostsCommand(stub.get(), *args, json);
  } else if (cmd == "hosts") {
    s = Hosts(stub.get(), json);
  } else if (cmd == "advise") {
    s = Advise(stub.get(), *args, json);
  } else if (cmd == "jobs") {
    s = Jobs(stub.get(), "", json);
  } else if (cmd == "ranks") {
    s = Ranks(stub.get(), *args, json);
  } else if (cmd == "snapshot") {
    s = SnapshotJob(stub.get(), *args, json);
  } else if (cmd == "restore") {
    s = RestoreJob(stub.get(), *args, json);
  } else if (cmd == "export") {
    s = ExportJob(stub.get(), *args, json);
  } else if (job.empty()) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("ptcctl ", cmd, " needs a job name")),
                2);
  } else if (cmd == "status") {
    s = Jobs(stub.get(), job, json);
  } else if (cmd == "forget") {
    s = ForgetJob(stub.get(), job, json);
  } else if (cmd == "token") {
    s = Token(stub.get(), job, json);
  } else if (cmd == "auto") {
    s = AutoJob(stub.get(), job, *args, json);
  } else {
    s = AbortJob(stub.get(), job, json);
  }
  // UNAVAILABLE from the coordinator itself (a host it asked failed: its
  // message names the host) leaves the channel connected; only a channel
  // that is not means the coordinator could not be reached.
  if (s.code() == absl::StatusCode::kUnavailable &&
      channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    s = absl::UnavailableError(absl::StrCat("cannot reach ptc-coordinator at ",
                                            address, ": ", s.message()));
  }
  if (!s.ok())
    return fail(
        s, absl::StartsWith(s.message(), "missing required option") ? 2 : 1);
  return 0;
}

}  // namespace ptc::tools
