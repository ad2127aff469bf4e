// Requests an attacker or a clumsy operator could send the coordinator:
// each is refused with a message that names the field, and the coordinator
// keeps its registries as they were.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/meetings.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptc/small_object.h"
#include "tensor_store/internal/testing.h"

namespace ptc {
namespace {

proto::HostStatus GoodHost() {
  proto::HostStatus h;
  h.set_name("host0");
  h.set_address("127.0.0.1:7070");
  h.set_gpus(4);
  h.set_bandwidth(25e9);
  h.set_memory_bytes(int64_t{8} << 30);
  h.set_incarnation(1);
  return h;
}

// A coordinator over a state directory under `dir`, and a client of it.
struct Started {
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<proto::Coordinator::Stub> stub;
};
Started StartCoordinator(const testing::TempDir& dir) {
  CoordinatorServerOptions options;
  options.service.state_dir = dir.path();
  options.service.host_timeout = absl::Hours(1);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  Started s;
  s.stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*coordinator)->port()),
                          grpc::InsecureChannelCredentials()));
  s.server = *std::move(coordinator);
  return s;
}

// Registers `host` (GoodHost under that name) and asserts it worked.
void Enroll(proto::Coordinator::Stub& stub, const std::string& host) {
  grpc::ClientContext ctx;
  proto::RegisterHostRequest req;
  *req.mutable_host() = GoodHost();
  req.mutable_host()->set_name(host);
  proto::RegisterHostResponse resp;
  REQUIRE(stub.RegisterHost(&ctx, req, &resp).ok());
}

// Registers a small job `job` running `config` on host0.
void EnrollJob(proto::Coordinator::Stub& stub, const std::string& job,
               const std::string& config) {
  grpc::ClientContext ctx;
  proto::RegisterJobRequest req;
  req.set_job(job);
  req.set_model("gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8");
  req.set_config(config);
  req.add_hosts("host0");
  proto::RegisterJobResponse resp;
  REQUIRE(stub.RegisterJob(&ctx, req, &resp).ok());
}

// Rank `rank` of `job` asks to meet under layout epoch 1 (rank 0 offers
// `port`) on `ctx`, whose deadline the caller sets; the address met at.
grpc::Status Meet(proto::Coordinator::Stub& stub, grpc::ClientContext* ctx,
                  const std::string& job, int32_t rank, int32_t port = 0,
                  std::string* address = nullptr) {
  proto::RendezvousRequest req;
  req.set_job(job);
  req.set_layout_epoch(1);
  req.set_rank(rank);
  req.set_port(port);
  proto::RendezvousResponse resp;
  const grpc::Status s = stub.Rendezvous(ctx, req, &resp);
  if (address != nullptr) *address = resp.address();
  return s;
}

// A coordinator with host0 and job "j" (tp=2, two ranks) on it.
Started StartWithJob(const testing::TempDir& dir) {
  Started started = StartCoordinator(dir);
  Enroll(*started.stub, "host0");
  EnrollJob(*started.stub, "j", "tp=2");
  return started;
}

TEST_CASE("coordinator: hostile host registrations are refused",
          "[coordinator][hostile]") {
  testing::TempDir dir;
  Started started = StartCoordinator(dir);
  auto& stub = started.stub;
  auto enroll = [&](const proto::HostStatus& h) {
    grpc::ClientContext ctx;
    proto::RegisterHostRequest req;
    *req.mutable_host() = h;
    proto::RegisterHostResponse resp;
    return FromGrpcStatus(stub->RegisterHost(&ctx, req, &resp));
  };
  struct Case {
    const char* what;
    std::function<void(proto::HostStatus*)> spoil;
    const char* message;
  };
  const Case cases[] = {
      {"address :::::", [](auto* h) { h->set_address(":::::"); },
       "is not HOST:PORT"},
      {"address without a port", [](auto* h) { h->set_address("host0"); },
       "no port"},
      {"negative bandwidth", [](auto* h) { h->set_bandwidth(-1); },
       "bandwidth"},
      {"bandwidth NaN",
       [](auto* h) {
         h->set_bandwidth(std::numeric_limits<double>::quiet_NaN());
       },
       "bandwidth"},
      {"infinite bandwidth",
       [](auto* h) {
         h->set_bandwidth(std::numeric_limits<double>::infinity());
       },
       "bandwidth"},
      {"no GPUs", [](auto* h) { h->set_gpus(0); }, "GPUs"},
      {"2^31-1 GPUs",
       [](auto* h) { h->set_gpus(std::numeric_limits<int32_t>::max()); },
       "GPUs"},
      {"negative memory", [](auto* h) { h->set_memory_bytes(-1); }, "memory"},
      {"an empty name", [](auto* h) { h->set_name(""); }, "host name"},
      {"a name with a newline", [](auto* h) { h->set_name("a\nb"); },
       "host name"},
      {"a huge UCX address",
       [](auto* h) { h->set_ucx_address(std::string(1 << 20, 'x')); },
       "UCX address"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    proto::HostStatus h = GoodHost();
    c.spoil(&h);
    const absl::Status s = enroll(h);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(c.message));
  }
  // None of them was registered; the honest registration is.
  {
    grpc::ClientContext ctx;
    proto::ListHostsRequest req;
    proto::ListHostsResponse resp;
    REQUIRE(stub->ListHosts(&ctx, req, &resp).ok());
    CHECK(resp.hosts_size() == 0);
  }
  REQUIRE(enroll(GoodHost()).ok());

  SECTION("parallel pulls out of range are refused before planning") {
    for (int pulls : {-1, 65, std::numeric_limits<int32_t>::max()}) {
      grpc::ClientContext ctx;
      proto::ReconfigureRequest req;
      req.set_job("nope");
      req.set_to("dp=1");
      req.set_parallel_pulls(pulls);
      proto::ReconfigureResponse resp;
      const absl::Status s =
          FromGrpcStatus(stub->Reconfigure(&ctx, req, &resp));
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()), Catch::Contains("parallel pulls"));
    }
  }
  SECTION("a transport value no enum has is refused before planning") {
    grpc::ClientContext ctx;
    proto::ReconfigureRequest req;
    req.set_job("nope");
    req.set_to("dp=1");
    req.set_transport(static_cast<proto::Transport>(7));
    proto::ReconfigureResponse resp;
    const absl::Status s = FromGrpcStatus(stub->Reconfigure(&ctx, req, &resp));
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("transport 7 is unknown"));
  }
}

TEST_CASE("coordinator: a report keeps only the small objects it was asked for",
          "[coordinator]") {
  testing::TempDir dir;
  Started s = StartWithJob(dir);  // tp=2 on host0: every copy on one host
  auto begin = [&](int32_t rank) {
    grpc::ClientContext ctx;
    proto::BeginSaveRequest req;
    req.set_job("j");
    req.set_rank(rank);
    req.set_layout_epoch(1);
    req.set_step(7);
    proto::BeginSaveResponse resp;
    REQUIRE(s.stub->BeginSave(&ctx, req, &resp).ok());
    return resp;
  };
  // The job-wide objects are asked of rank 0 only; the RNG states derive.
  const proto::BeginSaveResponse first = begin(0);
  const std::vector<std::string> asked(first.keep_small_objects().begin(),
                                       first.keep_small_objects().end());
  CHECK(asked ==
        std::vector<std::string>{"iteration", "lr_scheduler", "data_cursor"});
  CHECK(begin(1).keep_small_objects().empty());
  auto report = [&](int32_t rank, int64_t version, const std::string& name,
                    size_t bytes) {
    grpc::ClientContext ctx;
    proto::ReportSavedRequest req;
    req.set_job("j");
    req.set_rank(rank);
    req.set_version(version);
    req.set_layout_epoch(1);
    proto::KeptSmallObject* k = req.add_kept_small_objects();
    k->set_name(name);
    k->set_bytes(std::string(bytes, 'x'));
    proto::ReportSavedResponse resp;
    return s.stub->ReportSaved(&ctx, req, &resp);
  };
  grpc::Status r = report(1, first.version(), "iteration", 8);
  CHECK(r.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.error_message(),
             Catch::Contains("BeginSave did not ask it for that one"));
  r = report(0, first.version(), "rng.default", 16);
  CHECK(r.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  r = report(0, first.version(), "iteration", kMaxKeptSmallObjectBytes + 1);
  CHECK(r.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.error_message(), Catch::Contains("keeps at most 16384"));
  // Not a save in progress: said so, whatever it carries.
  r = report(0, first.version() + 100, "iteration", 8);
  CHECK(r.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(r.error_message(), Catch::Contains("not a save in progress"));
  // What was asked is taken (rank 1 has not reported: nothing commits).
  CHECK(report(0, first.version(), "iteration", 8).ok());
}

TEST_CASE("coordinator: the heartbeat interval stretches as hosts join",
          "[coordinator]") {
  testing::TempDir dir;
  CoordinatorServerOptions options;
  options.service.state_dir = dir.path();
  options.service.host_timeout = absl::Hours(1);
  options.service.heartbeat_interval = absl::Seconds(1);
  options.service.max_heartbeats_per_second = 4;  // two hosts at 1 s
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*coordinator)->port()),
                          grpc::InsecureChannelCredentials()));
  auto heartbeat = [&](const std::string& host) {
    grpc::ClientContext ctx;
    proto::HeartbeatRequest req;
    req.set_name(host);
    proto::HeartbeatResponse resp;
    REQUIRE(stub->Heartbeat(&ctx, req, &resp).ok());
    REQUIRE(resp.known());
    return resp.heartbeat_interval_seconds();
  };
  grpc::ClientContext ctx;
  proto::RegisterHostRequest req;
  *req.mutable_host() = GoodHost();
  proto::RegisterHostResponse resp;
  REQUIRE(stub->RegisterHost(&ctx, req, &resp).ok());
  CHECK(resp.heartbeat_interval_seconds() == 1);
  CHECK(heartbeat("host0") == 1);
  for (const char* name : {"host1", "host2", "host3"}) Enroll(*stub, name);
  // Four hosts, two heartbeats each per interval, at most four a second.
  CHECK(heartbeat("host0") == 2);
  CHECK(heartbeat("host3") == 2);
}

TEST_CASE("coordinator: dead hosts no job names expire; others stay",
          "[coordinator][hostile]") {
  testing::TempDir dir;
  CoordinatorServerOptions options;
  options.service.state_dir = dir.path() + "/state";  // created if missing
  // Long enough that the job is registered while host0 is alive, however
  // busy the machine.
  options.service.host_timeout = absl::Seconds(2);
  options.service.host_expiry = absl::Seconds(4);
  auto coordinator = CoordinatorServer::Start(options);
  REQUIRE(coordinator.ok());
  auto stub = proto::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*coordinator)->port()),
                          grpc::InsecureChannelCredentials()));
  for (const char* name : {"host0", "host1"}) Enroll(*stub, name);
  EnrollJob(*stub, "j", "tp=2");
  // Neither heartbeats: both die; host1, which no job names, is forgotten.
  proto::ListHostsResponse resp;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    absl::SleepFor(absl::Milliseconds(100));
    grpc::ClientContext ctx;
    resp.Clear();
    REQUIRE(stub->ListHosts(&ctx, proto::ListHostsRequest(), &resp).ok());
  } while (resp.hosts_size() != 1 && absl::Now() < deadline);
  REQUIRE(resp.hosts_size() == 1);
  CHECK(resp.hosts(0).name() == "host0");
  CHECK(!resp.hosts(0).alive());
}

TEST_CASE(
    "coordinator: each job has its own state file, written when it changes",
    "[coordinator]") {
  testing::TempDir dir;
  const std::string state_dir = dir.path() + "/state";
  CoordinatorServerOptions options;
  options.service.state_dir = state_dir;
  options.service.host_timeout = absl::Hours(1);
  auto start = [&] {
    auto c = CoordinatorServer::Start(options);
    REQUIRE(c.ok());
    return std::move(*c);
  };
  auto coordinator = start();
  auto stub = [&] {
    return proto::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", coordinator->port()),
                            grpc::InsecureChannelCredentials()));
  };
  auto s = stub();
  {
    grpc::ClientContext ctx;
    proto::RegisterHostRequest req;
    *req.mutable_host() = GoodHost();
    req.mutable_host()->set_gpus(1024);
    proto::RegisterHostResponse resp;
    REQUIRE(s->RegisterHost(&ctx, req, &resp).ok());
  }
  auto register_job = [&](const std::string& name) {
    grpc::ClientContext ctx;
    proto::RegisterJobRequest req;
    req.set_job(name);
    req.set_model("gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8");
    req.set_config("tp=1");
    req.add_hosts("host0");
    proto::RegisterJobResponse resp;
    REQUIRE(s->RegisterJob(&ctx, req, &resp).ok());
  };
  auto list_jobs = [&] {
    grpc::ClientContext ctx;
    proto::ListJobsRequest req;
    proto::ListJobsResponse resp;
    REQUIRE(s->ListJobs(&ctx, req, &resp).ok());
    return resp;
  };
  for (int i = 0; i < 30; ++i) register_job(absl::StrCat("job", i));
  auto inode = [](const std::string& path) {
    struct stat st;
    REQUIRE(stat(path.c_str(), &st) == 0);
    return st.st_ino;
  };
  const auto job0 = inode(state_dir + "/jobs/job0.pb");
  // Each host has its own record too; state.pb holds neither hosts nor
  // jobs (only retired plan epochs: none here, so it is not written).
  const auto host0 = inode(state_dir + "/hosts/host0.pb");
  struct stat main_file;
  CHECK((stat((state_dir + "/state.pb").c_str(), &main_file) != 0 ||
         main_file.st_size < 64));
  register_job("job30");
  CHECK(inode(state_dir + "/jobs/job0.pb") == job0);    // not rewritten
  CHECK(inode(state_dir + "/hosts/host0.pb") == host0);  // nor this

  // A restart loads them all.
  coordinator.reset();
  coordinator = start();
  s = stub();
  CHECK(list_jobs().jobs_size() == 31);
  // A state file from before per-job files (jobs inside it) is read, and
  // the next write moves its jobs into their files.
  coordinator.reset();
  {
    std::ifstream in(state_dir + "/jobs/job7.pb", std::ios::binary);
    proto::CoordinatorState::Job job7;
    REQUIRE(job7.ParseFromIstream(&in));
    std::ifstream host_in(state_dir + "/hosts/host0.pb", std::ios::binary);
    proto::HostStatus host0_status;
    REQUIRE(host0_status.ParseFromIstream(&host_in));
    // Hosts and jobs both inside state.pb, as coordinators before
    // per-host and per-job files wrote them.
    proto::CoordinatorState legacy;
    *legacy.add_jobs() = job7;
    *legacy.add_hosts() = host0_status;
    std::ofstream(state_dir + "/state.pb", std::ios::binary | std::ios::trunc)
        << legacy.SerializeAsString();
    for (const char* folder : {"/jobs", "/hosts"}) {
      for (const auto& e :
           std::filesystem::directory_iterator(state_dir + folder))
        std::filesystem::remove(e.path());
    }
  }
  coordinator = start();
  s = stub();
  const proto::ListJobsResponse migrated = list_jobs();
  REQUIRE(migrated.jobs_size() == 1);
  CHECK(migrated.jobs(0).job() == "job7");
  register_job("job40");  // host0 is known: it came from state.pb
  CHECK(std::filesystem::exists(state_dir + "/jobs/job7.pb"));
  CHECK(std::filesystem::exists(state_dir + "/jobs/job40.pb"));
  CHECK(std::filesystem::exists(state_dir + "/hosts/host0.pb"));
  proto::CoordinatorState rewritten;
  std::ifstream main_in(state_dir + "/state.pb", std::ios::binary);
  if (main_in) {
    REQUIRE(rewritten.ParseFromIstream(&main_in));
    CHECK(rewritten.jobs_size() == 0);
    CHECK(rewritten.hosts_size() == 0);
  }
}

// Threads of this process now (the coordinator runs in it).
int Threads() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)e;
    ++n;
  }
  return n;
}

TEST_CASE(
    "coordinator: more followers of a job than it has RPC threads, none "
    "holding one",
    "[coordinator]") {
  testing::TempDir dir;
  Started started = StartWithJob(dir);
  auto& stub = started.stub;
  // 2.5x the server's RPC threads: each follower used to hold one.
  const int kFollowers = 640;
  const int before = Threads();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<proto::ReconfigureEvent>>>
      streams;
  proto::WatchRequest req;
  req.set_job("j");
  req.set_follow(true);
  for (int i = 0; i < kFollowers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub->Watch(contexts.back().get(), req));
  }
  // Every follower is told the job as it is now...
  for (auto& s : streams) {
    proto::ReconfigureEvent e;
    REQUIRE(s->Read(&e));
    CHECK(e.layout_epoch() == 1);
  }
  CHECK(Threads() - before < 64);
  // ... and that it is gone when it is forgotten.
  {
    grpc::ClientContext ctx;
    proto::ForgetJobRequest forget;
    forget.set_job("j");
    proto::ForgetJobResponse resp;
    REQUIRE(stub->ForgetJob(&ctx, forget, &resp).ok());
  }
  for (auto& s : streams) {
    proto::ReconfigureEvent e;
    CHECK_FALSE(s->Read(&e));
    const grpc::Status end = s->Finish();
    CHECK(end.error_code() == grpc::StatusCode::NOT_FOUND);
  }
  // A watcher of an unknown job is refused at once.
  grpc::ClientContext ctx;
  req.set_job("nope");
  auto refused = stub->Watch(&ctx, req);
  proto::ReconfigureEvent e;
  CHECK_FALSE(refused->Read(&e));
  CHECK(refused->Finish().error_message() == "job 'nope' is unknown");
}

TEST_CASE("coordinator: a rank waiting for its meeting is told, not polling",
          "[coordinator]") {
  testing::TempDir dir;
  Started started = StartWithJob(dir);
  auto& stub = started.stub;
  auto meet = [&](int32_t rank, absl::Duration deadline,
                  std::string* address) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return Meet(*stub, &ctx, "j", rank, rank == 0 ? 29500 : 0, address)
        .error_code();
  };
  std::string address;
  // Alone, rank 1 is held (for a second at least, later than this call
  // waits), not answered at once.
  CHECK(meet(1, absl::Milliseconds(300), &address) ==
        grpc::StatusCode::DEADLINE_EXCEEDED);
  // Its cancellation reaches the coordinator (which may take a while on a
  // busy machine).
  CoordinatorService* service = started.server->service();
  while (service->GetCounts().meeting_calls_held != 0)
    absl::SleepFor(absl::Milliseconds(10));
  // That call went away: rank 1 is absent at once (it asked well within
  // kMeetingPresence), and rank 0, held for what its deadline leaves (2 s),
  // is not met.
  CHECK(meet(0, absl::Seconds(4), &address) != grpc::StatusCode::OK);
  // Held again, past kMeetingPresence; rank 0's arrival meets both.
  grpc::StatusCode held_code;
  std::string held_address;
  std::thread rank1(
      [&] { held_code = meet(1, absl::Seconds(60), &held_address); });
  absl::SleepFor(kMeetingPresence + absl::Seconds(1));
  CHECK(meet(0, absl::Seconds(30), &address) == grpc::StatusCode::OK);
  rank1.join();
  CHECK(address == "127.0.0.1:29500");
  CHECK(held_code == grpc::StatusCode::OK);
  CHECK(held_address == address);
}

TEST_CASE(
    "coordinator: a call held for a meeting whose epoch the job left is "
    "answered then, not when its hold ends",
    "[coordinator]") {
  testing::TempDir dir;
  Started started = StartWithJob(dir);
  CoordinatorService* service = started.server->service();
  grpc::Status status;
  absl::Time answered;
  std::thread rank1([&] {
    grpc::ClientContext ctx;
    // Held for 20 s at most (kMeetingHoldMost).
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
    status = Meet(*started.stub, &ctx, "j", 1);
    answered = absl::Now();
  });
  while (service->GetCounts().meeting_calls_held != 1)
    absl::SleepFor(absl::Milliseconds(10));
  // The job's epoch ends: here it is forgotten (a committed change moves
  // it on the same way).
  const absl::Time asked = absl::Now();
  {
    grpc::ClientContext ctx;
    proto::ForgetJobRequest forget;
    forget.set_job("j");
    proto::ForgetJobResponse resp;
    REQUIRE(started.stub->ForgetJob(&ctx, forget, &resp).ok());
  }
  const absl::Time forgotten = absl::Now();
  rank1.join();
  INFO(status.error_message());
  INFO("ForgetJob took " << absl::FormatDuration(forgotten - asked));
  CHECK(status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(answered - forgotten < kMeetingHoldMost / 2);
  CHECK(service->GetCounts().meeting_calls_held == 0);
}

TEST_CASE(
    "coordinator: one rank's calls held at once are bounded; the one beyond "
    "is answered at once",
    "[coordinator][hostile]") {
  testing::TempDir dir;
  Started started = StartWithJob(dir);
  CoordinatorService* service = started.server->service();
  auto ask = [&](grpc::ClientContext* ctx) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
    return Meet(*started.stub, ctx, "j", 1).error_code();
  };
  // A client asking for rank 1 many times at once, each call patient.
  std::vector<std::unique_ptr<grpc::ClientContext>> held(kMeetingHeldPerRank);
  std::vector<grpc::StatusCode> codes(kMeetingHeldPerRank);
  std::vector<std::thread> threads;
  for (int i = 0; i < kMeetingHeldPerRank; ++i) {
    held[i] = std::make_unique<grpc::ClientContext>();
    threads.emplace_back([&, i] { codes[i] = ask(held[i].get()); });
  }
  while (service->GetCounts().meeting_calls_held != kMeetingHeldPerRank)
    absl::SleepFor(absl::Milliseconds(10));
  // One more: not held (answered well before its hold of 20 s would end).
  grpc::ClientContext beyond;
  const absl::Time asked = absl::Now();
  CHECK(ask(&beyond) == grpc::StatusCode::UNAVAILABLE);
  CHECK(absl::Now() - asked < kMeetingHoldMost / 2);
  CHECK(service->GetCounts().meeting_calls_held == kMeetingHeldPerRank);
  for (auto& ctx : held) ctx->TryCancel();
  for (std::thread& t : threads) t.join();
  for (grpc::StatusCode code : codes)
    CHECK(code == grpc::StatusCode::CANCELLED);
  while (service->GetCounts().meeting_calls_held != 0)
    absl::SleepFor(absl::Milliseconds(10));
}

TEST_CASE("coordinator: a meeting tells its own ranks, not another job's",
          "[coordinator]") {
  testing::TempDir dir;
  Started started = StartWithJob(dir);
  auto& stub = started.stub;
  EnrollJob(*stub, "k", "tp=2");
  auto meet = [&](const std::string& job, int32_t rank,
                  absl::Duration deadline, std::string* address) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    return Meet(*stub, &ctx, job, rank,
                rank == 0 ? (job == "j" ? 29500 : 29501) : 0, address)
        .error_code();
  };
  std::string address;
  // Rank 1 of j, then of k, are held.
  grpc::StatusCode j1_code, k1_code;
  std::string j1_address, k1_address;
  absl::Notification k1_done;
  std::thread j1(
      [&] { j1_code = meet("j", 1, absl::Seconds(60), &j1_address); });
  std::thread k1([&] {
    k1_code = meet("k", 1, absl::Seconds(60), &k1_address);
    k1_done.Notify();
  });
  // j meets (rank 1 asks first or is told); k's held call is left held,
  // and answered for its own meeting.
  CHECK(meet("j", 0, absl::Seconds(30), &address) == grpc::StatusCode::OK);
  CHECK(address == "127.0.0.1:29500");
  j1.join();
  CHECK(j1_code == grpc::StatusCode::OK);
  CHECK(j1_address == "127.0.0.1:29500");
  CHECK(!k1_done.HasBeenNotified());
  CHECK(meet("k", 0, absl::Seconds(30), &address) == grpc::StatusCode::OK);
  CHECK(address == "127.0.0.1:29501");
  k1.join();
  CHECK(k1_code == grpc::StatusCode::OK);
  CHECK(k1_address == "127.0.0.1:29501");
}

}  // namespace
}  // namespace ptc
