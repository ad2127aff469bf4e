#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/checksum.h"
#include "common/grpc_status.h"
#include "common/job_token.h"
#include "common/status_macros.h"
#include "ptc/families.h"
#include "ptc/fingerprint.h"
#include "ptc/layout_spec_proto.h"

namespace ptc {

namespace {

// The socket of the host's ptcd relay to `coordinator`, for a job's calls
// with `token`; empty where the daemon relays nothing, relays to another
// coordinator, or the relay is turned off (PTC_COORDINATOR_RELAY=0). A
// relayed call acts with the job's token only, so without TLS or with a
// token (a `client:JOB` certificate has none to relay).
std::string RelayTo(const LocalClient::Hello& hello,
                    const std::string& coordinator, const std::string& token) {
  const char* relay_env = std::getenv("PTC_COORDINATOR_RELAY");
  if (relay_env != nullptr && std::string(relay_env) == "0") return "";
  if (hello.coordinator_relay.empty() || hello.coordinator != coordinator)
    return "";
  if (TlsEnabled() && token.empty()) return "";
  return hello.coordinator_relay;
}

// What makes a relayed call worth asking directly: a relay this process
// cannot reach (another mount namespace), that refuses what the
// coordinator would take (a client:JOB certificate with a stale token), or
// that could not reach the coordinator (IsRelayUpstream) in as many
// attempts as the caller allowed.
bool RelayFailed(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsUnauthenticated(s) ||
         absl::IsPermissionDenied(s);
}

// How long a process that reached its host's relay asks again through it
// while the relay cannot reach the coordinator, before it makes a
// connection of its own: three times the relay's longest pause between
// attempts to connect (ptcd/coordinator_relay.cc). Leaving sooner would
// turn a reset of the host's connection, on a coordinator under load, into
// a connection per process for the rest of the process's life.
constexpr absl::Duration kRelayReconnectPatience = absl::Seconds(15);

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.job.empty())
    return absl::InvalidArgumentError("the client needs a job name");
  if (options.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is negative"));
  }
  if (options.token.empty()) options.token = JobTokenFromEnvironment();
  std::unique_ptr<Client> c(new Client(std::move(options)));
  // Its error names the socket and asks whether ptcd runs on this host.
  PTC_ASSIGN_OR_RETURN(c->local_,
                       LocalClient::Connect(c->options_.socket_path));
  PTC_ASSIGN_OR_RETURN(LocalClient::Hello hello,
                       c->local_->SayHello(c->options_.job, c->options_.token));
  c->host_ = hello.host;
  // Through the host's ptcd where it relays to this coordinator: the
  // coordinator then holds one connection per host, not per process.
  const std::string relay =
      RelayTo(hello, c->options_.coordinator, c->options_.token);
  c->relayed_ = c->options_.coordinator_relay && !relay.empty();
  // Its own connection, as each process has (several clients in one
  // process, as the scale harness's hollow ranks, would share one).
  auto direct = [&c] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    c->coordinator_ = proto::Coordinator::NewStub(OpenChannel(
        c->options_.coordinator, args, "coordinator", c->options_.token));
  };
  if (c->relayed_) {
    c->coordinator_ =
        proto::Coordinator::NewStub(OpenLocalChannel(relay, c->options_.token));
  } else {
    direct();
  }
  absl::Status refreshed = c->Refresh();
  if (c->relayed_ && IsRelayUpstream(refreshed)) {
    Backoff backoff;
    const absl::Time until = absl::Now() + std::min(kRelayReconnectPatience,
                                                    c->options_.rpc_timeout);
    while (IsRelayUpstream(refreshed) && backoff.Wait(until))
      refreshed = c->Refresh();
  }
  if (c->relayed_ && RelayFailed(refreshed)) {
    c->relayed_ = false;
    direct();
    refreshed = c->Refresh();
  }
  PTC_RETURN_IF_ERROR(refreshed);
  c->reached_coordinator_ = true;
  return c;
}

namespace {

// ListJobs, a read, asked patiently, with `max_unavailable` attempts that
// fail UNAVAILABLE at most: three (a caller that never reached the
// coordinator: where none listens, it fails within a second) to as many as
// the deadline allows (a client that did: the connection was lost, e.g.
// reset by a coordinator under load, and is made again).
absl::Status ListJobsPatiently(proto::Coordinator::Stub* stub,
                               const proto::ListJobsRequest& req,
                               proto::ListJobsResponse* resp,
                               absl::Time deadline, int max_unavailable) {
  int unavailable = 0;
  return AskPatiently(
      deadline, max_unavailable,
      [&](grpc::ClientContext* ctx) { return stub->ListJobs(ctx, req, resp); },
      &unavailable);
}

// A coordinator stub for a host's launcher or agent (the job's token from
// the environment).
std::unique_ptr<proto::Coordinator::Stub> CoordinatorStub(
    const std::string& coordinator) {
  return proto::Coordinator::NewStub(
      OpenChannel(coordinator, grpc::ChannelArguments(), "coordinator",
                  JobTokenFromEnvironment()));
}

// The brief answer for `host` (ListJobsRequest.brief, .host) as HostRanks.
absl::StatusOr<HostRanks> AskRanksOn(proto::Coordinator::Stub* stub,
                                     const std::string& coordinator,
                                     const std::string& job,
                                     const std::string& host,
                                     absl::Time deadline, int max_unavailable) {
  proto::ListJobsRequest req;
  req.set_job(job);
  req.set_brief(true);
  req.set_host(host);
  proto::ListJobsResponse resp;
  const absl::Status s =
      ListJobsPatiently(stub, req, &resp, deadline, max_unavailable);
  if (s.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("job '", job,
                                            "' is unknown to the coordinator at ",
                                            coordinator));
  }
  PTC_RETURN_IF_ERROR(
      Annotate(s, absl::StrCat("asking the coordinator at ", coordinator,
                               " which ranks run on ", host)));
  if (resp.jobs_size() != 1) {
    return absl::InternalError(absl::StrCat(
        "the coordinator at ", coordinator, " answered with ", resp.jobs_size(),
        " jobs for job '", job, "'"));
  }
  const proto::JobStatus& j = resp.jobs(0);
  HostRanks out;
  out.config = j.config();
  out.world_size = j.ranks();
  out.layout_epoch = j.layout_epoch();
  out.committed_version = j.committed_version();
  out.phase = j.reconfiguration().phase();
  out.live = j.auto_policy().live();
  out.rank0_host_address = j.rank0_host_address();
  for (int i = 0; i < j.host_ranks_size(); ++i) {
    out.ranks.push_back({j.host_ranks(i), i < j.host_rank_devices_size()
                                              ? j.host_rank_devices(i)
                                              : -1});
  }
  return out;
}

}  // namespace

absl::StatusOr<HostRanks> RanksOnHost(const std::string& coordinator,
                                      const std::string& job,
                                      const std::string& host,
                                      absl::Duration timeout,
                                      const std::string& socket_path) {
  const absl::Time deadline = absl::Now() + timeout;
  if (!socket_path.empty()) {
    // Through the host's ptcd where it relays to this coordinator: a
    // host's processes starting at once are not a connection each.
    const std::string token = JobTokenFromEnvironment();
    auto local = LocalClient::Connect(socket_path);
    absl::StatusOr<LocalClient::Hello> hello =
        local.ok() ? (*local)->SayHello(job, token) : local.status();
    const std::string relay =
        hello.ok() ? RelayTo(*hello, coordinator, token) : "";
    if (!relay.empty()) {
      auto stub = proto::Coordinator::NewStub(OpenLocalChannel(relay, token));
      absl::StatusOr<HostRanks> r =
          AskRanksOn(stub.get(), coordinator, job, host, deadline, 10);
      if (!RelayFailed(r.status())) return r;
    }
  }
  auto stub = CoordinatorStub(coordinator);
  // A fresh channel: ten attempts (about 7 s where no coordinator
  // listens), for connections a busy coordinator resets.
  return AskRanksOn(stub.get(), coordinator, job, host, deadline, 10);
}

absl::StatusOr<HostRanks> Client::RanksOn(const std::string& host) {
  return AskRanksOn(coordinator_.get(), options_.coordinator, options_.job,
                    host, absl::Now() + options_.rpc_timeout,
                    UnavailableAttempts());
}

absl::StatusOr<bool> ReportProcessExit(const std::string& coordinator,
                                       const std::string& job,
                                       const std::string& host, int gpu,
                                       int exit_code, int64_t layout_epoch,
                                       absl::Duration timeout) {
  auto stub = CoordinatorStub(coordinator);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  proto::ReportProcessExitRequest req;
  req.set_job(job);
  req.set_host(host);
  req.set_gpu(gpu);
  req.set_exit_code(exit_code);
  req.set_layout_epoch(layout_epoch);
  proto::ReportProcessExitResponse resp;
  PTC_RETURN_IF_ERROR(
      Annotate(FromGrpcStatus(stub->ReportProcessExit(&ctx, req, &resp)),
               absl::StrCat("reporting to the coordinator at ", coordinator)));
  return resp.changing();
}

absl::StatusOr<proto::JobStatus> Client::FetchJob(bool include_layout,
                                                  bool brief,
                                                  absl::Duration patience) {
  proto::ListJobsRequest req;
  req.set_job(options_.job);
  req.set_include_layout(include_layout);
  req.set_brief(brief);
  if (brief) req.set_host(host_);
  proto::ListJobsResponse resp;
  if (patience <= absl::ZeroDuration()) patience = options_.rpc_timeout;
  const absl::Status s =
      ListJobsPatiently(coordinator_.get(), req, &resp, absl::Now() + patience,
                        UnavailableAttempts());
  if (s.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(
        "job '", options_.job, "' is unknown to the coordinator at ",
        options_.coordinator, "; register it first (ptcctl register)"));
  }
  PTC_RETURN_IF_ERROR(Annotate(
      s, absl::StrCat("asking the coordinator at ", options_.coordinator)));
  return resp.jobs(0);
}

absl::Status Client::Refresh() {
  // Bound to a hot switch, the placement is the switch's, in the full
  // answer; otherwise the brief one says which ranks are on this host.
  const bool hot = options_.pending_serial != 0;
  PTC_ASSIGN_OR_RETURN(proto::JobStatus job,
                       FetchJob(/*include_layout=*/true, /*brief=*/!hot));
  return Adopt(std::move(job));
}

absl::StatusOr<int> Client::RebindToDevice(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is negative"));
  }
  if (options_.pending_serial != 0) {
    return absl::FailedPreconditionError(
        "a client bound to a hot switch takes its rank with RanksOn and "
        "Rebind");
  }
  PTC_ASSIGN_OR_RETURN(proto::JobStatus job,
                       FetchJob(/*include_layout=*/true, /*brief=*/true));
  // The rank on `device`, and the layout it is a rank of, from the same
  // answer: two questions could straddle a change.
  int rank = -1;
  for (int i = 0; i < job.host_ranks_size() && i < job.host_rank_devices_size();
       ++i) {
    if (job.host_rank_devices(i) == device) {
      rank = job.host_ranks(i);
      break;
    }
  }
  if (rank < 0) return -1;
  const int old = options_.rank;
  options_.rank = rank;
  if (absl::Status s = Adopt(std::move(job)); !s.ok()) {
    options_.rank = old;
    return s;
  }
  return rank;
}

absl::Status Client::Adopt(proto::JobStatus job) {
  const bool hot = options_.pending_serial != 0;
  if (const int64_t serial = options_.pending_serial; serial != 0) {
    // Bound to a hot switch: its target is this client's layout.
    if (!job.pending_hot() || job.pending_serial() != serial) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the hot switch ", serial, " of job '", options_.job,
          "' is no longer pending; follow the job"));
    }
    job.set_config(job.pending_config());
    *job.mutable_rank_hosts() = job.pending_rank_hosts();
    *job.mutable_rank_devices() = job.pending_rank_devices();
    job.set_layout_epoch(job.layout_epoch() + 1);
  }
  PTC_ASSIGN_OR_RETURN(ModelSpec spec, job.has_layout()
                                           ? SpecFromProto(job.layout())
                                           : SpecForModel(job.model()));
  PTC_ASSIGN_OR_RETURN(ParallelConfig config, spec.ParseConfig(job.config()));
  const int rank = options_.rank;
  if (rank >= config.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " is outside job '", options_.job, "': its config ",
        job.config(), " has ", config.world_size(),
        " ranks; start the processes the current config asks for"));
  }
  // This rank's regions only: not the whole job's layout, which every
  // process of a 16,384-rank job would build at every change.
  PTC_ASSIGN_OR_RETURN(const std::vector<std::vector<Region>> mine,
                       BuildRankRegions(spec, config, rank));
  int device = -1;
  if (!hot) {
    const auto& here = job.host_ranks();
    const auto at = std::find(here.begin(), here.end(), rank);
    if (at == here.end()) {
      // Where it is placed, from the full answer (an error path only).
      PTC_ASSIGN_OR_RETURN(proto::JobStatus full,
                           FetchJob(/*include_layout=*/false, /*brief=*/false));
      *job.mutable_rank_hosts() = full.rank_hosts();
    } else if (at - here.begin() < job.host_rank_devices_size()) {
      device = job.host_rank_devices(static_cast<int>(at - here.begin()));
    }
  } else if (rank < job.rank_devices_size()) {
    device = job.rank_devices(rank);
  }
  if (rank < job.rank_hosts_size() && job.rank_hosts(rank) != host_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of job '", options_.job, "' is placed on host '",
        job.rank_hosts(rank), "', but the ptcd at ", options_.socket_path,
        " is host '", host_, "'; run this rank on ", job.rank_hosts(rank),
        " or connect to that host's ptcd"));
  }
  std::vector<RankRegion> regions;
  for (int t = 0; t < static_cast<int>(mine.size()); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    for (const Region& r : mine[t]) {
      if (r.empty()) continue;
      regions.push_back(
          {t, ts.key, ts.dtype, ts.shape, r, r.volume() * ElementSize(ts.dtype)});
    }
  }
  // The daemon must know this rank's tensors before it stores them.
  std::vector<TensorDecl> decls;
  for (const RankRegion& r : regions) {
    if (decls.empty() || decls.back().key != r.key)
      decls.push_back({r.key, r.dtype, r.shape});
  }
  PTC_RETURN_IF_ERROR(Annotate(local_->Declare(options_.job, decls),
                               "declaring the rank's tensors to ptcd"));
  spec_ = std::move(spec);
  config_ = std::move(config);
  committed_version_ = job.committed_version();
  committed_step_ = job.committed_step();
  device_ = device;
  layout_epoch_ = job.layout_epoch();
  regions_ = std::move(regions);
  pack_candidates_.clear();
  for (const RankRegion& r : regions_) {
    pack_candidates_.push_back(
        {r.bytes, PackRequestBytes(r.key, r.region.rank())});
  }
  // A meeting before this view is not this view's: Load asks.
  met_ = Met{};
  return absl::OkStatus();
}

absl::Status Client::Rebind(int rank) {
  if (rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is negative"));
  }
  const int old = options_.rank;
  options_.rank = rank;
  absl::Status s = Refresh();
  if (!s.ok()) options_.rank = old;
  return s;
}

Client::~Client() { watch_.Stop(); }

void Client::Unfollow() { watch_.Stop(); }

namespace {

// A followed Watch stream's event as the job's processes see it.
JobEvent EventOf(const proto::ReconfigureEvent& e) {
  JobEvent j;
  j.known = true;
  j.layout_epoch = e.layout_epoch();
  j.committed_version = e.committed_version();
  j.dropped_save = e.dropped_save();
  j.pending_config = e.pending_config();
  j.pending_hot = e.pending_hot();
  j.pending_serial = e.pending_serial();
  j.path = e.path();
  j.plan_epoch = e.plan_epoch();
  j.phase = e.phase();
  j.reason = e.reason();
  j.error = e.error();
  return j;
}

}  // namespace

absl::StatusOr<JobEvent> Client::FetchEvent(absl::Duration patience) {
  PTC_ASSIGN_OR_RETURN(
      proto::JobStatus job,
      FetchJob(/*include_layout=*/false, /*brief=*/true, patience));
  // The event a followed Watch stream would send now.
  proto::ReconfigureEvent e = job.reconfiguration();
  e.set_layout_epoch(job.layout_epoch());
  e.set_committed_version(job.committed_version());
  e.set_dropped_save(job.dropped_save());
  e.set_pending_config(job.pending_config());
  e.set_pending_hot(job.pending_hot());
  e.set_pending_serial(job.pending_serial());
  return EventOf(e);
}

void JobWatch::Start(proto::Coordinator::Stub* stub, const std::string& job) {
  if (thread_.joinable()) return;
  thread_ = std::thread([this, stub, job] {
    while (true) {
      grpc::ClientContext ctx;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        ctx_ = &ctx;
      }
      proto::WatchRequest req;
      req.set_job(job);
      req.set_follow(true);
      auto reader = stub->Watch(&ctx, req);
      proto::ReconfigureEvent e;
      while (reader->Read(&e)) {
        JobEvent j = EventOf(e);
        absl::MutexLock lock(&mu_);
        j.received = latest_.received + 1;
        latest_ = std::move(j);
      }
      reader->Finish().ok();
      absl::MutexLock lock(&mu_);
      ctx_ = nullptr;
      if (stop_) return;
      // The coordinator went away or restarted: follow it again shortly.
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(200));
    }
  });
}

void JobWatch::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  stop_ = false;
}

JobEvent JobWatch::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

JobEvent JobWatch::Wait(int64_t after, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const auto told = [this, after]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return latest_.received > after;
  };
  mu_.AwaitWithTimeout(absl::Condition(&told), timeout);
  return latest_;
}

JobFollower::JobFollower(const std::string& coordinator, const std::string& job)
    : coordinator_(coordinator),
      job_(job),
      stub_(CoordinatorStub(coordinator)) {
  watch_.Start(stub_.get(), job_);
}

absl::StatusOr<HostRanks> JobFollower::RanksOn(const std::string& host,
                                               absl::Duration timeout) {
  // One channel for the follower's life: asked again where a busy
  // coordinator resets it, as a fresh one would be (ten attempts).
  return AskRanksOn(stub_.get(), coordinator_, job_, host,
                    absl::Now() + timeout, 10);
}

void Client::Follow() { watch_.Start(coordinator_.get(), options_.job); }

JobEvent Client::LatestEvent() const { return watch_.Latest(); }

JobEvent Client::WaitEvent(int64_t after, absl::Duration timeout) const {
  return watch_.Wait(after, timeout);
}

absl::StatusOr<std::string> Client::Rendezvous(int64_t layout_epoch, int port,
                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  proto::RendezvousRequest req;
  req.set_job(options_.job);
  req.set_layout_epoch(layout_epoch);
  req.set_rank(options_.rank);
  req.set_port(options_.rank == 0 ? port : 0);
  const std::string what =
      absl::StrCat("rank ", options_.rank, " of job '", options_.job,
                   "' meeting under layout epoch ", layout_epoch);
  while (true) {
    grpc::ClientContext ctx;
    // The coordinator holds the call until every rank is there, or for
    // what the deadline leaves less room for the answer (20 s at most),
    // then answers UNAVAILABLE: ask again at once.
    const absl::Time asked = absl::Now();
    ctx.set_deadline(absl::ToChronoTime(
        asked + std::max(options_.rpc_timeout, absl::Seconds(5))));
    proto::RendezvousResponse resp;
    const absl::Status s =
        FromGrpcStatus(coordinator_->Rendezvous(&ctx, req, &resp));
    if (s.ok()) {
      // What Load needs when every rank was there (Met).
      met_ = Met{layout_epoch, resp.committed_version(), resp.committed_step()};
      return resp.address();
    }
    // UNAVAILABLE: not every rank is here yet, or the coordinator is
    // briefly away (DEADLINE_EXCEEDED: busy): ask again until the deadline.
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s))
      return Annotate(s, what);
    if (absl::Now() > deadline) {
      return Annotate(s, absl::StrCat(what, ", given up after ",
                                      absl::FormatDuration(timeout)));
    }
    // An answer that came at once (the coordinator away, or one that does
    // not hold calls) is not asked again at once.
    if (absl::Now() - asked < absl::Milliseconds(200))
      absl::SleepFor(absl::Milliseconds(50));
  }
}

std::vector<int> Client::RegionsOf(const std::string& key) const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(regions_.size()); ++i)
    if (regions_[i].key == key) out.push_back(i);
  return out;
}

absl::StatusOr<std::unique_ptr<Client::Save>> Client::BeginSave(
    int64_t step, int64_t change_serial, std::optional<int64_t> known_dropped) {
  // A save may commit a version after the meeting's: Load asks again.
  met_ = Met{};
  proto::BeginSaveRequest req;
  req.set_job(options_.job);
  req.set_rank(options_.rank);
  req.set_layout_epoch(layout_epoch_);
  req.set_step(step);
  req.set_pending_serial(options_.pending_serial);
  req.set_change_serial(change_serial);
  if (known_dropped.has_value()) {
    req.set_check_dropped(true);
    req.set_known_dropped(*known_dropped);
  }
  proto::BeginSaveResponse resp;
  // Asked again if refused or the connection failed: every rank's
  // BeginSave of one step gets the same version, however often it asks.
  int unavailable = 0;
  PTC_RETURN_IF_ERROR(Annotate(
      AskPatiently(
          absl::Now() + options_.rpc_timeout, INT_MAX,
          [&](grpc::ClientContext* ctx) {
            return coordinator_->BeginSave(ctx, req, &resp);
          },
          &unavailable),
      absl::StrCat("beginning the save of step ", step)));
  std::unique_ptr<Save> save(new Save(this, resp.version(), step));
  save->keep_.assign(resp.keep_small_objects().begin(),
                     resp.keep_small_objects().end());
  return save;
}

Client::Save::Save(Client* client, int64_t version, int64_t step)
    : client_(client),
      version_(version),
      step_(step),
      buffers_(client->regions_.size()),
      filled_(client->regions_.size()),
      written_checksums_(client->regions_.size()) {}

Client::Save::~Save() {
  if (committed_) return;
  // An abandoned save leaves nothing behind in the daemon.
  for (auto& b : buffers_)
    if (b) client_->local_->AbortPut(&*b).IgnoreError();
}

absl::StatusOr<absl::Span<uint8_t>> Client::Save::Buffer(int i, bool populate) {
  PTC_ASSIGN_OR_RETURN(LocalClient::PutBuffer * b, Slot(i));
  PTC_RETURN_IF_ERROR(b->Map(populate));
  // The caller may change the bytes: ptcd checksums what it stores at Commit.
  written_checksums_[i].reset();
  filled_[i] = true;
  return absl::Span<uint8_t>(b->data(), static_cast<size_t>(b->size()));
}

absl::StatusOr<LocalClient::PutBuffer*> Client::Save::Slot(int i) {
  if (i < 0 || i >= static_cast<int>(buffers_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("region ", i, " of rank ", client_->rank(),
                     " is out of [0, ", buffers_.size(), ")"));
  }
  if (committed_)
    return absl::FailedPreconditionError("this save is already committed");
  if (!buffers_[i]) {
    const RankRegion& r = client_->regions_[i];
    PTC_ASSIGN_OR_RETURN(
        LocalClient::PutBuffer b,
        client_->local_->AllocatePut(client_->job(), version_, r.key, r.region,
                                     /*map=*/false));
    buffers_[i] = std::move(b);
  }
  return &*buffers_[i];
}

absl::Status Client::Save::AllocatePack(int i) {
  if (i < 0 || i >= static_cast<int>(buffers_.size()) || committed_ ||
      buffers_[i]) {
    return absl::OkStatus();  // Slot says what is wrong, or has it already
  }
  // As the coordinator expects it (ptc/packs.h), so that the memory ptcd
  // prepared for the save fits.
  std::vector<bool> taken(buffers_.size());
  for (size_t j = 0; j < buffers_.size(); ++j)
    taken[j] = buffers_[j].has_value();
  const std::vector<size_t> members =
      NextPack(client_->pack_candidates_, static_cast<size_t>(i), taken);
  if (members.empty()) return absl::OkStatus();  // alone
  std::vector<std::pair<std::string, Region>> items;
  for (size_t j : members)
    items.emplace_back(client_->regions_[j].key, client_->regions_[j].region);
  PTC_ASSIGN_OR_RETURN(
      std::vector<LocalClient::PutBuffer> puts,
      client_->local_->AllocatePuts(client_->job(), version_, items));
  for (size_t m = 0; m < members.size(); ++m)
    buffers_[members[m]] = std::move(puts[m]);
  return absl::OkStatus();
}

absl::Status Client::Save::Write(int i, absl::Span<const uint8_t> bytes) {
  PTC_RETURN_IF_ERROR(AllocatePack(i));
  PTC_ASSIGN_OR_RETURN(LocalClient::PutBuffer * b, Slot(i));
  if (static_cast<int64_t>(bytes.size()) != b->size()) {
    const RankRegion& r = client_->regions_[i];
    return absl::InvalidArgumentError(
        absl::StrCat("region ", i, " (", r.key, " ", r.region.ToString(),
                     ") holds ", b->size(), " bytes but ", bytes.size(),
                     " were given (shape or dtype does not match the layout)"));
  }
  // In chunks that stay in the L2 cache between the checksum and the copy;
  // a small region through the buffer's descriptor, a large one through a
  // mapping (see kCopyThroughDescriptorBelow).
  const bool through_fd = b->size() < kCopyThroughDescriptorBelow;
  if (!through_fd) PTC_RETURN_IF_ERROR(b->Map());
  constexpr size_t kChunk = 256 << 10;
  StreamingChecksum sum;
  for (size_t off = 0; off < bytes.size(); off += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - off);
    sum.Update(bytes.data() + off, n);
    if (through_fd) {
      PTC_RETURN_IF_ERROR(b->Write(static_cast<int64_t>(off),
                                   bytes.data() + off, static_cast<int64_t>(n)));
    } else {
      std::memcpy(b->data() + off, bytes.data() + off, n);
    }
  }
  written_checksums_[i] = sum.Digest();
  filled_[i] = true;
  return absl::OkStatus();
}

absl::Status Client::Save::WriteHollow(int i) {
  // In the packs a real save allocates (one call for a pack's regions):
  // a hollow rank asks its ptcd what a real one would.
  PTC_RETURN_IF_ERROR(AllocatePack(i));
  PTC_ASSIGN_OR_RETURN(LocalClient::PutBuffer * b, Slot(i));
  if (!b->hollow()) {
    return absl::FailedPreconditionError(
        "only a hollow ptcd (a scale test's) takes a region without its "
        "bytes; write them with Write or Buffer");
  }
  const RankRegion& r = client_->regions_[i];
  // What the hollow daemon stores as the region's checksum.
  written_checksums_[i] =
      HollowFingerprint(r.region, r.shape, ElementSize(r.dtype));
  filled_[i] = true;
  return absl::OkStatus();
}

absl::Status Client::Save::PutSmallObject(const std::string& name,
                                          const std::string& bytes) {
  const auto& objects = client_->spec_.small_objects;
  if (std::none_of(objects.begin(), objects.end(),
                   [&](const SmallObjectSpec& o) { return o.name == name; })) {
    std::vector<std::string> names;
    for (const SmallObjectSpec& o : objects) names.push_back(o.name);
    return absl::InvalidArgumentError(
        absl::StrCat("small object '", name,
                     "' is not in the model spec; it "
                     "has: ",
                     absl::StrJoin(names, ", ")));
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxSmallObjectBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("small object '", name, "' has ", bytes.size(),
                     " bytes; at most ", kMaxSmallObjectBytes, " fit"));
  }
  small_[name] = bytes;
  return absl::OkStatus();
}

absl::Status Client::Save::Publish() {
  const std::vector<RankRegion>& regions = client_->regions_;
  LocalClient& local = *client_->local_;
  const std::string& job = client_->job();
  // The daemon checksums what it stores, on several threads; the checksum
  // a region was written with (Write) is checked against it. A region
  // filled in place (Buffer: the GPU's copies) is not read here at all.
  std::vector<LocalClient::PutBuffer*> puts;
  std::vector<uint64_t> written;
  for (size_t i = 0; i < regions.size(); ++i) {
    puts.push_back(&*buffers_[i]);
    written.push_back(written_checksums_[i].value_or(0));
  }
  PTC_ASSIGN_OR_RETURN(std::vector<LocalClient::PutResult> stored,
                       local.CommitPuts(puts, written));
  for (size_t i = 0; i < regions.size(); ++i) {
    if (stored[i].status.code() == absl::StatusCode::kAlreadyExists) {
      // Another rank on this host (a data-parallel replica, or the other
      // stage holding a tied embedding) saved this region first: keep one
      // copy, but only if the replicas agree.
      PTC_ASSIGN_OR_RETURN(LocalClient::Mapping m,
                           local.Map(job, version_, regions[i].key,
                                     regions[i].region, /*map=*/false));
      if (m.checksum() != stored[i].checksum) {
        return absl::DataLossError(absl::StrCat(
            "rank ", client_->rank(), "'s copy of ", regions[i].key, " ",
            regions[i].region.ToString(),
            " differs from the copy another rank on this host saved in "
            "version ",
            version_, ": replicas diverged"));
      }
    } else if (!stored[i].status.ok()) {
      return Annotate(stored[i].status,
                      absl::StrCat("saving ", regions[i].key, " ",
                                   regions[i].region.ToString()));
    }
  }
  for (const auto& [name, bytes] : small_) {
    PTC_RETURN_IF_ERROR(
        local.PutSmallObject(job, version_, name, client_->rank(), bytes));
  }
  return absl::OkStatus();
}

absl::Status Client::Save::GiveUp(const std::string& why) {
  if (committed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version_,
        " was reported saved; the coordinator commits or deletes it"));
  }
  if (given_up_) return absl::OkStatus();
  if (client_->options_.pending_serial != 0) {
    return absl::FailedPreconditionError(
        "a hot switch's save is not given up: the switch fails on every "
        "process instead, and the change goes through the store");
  }
  proto::ReportSavedRequest req;
  req.set_job(client_->job());
  req.set_rank(client_->rank());
  req.set_version(version_);
  req.set_layout_epoch(client_->layout_epoch_);
  req.set_failed(why.empty() ? "no reason given" : why);
  proto::ReportSavedResponse resp;
  // Asked again while the coordinator is busy (committing another save)
  // or its connection fails, until the call's deadline, as a report is.
  int unavailable = 0;
  const absl::Status s = AskPatiently(
      absl::Now() + client_->options_.rpc_timeout,
      client_->UnavailableAttempts(),
      [&](grpc::ClientContext* ctx) {
        return client_->coordinator_->ReportSaved(ctx, req, &resp);
      },
      &unavailable);
  if (s.ok()) given_up_ = true;
  return Annotate(
      s, absl::StrCat("giving version ", version_, " up at the coordinator"));
}

absl::StatusOr<bool> Client::Save::Commit() {
  if (committed_)
    return absl::FailedPreconditionError("this save is already committed");
  if (given_up_) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version_, " was given up; begin a new save"));
  }
  const std::vector<RankRegion>& regions = client_->regions_;
  for (size_t i = 0; i < regions.size(); ++i) {
    if (!filled_[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", regions[i].region.ToString(), " of '", regions[i].key,
          "' was not written; fill every region of the rank before Commit"));
    }
  }
  std::vector<std::string> missing;
  for (const SmallObjectSpec& o : client_->spec_.small_objects)
    if (!small_.count(o.name)) missing.push_back(o.name);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "small objects missing: ", absl::StrJoin(missing, ", "),
        "; a reconfiguration gives each new rank these, so save them all"));
  }
  if (absl::Status published = Publish(); !published.ok()) {
    // The version can no longer commit: the ranks that reported it are
    // told, instead of waiting for a commit that never comes.
    const absl::Status given_up = GiveUp(std::string(published.message()));
    return Annotate(
        published,
        given_up.ok()
            ? absl::StrCat("version ", version_,
                           " was given up (the job's ranks save again)")
            : absl::StrCat("giving version ", version_, " up failed too (",
                           given_up.message(), ")"));
  }
  const std::string& job = client_->job();
  committed_ = true;
  proto::ReportSavedRequest req;
  req.set_job(job);
  req.set_rank(client_->rank());
  req.set_version(version_);
  req.set_layout_epoch(client_->layout_epoch_);
  // Objects whose every copy is on this host: the coordinator keeps them
  // too, so that the host's loss does not lose them (a larger one cannot
  // be kept, and the job's survival line says so).
  for (const std::string& name : keep_) {
    auto it = small_.find(name);
    if (it == small_.end()) continue;
    if (static_cast<int64_t>(it->second.size()) > kMaxKeptSmallObjectBytes)
      continue;
    proto::KeptSmallObject* k = req.add_kept_small_objects();
    k->set_name(name);
    k->set_bytes(it->second);
  }
  proto::ReportSavedResponse resp;
  // A rank's report counts once however often it is sent; it is sent
  // again while the coordinator asks for it again (it is committing
  // another save) or the connection failed.
  int unavailable = 0;
  absl::Status first_unavailable;
  absl::Status reported = AskPatiently(
      absl::Now() + client_->options_.rpc_timeout, INT_MAX,
      [&](grpc::ClientContext* ctx) {
        grpc::Status s = client_->coordinator_->ReportSaved(ctx, req, &resp);
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
            first_unavailable.ok())
          first_unavailable = FromGrpcStatus(s);
        return s;
      },
      &unavailable);
  if (unavailable > 0 && absl::IsFailedPrecondition(reported)) {
    // No longer a save in progress after a report that failed: either
    // that report completed it (its answer was lost), or its hosts could
    // not prove it and it was dropped (the first failure says why).
    // Still UNAVAILABLE for the latter (ptc.elastic then waits for the
    // change that a host lost during the save brings), saying so.
    PTC_ASSIGN_OR_RETURN(JobEvent now, client_->FetchEvent());
    reported =
        now.committed_version >= version_
            ? absl::OkStatus()
            : absl::UnavailableError(absl::StrCat(
                  "version ", version_,
                  " was dropped, not committed, after this rank's report "
                  "was cut off (",
                  first_unavailable.message(),
                  "): a host of the job likely died as it saved; the "
                  "coordinator changes the job around it if it can"));
  }
  PTC_RETURN_IF_ERROR(
      Annotate(reported, "reporting the save to the coordinator"));
  if (resp.committed()) {
    // This rank's own commit: its view moves with it.
    client_->committed_version_ = version_;
    client_->committed_step_ = step_;
  }
  return resp.committed();
}

absl::StatusOr<absl::Span<const uint8_t>> Client::State::Region(
    int i) const {
  PTC_RETURN_IF_ERROR(CheckIndex(i));
  absl::MutexLock lock(&mu_);
  LocalClient::Mapping& m = mappings_[i];
  PTC_RETURN_IF_ERROR(Annotate(
      m.MapNow(), absl::StrCat("mapping ", regions_[i].key, " ",
                               regions_[i].region.ToString())));
  return absl::Span<const uint8_t>(m.data(), static_cast<size_t>(m.size()));
}

absl::Status Client::State::Read(int i, absl::Span<uint8_t> dst) const {
  PTC_RETURN_IF_ERROR(CheckIndex(i));
  const LocalClient::Mapping& m = mappings_[i];
  if (static_cast<int64_t>(dst.size()) != m.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", i, " (", regions_[i].key, " ",
        regions_[i].region.ToString(), ") holds ", m.size(), " bytes; ",
        dst.size(), " were asked for (shape or dtype does not match)"));
  }
  if (m.size() >= kCopyThroughDescriptorBelow) {
    PTC_ASSIGN_OR_RETURN(absl::Span<const uint8_t> src, Region(i));
    std::memcpy(dst.data(), src.data(), src.size());
    return absl::OkStatus();
  }
  return Annotate(m.Read(0, dst.data(), m.size()),
                  absl::StrCat("reading ", regions_[i].key, " ",
                               regions_[i].region.ToString()));
}

Client::State::~State() {
  if (local_ != nullptr) local_->Release(&mappings_).IgnoreError();
}

absl::Status Client::State::CheckIndex(int i) const {
  if (i < 0 || i >= static_cast<int>(mappings_.size())) {
    return absl::OutOfRangeError(absl::StrCat(
        "region ", i, " is outside the loaded ", mappings_.size(), " regions"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Client::State::SmallObject(
    const std::string& name) const {
  auto it = small_.find(name);
  if (it == small_.end()) {
    return absl::NotFoundError(
        absl::StrCat("small object '", name, "' is not in the model spec"));
  }
  return it->second;
}

absl::StatusOr<std::unique_ptr<Client::State>> Client::Load() {
  // What this client's Watch stream said last (nothing where it does not
  // follow): a newer layout is known without asking.
  const JobEvent seen = watch_.Latest();
  if (met_.layout_epoch == layout_epoch_ && met_.committed_version > 0 &&
      met_.committed_version >= committed_version_ &&
      !(seen.known && seen.layout_epoch > layout_epoch_)) {
    // Just met every rank of this layout, with no save open: what was
    // committed then is what is committed now (no save of the epoch
    // commits before these ranks save again; a later layout is found by
    // following the job, as after any load). One question fewer per
    // process and change. Once: a later Load asks.
    committed_version_ = met_.committed_version;
    committed_step_ = met_.committed_step;
    met_ = Met{};
  } else {
    // What is committed now, not when this client last looked.
    PTC_ASSIGN_OR_RETURN(proto::JobStatus now, FetchJob());
    if (now.layout_epoch() != layout_epoch_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", options_.job, "' changed its layout (epoch ", layout_epoch_,
          " -> ", now.layout_epoch(), ", now ", now.config(),
          ") since this client read it; Refresh() and rebuild the local "
          "shards before loading"));
    }
    committed_version_ = now.committed_version();
    committed_step_ = now.committed_step();
  }
  const int64_t version = committed_version_;
  if (version == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", options_.job, "' has no committed version to load yet"));
  }
  PTC_ASSIGN_OR_RETURN(LocalClient::Hello hello,
                       local_->SayHello(job(), options_.token));
  if (std::find(hello.committed_versions.begin(),
                hello.committed_versions.end(),
                version) == hello.committed_versions.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " of job '", options_.job,
        "' is gone from this host's ptcd (", host_, " holds ",
        hello.committed_versions.empty()
            ? std::string("no committed version")
            : absl::StrCat("versions ",
                           absl::StrJoin(hello.committed_versions, ", ")),
        "); Refresh() after a reconfiguration, or the ptcd restarted"));
  }
  auto state = std::unique_ptr<State>(new State());
  state->version_ = version;
  state->regions_ = regions_;
  // Leased together (a request per 128 regions), not mapped: State::Read
  // copies through the descriptor, and State::Region maps on first use.
  std::vector<std::pair<std::string, ptc::Region>> items;
  for (const RankRegion& r : regions_) items.emplace_back(r.key, r.region);
  auto mappings = local_->MapMany(job(), version, items);
  if (!mappings.ok()) {
    return Annotate(
        mappings.status(),
        absl::StrCat("rank ", rank(), " loading ", items.size(),
                     " regions of version ", version, " (layout mismatch?)"));
  }
  state->local_ = local_.get();
  state->mappings_ = *std::move(mappings);
  for (const SmallObjectSpec& o : spec_.small_objects) {
    PTC_ASSIGN_OR_RETURN(
        state->small_[o.name],
        local_->GetSmallObject(job(), version, o.name, rank()));
  }
  return state;
}

absl::Status Client::WaitCommitted(int64_t version, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(5);
  while (true) {
    PTC_ASSIGN_OR_RETURN(proto::JobStatus job, FetchJob());
    if (job.committed_version() >= version) {
      committed_version_ = job.committed_version();
      committed_step_ = job.committed_step();
      return absl::OkStatus();
    }
    // Deleted: not committed, not open, and a save at least as new was
    // deleted (a save is never reopened).
    if (job.dropped_save() >= version &&
        std::find(job.open_saves().begin(), job.open_saves().end(), version) ==
            job.open_saves().end()) {
      return absl::AbortedError(absl::StrCat(
          "version ", version, " of job '", options_.job,
          "' could not commit and was deleted (a host of its placement was "
          "dead or could not prove its share, or a rank gave its save up); "
          "version ",
          job.committed_version(), " stays: save again"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " of job '", options_.job,
                       "' was not committed in time: ", job.ranks_saved(),
                       " of ", job.ranks(), " ranks reported it saved"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
}

absl::StatusOr<Client::HotSwitch> Client::PlanHotSwitch(int64_t serial) {
  PTC_ASSIGN_OR_RETURN(proto::JobStatus job,
                       FetchJob(/*include_layout=*/false, /*brief=*/false));
  if (!job.pending_hot() || job.pending_serial() != serial) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the hot switch ", serial, " of job '", options_.job,
        "' is no longer pending; follow the job"));
  }
  if (job.layout_epoch() != layout_epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", options_.job, "' is at layout epoch ", job.layout_epoch(),
        ", this process at ", layout_epoch_, "; follow the job"));
  }
  PTC_ASSIGN_OR_RETURN(ParallelConfig to, spec_.ParseConfig(job.pending_config()));
  PTC_ASSIGN_OR_RETURN(Layout source, BuildLayout(spec_, config_));
  PTC_ASSIGN_OR_RETURN(Layout target, BuildLayout(spec_, to));
  if (job.rank_hosts_size() != source.world_size() ||
      job.rank_devices_size() != source.world_size() ||
      job.pending_rank_hosts_size() != target.world_size() ||
      job.pending_rank_devices_size() != target.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", options_.job, "' does not place every rank of ",
        config_.ToString(), " and ", to.ToString(),
        " on a host and GPU; a hot switch needs both placements"));
  }
  // Every host of either placement, with the GPUs they use.
  Cluster cluster;
  auto id_of = [&](const std::string& name, int gpu) {
    int id = cluster.FindHost(name);
    if (id < 0) {
      cluster.hosts.push_back({name, 0});
      id = static_cast<int>(cluster.hosts.size()) - 1;
    }
    cluster.hosts[id].gpus = std::max(cluster.hosts[id].gpus, gpu + 1);
    return id;
  };
  Placement from, onto;
  for (int r = 0; r < source.world_size(); ++r) {
    from.host.push_back(id_of(job.rank_hosts(r), job.rank_devices(r)));
    from.device.push_back(job.rank_devices(r));
  }
  for (int r = 0; r < target.world_size(); ++r) {
    onto.host.push_back(
        id_of(job.pending_rank_hosts(r), job.pending_rank_devices(r)));
    onto.device.push_back(job.pending_rank_devices(r));
  }
  HotSwitch out;
  out.config = to.ToString();
  for (int r = 0; r < target.world_size(); ++r) {
    int process = -1;
    for (int s = 0; s < source.world_size(); ++s) {
      if (from.host[s] == onto.host[r] && from.device[s] == onto.device[r])
        process = s;
    }
    if (process < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target rank ", r, " of the hot switch runs on GPU ",
          onto.device[r], " of ", job.pending_rank_hosts(r),
          ", where no process of the job runs"));
    }
    out.process_of.push_back(process);
  }
  PlanInput in{&spec_, &cluster, &source, &from, &target, &onto};
  PTC_ASSIGN_OR_RETURN(out.plan, PlanProcessSwitch(in));
  return out;
}

}  // namespace ptc
