// synthetic_job: stands in for a training job's ranks, for the local
// cluster demo and process tests (the real PyTorch job comes with the
// client library).
//
//   synthetic_job save --coordinator ADDR --job J --host NAME --socket PATH
//   [--step S] [--layout-epoch E] [--change-serial N]
//       saves step S (default 1), through the host's ptcd socket (shared
//       memory), the regions of every rank the job places on NAME into the
//       version the coordinator gives it, and reports each rank saved;
//       --layout-epoch saves under that epoch instead of the job's current
//       one (a stale rank, for tests); --change-serial saves for the
//       pending change of that serial (its hot switch did not start);
//       --perturb changes the first byte of
//       every region (replicas that diverged, for tests);
//   synthetic_job verify --coordinator ADDR --job J
//       reads every rank's regions of the committed version from its host
//       and checks every element.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "common/channel.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/crash.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/status_macros.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptc/families.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "tensor_store/local_client.h"
#include "tensor_store/store_client.h"
#include "tools/internal/synthetic.h"

namespace ptc::tools {
namespace {

struct JobView {
  proto::JobStatus status;
  ModelSpec spec;
  Layout layout;
  std::vector<std::string> rank_hosts;           // rank -> host name
  std::map<std::string, std::string> addresses;  // name -> address
};

absl::StatusOr<JobView> LoadJob(proto::Coordinator::Stub* stub,
                                const std::string& job) {
  JobView v;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ListJobsRequest req;
    req.set_job(job);
    req.set_include_layout(true);
    proto::ListJobsResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(stub->ListJobs(&ctx, req, &resp)));
    v.status = resp.jobs(0);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ListHostsResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(
        stub->ListHosts(&ctx, proto::ListHostsRequest(), &resp)));
    for (const auto& h : resp.hosts()) v.addresses[h.name()] = h.address();
  }
  PTC_ASSIGN_OR_RETURN(v.spec, v.status.has_layout()
                                   ? SpecFromProto(v.status.layout())
                                   : SpecForModel(v.status.model()));
  PTC_ASSIGN_OR_RETURN(ParallelConfig config,
                       v.spec.ParseConfig(v.status.config()));
  PTC_ASSIGN_OR_RETURN(v.layout, BuildLayout(v.spec, config));
  // Where each rank runs, as the coordinator places it.
  v.rank_hosts.assign(v.status.rank_hosts().begin(),
                      v.status.rank_hosts().end());
  if (static_cast<int>(v.rank_hosts.size()) != config.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator places ", v.rank_hosts.size(), " of job '", job,
        "''s ", config.world_size(), " ranks; are all its hosts registered?"));
  }
  return v;
}

absl::Status Save(proto::Coordinator::Stub* stub, const Args& args) {
  PTC_ASSIGN_OR_RETURN(std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(std::string host, args.Required("host"));
  PTC_ASSIGN_OR_RETURN(std::string socket, args.Required("socket"));
  int64_t step, epoch = 0, change_serial = 0;
  if (!absl::SimpleAtoi(args.Get("step", "1"), &step) || step < 0) {
    return absl::InvalidArgumentError("--step needs a number >= 0");
  }
  if (!absl::SimpleAtoi(args.Get("change-serial", "0"), &change_serial) ||
      change_serial < 0) {
    return absl::InvalidArgumentError("--change-serial needs a number >= 0");
  }
  if (args.Has("layout-epoch") &&
      (!absl::SimpleAtoi(args.Get("layout-epoch"), &epoch) || epoch < 1)) {
    return absl::InvalidArgumentError("--layout-epoch needs a positive number");
  }
  PTC_ASSIGN_OR_RETURN(JobView v, LoadJob(stub, job));
  if (epoch == 0) epoch = v.status.layout_epoch();
  int first_rank = -1;
  for (int r = 0; r < static_cast<int>(v.rank_hosts.size()); ++r) {
    if (v.rank_hosts[r] == host) {
      first_rank = r;
      break;
    }
  }
  if (first_rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' places no rank on ", host, " (", v.status.config(),
        ")"));
  }
  int64_t version;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    proto::BeginSaveRequest req;
    req.set_job(job);
    req.set_rank(first_rank);
    req.set_layout_epoch(epoch);
    req.set_step(step);
    req.set_change_serial(change_serial);
    proto::BeginSaveResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(stub->BeginSave(&ctx, req, &resp)));
    version = resp.version();
  }
  // Tensors are declared over gRPC; bytes go through shared memory.
  std::vector<TensorDecl> decls;
  for (const TensorSpec& t : v.spec.tensors)
    decls.push_back({t.key, t.dtype, t.shape});
  PTC_RETURN_IF_ERROR(
      StoreClient::Connect(v.addresses.at(host))->Declare(job, decls));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<LocalClient> local,
                       LocalClient::Connect(socket));
  // A ptcd with a token key admits the job's token ($PTC_JOB_TOKEN) only.
  PTC_RETURN_IF_ERROR(
      local->SayHello(job, JobTokenFromEnvironment()).status());
  std::set<std::pair<int, Region>> done;
  std::set<int> ranks;
  int64_t bytes = 0;
  for (int t = 0; t < v.layout.num_tensors(); ++t) {
    const TensorSpec& ts = v.spec.tensors[t];
    for (const Shard& s : v.layout.shards(t)) {
      if (v.rank_hosts[s.rank] != host) continue;
      ranks.insert(s.rank);
      if (!done.insert({t, s.region}).second)
        continue;  // ranks on a host share
      PTC_ASSIGN_OR_RETURN(LocalClient::PutBuffer buf,
                           local->AllocatePut(job, version, ts.key, s.region));
      FillSynthetic(t, ts.shape, s.region, ElementSize(ts.dtype),
                    reinterpret_cast<char*>(buf.data()));
      if (args.Flag("perturb")) buf.data()[0] ^= 0x5a;
      PTC_RETURN_IF_ERROR(local->CommitPut(&buf).status());
      bytes += buf.size();
    }
  }
  for (int rank : ranks) {
    for (const SmallObjectSpec& o : v.spec.small_objects) {
      PTC_RETURN_IF_ERROR(local->PutSmallObject(
          job, version, o.name, rank, SyntheticSmallObject(o.name, rank)));
    }
  }
  bool committed = false;
  int64_t kept = 0;
  for (int rank : ranks) {
    // Each rank's own BeginSave (the same version) says which of its small
    // objects the coordinator keeps a copy of.
    proto::BeginSaveResponse began;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      proto::BeginSaveRequest req;
      req.set_job(job);
      req.set_rank(rank);
      req.set_layout_epoch(epoch);
      req.set_step(step);
      PTC_RETURN_IF_ERROR(FromGrpcStatus(stub->BeginSave(&ctx, req, &began)));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    proto::ReportSavedRequest req;
    req.set_job(job);
    req.set_rank(rank);
    req.set_version(version);
    req.set_layout_epoch(epoch);
    for (const std::string& name : began.keep_small_objects()) {
      proto::KeptSmallObject* k = req.add_kept_small_objects();
      k->set_name(name);
      k->set_bytes(SyntheticSmallObject(name, rank));
      ++kept;
    }
    proto::ReportSavedResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(stub->ReportSaved(&ctx, req, &resp)));
    committed |= resp.committed();
  }
  std::cout << absl::StrFormat(
      "%s: saved %d ranks of job %s step %d as version %d (%d regions, %.1f "
      "MiB; %d small objects kept by the coordinator too)%s\n",
      host, ranks.size(), job, step, version, done.size(), bytes / 1048576.0,
      kept, committed ? "; version committed by all ranks" : "");
  return absl::OkStatus();
}

absl::Status Verify(proto::Coordinator::Stub* stub, const Args& args) {
  PTC_ASSIGN_OR_RETURN(std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(JobView v, LoadJob(stub, job));
  const int64_t version = v.status.committed_version();
  std::map<std::string, std::unique_ptr<StoreClient>> clients;
  int64_t regions = 0, bytes = 0;
  for (int t = 0; t < v.layout.num_tensors(); ++t) {
    const TensorSpec& ts = v.spec.tensors[t];
    for (const Shard& s : v.layout.shards(t)) {
      const std::string& host = v.rank_hosts[s.rank];
      auto& c = clients[host];
      if (!c) c = StoreClient::Connect(v.addresses.at(host));
      const std::vector<char> want =
          Synthetic(t, ts.shape, s.region, ElementSize(ts.dtype));
      std::vector<char> got(want.size());
      PTC_RETURN_IF_ERROR(Annotate(
          c->Read(job, version, ts.key, s.region, got.data(), got.size()),
          absl::StrCat("rank ", s.rank, " on ", host)));
      if (got != want) {
        return absl::DataLossError(absl::StrCat(
            "rank ", s.rank, " on ", host, ": region ", s.region.ToString(),
            " of '", ts.key, "' holds wrong values"));
      }
      ++regions;
      bytes += got.size();
    }
  }
  // Every rank holds every small object of the spec, saved by some rank of
  // an earlier config (which one is the planner's rule, tested elsewhere),
  // or, for a derive-rule object, a derived seed. Ranks of different scope
  // coordinates share a seed only when the copy rule carried it: a seed an
  // earlier change derived, copied to every stage of a pipeline that grew
  // (the stages holding the old stage's layers); a seed this version
  // derived belongs to one scope.
  struct SeedOwner {
    std::string scope, scope_but_pp;
  };
  int64_t small = 0, derived = 0;
  std::map<std::pair<std::string, std::string>, SeedOwner> seed_owner;
  const ParallelConfig& config = *v.layout.config();
  for (int rank = 0; rank < v.layout.world_size(); ++rank) {
    const std::string& host = v.rank_hosts[rank];
    auto& c = clients[host];
    if (!c) c = StoreClient::Connect(v.addresses.at(host));
    for (const SmallObjectSpec& o : v.spec.small_objects) {
      auto got_or = c->GetSmallObject(job, version, o.name, rank);
      PTC_RETURN_IF_ERROR(
          Annotate(got_or.status(), absl::StrCat("rank ", rank, " on ", host)));
      const std::string& got = *got_or;
      bool valid = false;
      for (int from = 0; from < 4096 && !valid; ++from)
        valid = got == SyntheticSmallObject(o.name, from);
      if (!valid && DerivedSeed(got) && o.new_ranks == NewRankRule::kDerive) {
        const MeshCoord coord = config.CoordOf(rank);
        SmallObjectSpec but_pp = o;
        but_pp.scope.erase(
            std::remove(but_pp.scope.begin(), but_pp.scope.end(), "pp"),
            but_pp.scope.end());
        const SeedOwner me{ScopeCoordinates(o, config, coord),
                           ScopeCoordinates(but_pp, config, coord)};
        auto [it, first] = seed_owner.emplace(std::make_pair(o.name, got), me);
        const SeedOwner& other = it->second;
        if (!first && other.scope != me.scope &&
            (other.scope_but_pp != me.scope_but_pp ||
             got == DerivedSmallObject(job, o.name, me.scope, version) ||
             got == DerivedSmallObject(job, o.name, other.scope, version))) {
          return absl::DataLossError(absl::StrCat(
              "rank ", rank, " (", me.scope, ") and the ranks at ",
              other.scope, ": small object '", o.name,
              "' holds the same derived seed"));
        }
        valid = true;
        ++derived;
      }
      if (!valid) {
        return absl::DataLossError(absl::StrCat("rank ", rank, " on ", host,
                                                ": small object '", o.name,
                                                "' holds wrong bytes"));
      }
      ++small;
    }
  }
  std::cout << absl::StrFormat(
      "verified job %s version %d (%s on %d hosts): %d rank regions, %.1f MiB, "
      "%d small objects (%d derived), every element exact\n",
      job, version, v.status.config(), v.status.hosts_size(), regions,
      bytes / 1048576.0, small, derived);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  auto args = Args::Parse(argc, argv, 2,
                          {"coordinator", "job", "host", "socket", "step",
                           "layout-epoch", "change-serial"},
                          {"perturb"});
  if ((cmd != "save" && cmd != "verify") || !args.ok()) {
    std::cerr << "usage: synthetic_job save|verify --coordinator ADDR --job J "
                 "[--host NAME --socket PATH --step S [--layout-epoch E] "
                 "[--change-serial N]]\n";
    if (!args.ok()) std::cerr << args.status().message() << "\n";
    return 2;
  }
  auto stub = proto::Coordinator::NewStub(
      OpenChannel(args->Get("coordinator", "127.0.0.1:7000"),
                  grpc::ChannelArguments(), "coordinator"));
  const absl::Status s =
      cmd == "save" ? Save(stub.get(), *args) : Verify(stub.get(), *args);
  if (!s.ok()) {
    std::cerr << "synthetic_job " << cmd << ": " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  ptc::InstallCrashHandler(argv[0]);
  return ptc::tools::Main(argc, argv);
}
