// The coordinator's gRPC service, called as a network client would: the
// first byte picks the RPC, the rest is its request. Two hosts (whose
// addresses nothing listens on) and a job are registered first; the
// registries keep what inputs add, up to a bound after which the service
// starts over.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "coordinator/coordinator_service.h"
#include "fuzz/fuzz.h"
#include "proto/coordinator.pb.h"

namespace ptc::fuzz {
namespace {

template <typename Req, typename Resp>
void Call(grpc::Status (CoordinatorService::*rpc)(grpc::ServerContext*,
                                                  const Req*, Resp*),
          CoordinatorService* service, const uint8_t* data, size_t size) {
  Req req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;
  grpc::ServerContext ctx;
  Resp resp;
  (service->*rpc)(&ctx, &req, &resp);
}

// The service, and an in-process server for its callback methods
// (Rendezvous), which need a real call.
struct Fuzzed {
  std::unique_ptr<CoordinatorService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<proto::Coordinator::Stub> stub;
  ~Fuzzed() {
    // Held calls are answered within a second (CoordinatorService::HoldLoop).
    if (server) server->Shutdown(std::chrono::system_clock::now());
  }
};

std::unique_ptr<CoordinatorService> StartService() {
  static std::string dir = [] {
    char path[] = "/tmp/ptc-coordinator-fuzz-XXXXXX";
    if (mkdtemp(path) == nullptr) std::abort();
    return std::string(path);
  }();
  std::remove((dir + "/state.pb").c_str());
  CoordinatorOptions options;
  options.state_dir = dir;
  options.host_timeout = absl::Hours(1);
  auto s = CoordinatorService::Create(options);
  if (!s.ok()) std::abort();
  for (int i = 0; i < 2; ++i) {
    proto::RegisterHostRequest req;
    proto::HostStatus* h = req.mutable_host();
    h->set_name("host" + std::to_string(i));
    h->set_address("127.0.0.1:" + std::to_string(1 + i));
    h->set_gpus(4);
    h->set_memory_bytes(int64_t{1} << 30);
    h->set_incarnation(1);
    grpc::ServerContext ctx;
    proto::RegisterHostResponse resp;
    (*s)->RegisterHost(&ctx, &req, &resp);
  }
  proto::RegisterJobRequest job;
  job.set_job("j");
  job.set_model("gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8");
  job.set_config("tp=2,dp=2");
  job.add_hosts("host0");
  job.add_hosts("host1");
  grpc::ServerContext ctx;
  proto::RegisterJobResponse resp;
  (*s)->RegisterJob(&ctx, &job, &resp);
  return *std::move(s);
}

std::unique_ptr<Fuzzed> Start() {
  auto f = std::make_unique<Fuzzed>();
  f->service = StartService();
  grpc::ServerBuilder builder;
  builder.RegisterService(f->service.get());
  f->server = builder.BuildAndStart();
  if (!f->server) std::abort();
  f->stub = proto::Coordinator::NewStub(
      f->server->InProcessChannel(grpc::ChannelArguments()));
  return f;
}

// A callback method, through the in-process server; the answer is not
// awaited for long (a Rendezvous is held until its meeting is met).
void CallRendezvous(proto::Coordinator::Stub* stub, const uint8_t* data,
                    size_t size) {
  proto::RendezvousRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(20));
  proto::RendezvousResponse resp;
  stub->Rendezvous(&ctx, req, &resp);
}

}  // namespace
}  // namespace ptc::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = ptc::fuzz::QuietProtobuf();
  (void)quiet;
  using namespace ptc;
  static std::unique_ptr<fuzz::Fuzzed> s;
  static int calls = 0;
  if (!s || ++calls % 500 == 0) {
    s.reset();
    s = fuzz::Start();
  }
  const fuzz::FuzzRequest in = fuzz::SplitInput(data, size);
  CoordinatorService* c = s->service.get();
  switch (in.selector % 11) {
    case 0:
      fuzz::Call(&CoordinatorService::RegisterHost, c, in.message, in.size);
      break;
    case 1:
      fuzz::Call(&CoordinatorService::Heartbeat, c, in.message, in.size);
      break;
    case 2:
      fuzz::Call(&CoordinatorService::RegisterJob, c, in.message, in.size);
      break;
    case 3:
      fuzz::Call(&CoordinatorService::BeginSave, c, in.message, in.size);
      break;
    case 4:
      fuzz::Call(&CoordinatorService::ListJobs, c, in.message, in.size);
      break;
    case 5:
      fuzz::Call(&CoordinatorService::Abort, c, in.message, in.size);
      break;
    case 6:
      fuzz::Call(&CoordinatorService::Advise, c, in.message, in.size);
      break;
    case 7:
      fuzz::Call(&CoordinatorService::SetAutoPolicy, c, in.message, in.size);
      break;
    case 8:
      fuzz::Call(&CoordinatorService::ChangeHosts, c, in.message, in.size);
      break;
    case 9:
      fuzz::CallRendezvous(s->stub.get(), in.message, in.size);
      break;
    case 10:
      fuzz::Call(&CoordinatorService::ReportProcessExit, c, in.message, in.size);
      break;
  }
  return 0;
}
