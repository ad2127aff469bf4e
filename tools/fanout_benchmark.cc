// What one host's share of a coordinator's fan-out costs (not a test): a
// Stats call to each of --hosts ptcd processes, on a channel opened for
// the call and closed after it (as the coordinator's fan-outs to hosts
// did until 2026-12-02: a StoreClient made per call) against on a channel
// kept per host (KeptChannel, as they do now), the two ways alternated
// each round. Mutual TLS with the certificates in
// --certs (made by tools/ptc-certs: ca, host host0, coordinator; this
// process shows the coordinator's), or plaintext with --insecure. Prints
// the CPU each way costs this process (the coordinator's side) and the
// ptcds, per call, and the wall time of a round's calls (one after the
// other). Then, with --memory-channels N (default 1,024), what a kept
// channel costs this process's memory: N channels kept to the ptcds (each
// its own connection, as KeptChannel keeps one per host and kind), one
// call on each, and the growth of this process's resident memory per
// channel, measured as they are opened (the coordinator's side at a
// cluster of N hosts' kept channels).
//
//   bazel build -c opt //tools:fanout_benchmark //ptcd:ptcd
//   d=$(mktemp -d) && tools/ptc-certs $d ca && tools/ptc-certs $d host host0 &&
//       tools/ptc-certs $d coordinator
//   bazel-bin/tools/fanout_benchmark --ptcd bazel-bin/ptcd/ptcd --certs $d
//       --hosts 16 --rounds 20   (one line)
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "tensor_store/store_client.h"
#include "tools/internal/stats.h"

extern char** environ;

namespace ptc::tools {
namespace {

// This process's CPU time so far, seconds (all its threads).
double OwnCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// This process's resident memory, bytes (/proc/self/statm).
int64_t OwnResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A child's CPU time so far, seconds (/proc/PID/stat: utime, stime).
double ChildCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // Fields after the command's closing parenthesis: state is the 3rd.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  if (f.size() < 13) return 0;
  return (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);
}

struct Daemon {
  pid_t pid = 0;
  std::string address;
};

// Starts a ptcd listening on a port it picks; its address once it serves.
absl::StatusOr<Daemon> StartPtcd(const std::string& binary,
                                 const std::string& dir, int i,
                                 const std::string& certs) {
  const std::string port_file = absl::StrCat(dir, "/port-", i);
  std::vector<std::string> argv = {binary,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--socket",
                                   "none",
                                   "--memory-limit",
                                   "64MiB",
                                   "--spare-pool",
                                   "0",
                                   "--background-fingerprints",
                                   "off",
                                   "--drain-seconds",
                                   "0",
                                   "--log-level",
                                   "warn"};
  if (certs.empty()) {
    argv.push_back("--insecure");
  } else {
    for (const auto& [flag, file] :
         {std::pair{"--tls-ca", "ca.pem"}, std::pair{"--tls-cert", "host0.pem"},
          std::pair{"--tls-key", "host0.key"}}) {
      argv.push_back(flag);
      argv.push_back(absl::StrCat(certs, "/", file));
    }
  }
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  Daemon d;
  if (posix_spawn(&d.pid, binary.c_str(), nullptr, nullptr, c.data(),
                  environ) != 0)
    return absl::InternalError(absl::StrCat("cannot start ", binary));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      d.address = absl::StrCat("127.0.0.1:", port);
      return d;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(d.pid, SIGKILL);
  waitpid(d.pid, nullptr, 0);
  return absl::DeadlineExceededError(
      absl::StrCat("ptcd ", i, " wrote no port within 30 s"));
}

absl::Status Run(int argc, char** argv) {
  PTC_ASSIGN_OR_RETURN(Args args, Args::Parse(argc, argv, 1,
                                              {"ptcd", "certs", "hosts",
                                               "rounds", "memory-channels"},
                                              {"insecure"}));
  PTC_ASSIGN_OR_RETURN(const std::string binary, args.Required("ptcd"));
  int hosts = 0, rounds = 0, channels = 0;
  if (!absl::SimpleAtoi(args.Get("hosts", "16"), &hosts) || hosts < 1 ||
      hosts > 256 || !absl::SimpleAtoi(args.Get("rounds", "20"), &rounds) ||
      rounds < 1 || rounds > 10000 ||
      !absl::SimpleAtoi(args.Get("memory-channels", "1024"), &channels) ||
      channels < 0 || channels > 16384) {
    return absl::InvalidArgumentError(
        "--hosts (1 to 256), --rounds (1 to 10,000) and --memory-channels "
        "(0 to 16,384) need numbers");
  }
  const bool insecure = args.Flag("insecure");
  const std::string certs = insecure ? "" : args.Get("certs", "");
  if (insecure == !certs.empty()) {
    return absl::InvalidArgumentError(
        "give --certs DIR (tools/ptc-certs DIR ca; DIR host host0; DIR "
        "coordinator) or --insecure");
  }
  PTC_RETURN_IF_ERROR(SetLogLevel("warn"));
  if (insecure) {
    PTC_RETURN_IF_ERROR(
        ConfigureSecurity({.insecure = true}, "fanout_benchmark"));
  } else {
    PTC_RETURN_IF_ERROR(ConfigureSecurity(
        {.ca = absl::StrCat(certs, "/ca.pem"),
         .cert = absl::StrCat(certs, "/coordinator.pem"),
         .key = absl::StrCat(certs, "/coordinator.key")},
        "fanout_benchmark"));
  }
  char dir[] = "/tmp/ptc-fanout-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp");
  std::vector<Daemon> daemons;
  absl::Status status = absl::OkStatus();
  for (int i = 0; i < hosts && status.ok(); ++i) {
    absl::StatusOr<Daemon> d = StartPtcd(binary, dir, i, certs);
    if (d.ok()) {
      daemons.push_back(*d);
    } else {
      status = d.status();
    }
  }
  // Per way (0: a channel per call, 1: kept): this process's and the
  // ptcds' CPU seconds, and each round's wall seconds.
  double own[2] = {0, 0}, theirs[2] = {0, 0};
  std::vector<double> wall[2];
  std::vector<std::unique_ptr<StoreClient>> kept;
  for (const Daemon& d : daemons)
    kept.push_back(StoreClient::Connect(d.address, "host0"));
  auto daemons_cpu = [&] {
    double s = 0;
    for (const Daemon& d : daemons) s += ChildCpuSeconds(d.pid);
    return s;
  };
  // Round 0 warms both ways up (the kept channels connect) and is not
  // counted.
  for (int r = 0; r <= rounds && status.ok(); ++r) {
    for (int way = 0; way < 2 && status.ok(); ++way) {
      const double own_before = OwnCpuSeconds();
      const double theirs_before = daemons_cpu();
      const absl::Time start = absl::Now();
      for (size_t h = 0; h < daemons.size() && status.ok(); ++h) {
        absl::StatusOr<proto::StatsResponse> answer =
            way == 0 ? StoreClient::Connect(daemons[h].address, "host0")
                           ->Stats(absl::Seconds(30))
                     : kept[h]->Stats(absl::Seconds(30));
        status.Update(answer.status());
      }
      const absl::Time end = absl::Now();
      // What closing the round's channels costs is counted with it.
      absl::SleepFor(absl::Milliseconds(200));
      if (r == 0) continue;
      own[way] += OwnCpuSeconds() - own_before;
      theirs[way] += daemons_cpu() - theirs_before;
      wall[way].push_back(absl::ToDoubleMilliseconds(end - start));
    }
  }
  kept.clear();
  // Memory: the channels opened in steps of a quarter, resident memory
  // read after each step's calls (the growth per channel of the last
  // three quarters: the first pays for gRPC's own start-up as well).
  std::vector<std::unique_ptr<StoreClient>> held;
  std::vector<std::pair<int, int64_t>> resident;
  for (int step = 0; step <= 4 && status.ok() && channels > 0; ++step) {
    const int upto = channels * step / 4;
    for (int c = static_cast<int>(held.size()); c < upto && status.ok(); ++c) {
      held.push_back(std::make_unique<StoreClient>(
          KeptChannel(daemons[c % daemons.size()].address,
                      absl::StrCat("memory ", c / daemons.size()),
                      grpc::ChannelArguments(), "host0")));
      status.Update(held.back()->Stats(absl::Seconds(30)).status());
    }
    absl::SleepFor(absl::Milliseconds(500));
    resident.push_back({upto, OwnResidentBytes()});
  }
  held.clear();
  for (const Daemon& d : daemons) kill(d.pid, SIGTERM);
  for (const Daemon& d : daemons) waitpid(d.pid, nullptr, 0);
  std::filesystem::remove_all(dir);
  PTC_RETURN_IF_ERROR(status);
  const double calls = static_cast<double>(rounds) * hosts;
  std::printf("Stats to each of %d ptcds (%s), %d rounds, the ways alternated\n",
              hosts, insecure ? "plaintext" : "mutual TLS", rounds);
  std::printf("%-22s %24s %24s %34s\n", "", "this process, us a call",
              "the ptcds, us a call", "a round's calls, ms (min/med/max)");
  for (int way = 0; way < 2; ++way) {
    const Stats w = Summarize(wall[way]);
    std::printf("%-22s %24.0f %24.0f %14.1f / %6.1f / %6.1f\n",
                way == 0 ? "a channel per call" : "a channel kept per host",
                own[way] / calls * 1e6, theirs[way] / calls * 1e6, w.min,
                w.median, w.max);
  }
  if (resident.size() == 5) {
    std::printf(
        "\n%d kept channels, each with a call made (this process's "
        "resident memory):\n",
        channels);
    for (const auto& [n, bytes] : resident)
      std::printf("  %6d channels: %8.1f MiB\n", n, bytes / 1048576.0);
    const double per =
        static_cast<double>(resident[4].second - resident[1].second) /
        (resident[4].first - resident[1].first);
    std::printf("  per channel: %.1f KiB\n", per / 1024);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  const absl::Status s = ptc::tools::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "fanout_benchmark: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
