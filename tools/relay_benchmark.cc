// What relaying costs a call (not a test): a process's coordinator call
// directly (its own connection) against through its ptcd's relay
// (ptcd/coordinator_relay.h), side by side in one run. The coordinator
// and the relay run in this process on localhost, plaintext; each round
// times a block of sequential calls one way, then the other, and then the
// same number of calls from --threads threads at once (each thread its own
// connection, or its own connection to the relay).
//
//   bazel build -c opt //tools:relay_benchmark &&
//       bazel-bin/tools/relay_benchmark --rounds 5 --calls 500 --threads 32
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_server.h"
#include "proto/coordinator.grpc.pb.h"
#include "ptcd/coordinator_relay.h"
#include "tools/internal/stats.h"

namespace ptc::tools {
namespace {

using Stub = proto::Coordinator::Stub;

// A fresh connection: direct (its own subchannel), or to the relay.
std::unique_ptr<Stub> Connect(const std::string& address, bool relayed) {
  if (relayed)
    return proto::Coordinator::NewStub(
        OpenChannel(absl::StrCat("unix:", address)));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return proto::Coordinator::NewStub(OpenChannel(address, args));
}

absl::Status Ask(Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  proto::ListHostsRequest req;
  proto::ListHostsResponse resp;
  const grpc::Status s = stub->ListHosts(&ctx, req, &resp);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return absl::OkStatus();
}

// Microseconds per call, `calls` calls one after the other.
absl::StatusOr<std::vector<double>> Sequential(Stub* stub, int calls) {
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    PTC_RETURN_IF_ERROR(Ask(stub));
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return us;
}

// Calls per second, `threads` threads making `calls` calls in all.
absl::StatusOr<double> Concurrent(const std::string& address, bool relayed,
                                  int threads, int calls) {
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int t = 0; t < threads; ++t) {
    stubs.push_back(Connect(address, relayed));
    PTC_RETURN_IF_ERROR(Ask(stubs.back().get()));  // connected
  }
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  const absl::Time start = absl::Now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < calls; i += threads)
        if (!Ask(stubs[t].get()).ok()) ++failed;
    });
  }
  for (std::thread& th : pool) th.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (failed > 0)
    return absl::UnavailableError(absl::StrCat(failed.load(), " calls failed"));
  return calls / seconds;
}

absl::Status Run(int argc, char** argv) {
  PTC_ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argc, argv, 1, {"rounds", "calls", "threads"}, {}));
  int rounds = 0, calls = 0, threads = 0;
  if (!absl::SimpleAtoi(args.Get("rounds", "5"), &rounds) ||
      !absl::SimpleAtoi(args.Get("calls", "500"), &calls) ||
      !absl::SimpleAtoi(args.Get("threads", "32"), &threads) || rounds < 1 ||
      rounds > 1000 || calls < 1 || calls > 1000000 || threads < 1 ||
      threads > 1024)
    return absl::InvalidArgumentError(
        "--rounds (1 to 1000), --calls (1 to 1,000,000) and --threads (1 to "
        "1024) need numbers");
  PTC_RETURN_IF_ERROR(SetLogLevel("warn"));
  PTC_RETURN_IF_ERROR(ConfigureSecurity({.insecure = true}, "relay_benchmark"));
  char dir[] = "/tmp/ptc-relay-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp");
  CoordinatorServerOptions options;
  options.service.state_dir = dir;
  PTC_ASSIGN_OR_RETURN(auto coordinator, CoordinatorServer::Start(options));
  const std::string address = absl::StrCat("127.0.0.1:", coordinator->port());
  PTC_ASSIGN_OR_RETURN(
      auto relay,
      CoordinatorRelay::Start({.socket_path = absl::StrCat(dir, "/relay.sock"),
                               .coordinator = address}));
  std::unique_ptr<Stub> direct = Connect(address, false);
  std::unique_ptr<Stub> relayed = Connect(relay->socket_path(), true);
  PTC_RETURN_IF_ERROR(Ask(direct.get()));
  PTC_RETURN_IF_ERROR(Ask(relayed.get()));
  std::vector<double> latency[2], rate[2];
  for (int r = 0; r < rounds; ++r) {
    for (int way = 0; way < 2; ++way) {
      PTC_ASSIGN_OR_RETURN(
          std::vector<double> us,
          Sequential(way ? relayed.get() : direct.get(), calls));
      latency[way].insert(latency[way].end(), us.begin(), us.end());
      PTC_ASSIGN_OR_RETURN(double per_second,
                           Concurrent(way ? relay->socket_path() : address,
                                      way == 1, threads, calls));
      rate[way].push_back(per_second);
    }
  }
  std::printf(
      "ListHosts to an in-process coordinator, %d rounds, each way "
      "alternated\n",
      rounds);
  std::printf(
      "%-8s %34s %40s\n", "", "one call, us (min / median / p99 / max)",
      absl::StrFormat("%d threads, calls/s (min / median / max)", threads)
          .c_str());
  for (int way = 0; way < 2; ++way) {
    std::vector<double> l = latency[way];
    std::sort(l.begin(), l.end());
    const Stats s = Summarize(rate[way]);
    std::printf("%-8s %9.0f / %6.0f / %6.0f / %7.0f %18.0f / %6.0f / %6.0f\n",
                way ? "relayed" : "direct", l.front(), l[l.size() / 2],
                l[l.size() * 99 / 100], l.back(), s.min, s.median, s.max);
  }
  relay->Stop();
  coordinator.reset();
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  const absl::Status s = ptc::tools::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "relay_benchmark: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
