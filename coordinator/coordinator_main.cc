// ptc-coordinator: registries of hosts and jobs, reconfiguration plans
// driven to an atomic commit, dead-host detection. Its metadata lives in
// --state-dir (one coordinator) or in etcd (--etcd: several coordinators,
// one leads, the others stand by) and survives restarts.
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/args.h"
#include "common/channel.h"
#include "common/crash.h"
#include "common/job_token.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/mutex_checks.h"
#include "common/open_files.h"
#include "common/status_macros.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/etcd_control_store.h"
#include "coordinator/standby_server.h"
#include "coordinator/web_view.h"

namespace ptc {
namespace {

constexpr char kUsage[] =
    R"(usage: ptc-coordinator [--config FILE] (--state-dir DIR | --etcd HOST:PORT,...)
                       [--listen HOST:PORT] [--advertise HOST:PORT]
                       [--etcd-prefix PREFIX] [--etcd-lease SECONDS]
                       [--host-timeout SECONDS] [--host-expiry SECONDS]
                       [--heartbeats-per-second N]
                       [--log-level LEVEL] [--port-file FILE]
                       [--token-key FILE] [--metrics-listen HOST:PORT]
                       [--web-listen HOST:PORT --web-token-file FILE]
                       (--tls-ca FILE --tls-cert FILE --tls-key FILE | --insecure)

  --config         "key = value" file with a key for every option (the
                   option's name with '_' for '-': state_dir, tls_ca,
                   insecure = true, ...); flags override it
  --state-dir      directory for the coordinator's metadata (state.pb: hosts;
                   jobs/JOB.pb: each job, rewritten only when it changes)
  --etcd           keep the metadata in this etcd cluster instead (its
                   members' client addresses): run several coordinators
                   with the same --etcd; one leads and serves, the others
                   stand by (answering every call with the leader's
                   address) and take over within the lease when it dies.
                   Give ptcd, clients and ptcctl every coordinator's
                   address ("a:7000,b:7000"): they follow the leader
  --etcd-ca, --etcd-cert, --etcd-key
                   etcd's CA (its own, not the cluster's: only coordinators
                   may reach etcd), and this coordinator's client
                   certificate and key from it (tools/ptc-certs ETCD_DIR
                   etcd-client NAME); each member's certificate must name
                   "etcd" (tools/ptc-certs ETCD_DIR etcd MEMBER ADDRESS...)
  --etcd-prefix    where in etcd (default /ptc)
  --etcd-lease     the leader's lease in seconds, 2 to 300 (default 5): a
                   leader that cannot renew it stops before it ends
  --advertise      the address others reach this coordinator at (default:
                   --listen), written in etcd while it leads
  --listen         gRPC address (default 127.0.0.1:7000; port 0 picks one)
  --host-timeout   a host silent for this long, that also leaves the
                   direct call made at half of it unanswered, is dead
                   (default 5)
  --host-expiry    a host dead this long (seconds) that no job names is
                   removed from the registry (default 86400)
  --heartbeats-per-second
                   the most heartbeats a second the coordinator takes from
                   all hosts together (default 500, about 8% of a core;
                   each host sends two per interval, the interval being a
                   quarter of the host timeout, at most 1 s). Beyond it
                   the interval stretches in proportion to the hosts,
                   and the timeout with it to at most five intervals:
                   at the defaults, up to 250 hosts are declared dead
                   after 5 s, 512 after 10 s, 2,048 after 41 s (they
                   heartbeat every 4.1 s); a --host-timeout of 30 holds
                   up to 1,500 hosts, and 2,048 also after 41 s
  --log-level      trace, debug, info, warn, error (default info)
  --port-file      write the bound port here once serving
  --tls-ca, --tls-cert, --tls-key
                   the cluster CA's certificate, the coordinator's
                   certificate (CN=coordinator) and key, PEM files
                   (tools/ptc-certs makes them); every gRPC connection is
                   mutual TLS. Default: $PTC_TLS_CA, $PTC_TLS_CERT,
                   $PTC_TLS_KEY
  --insecure       plaintext gRPC, no authentication (a warning is logged)
  --token-key      the cluster's job token key (tools/ptc-certs DIR
                   token-key): RegisterJob returns each job's token, which
                   its processes show to act on that job only
  --metrics-listen serve Prometheus metrics at http://HOST:PORT/metrics
                   (hosts, jobs, reconfigurations by outcome, bytes moved,
                   phase durations; default: off)
  --web-listen     serve the read-only web view at https://HOST:PORT/ (the
                   hosts, the jobs, where their ranks run, changes in
                   flight; HTTPS with --tls-cert and --tls-key, HTTP only
                   with --insecure; default: off). Needs --web-token-file
  --web-token-file the viewer's token (one line, 16 or more characters of
                   letters, digits and ._~-; e.g. openssl rand -hex 16): a
                   browser opens https://HOST:PORT/?token=TOKEN once. It can
                   only look; never give it the admin key
)";

absl::Status Run(int argc, char** argv) {
  const std::vector<std::string> kOptions = {
      "config",     "state-dir",     "listen",         "host-timeout",
      "log-level",  "port-file",     "tls-ca",         "tls-cert",
      "tls-key",    "token-key",     "metrics-listen", "host-expiry",
      "etcd",       "etcd-prefix",   "etcd-lease",     "advertise",
      "etcd-ca",    "etcd-cert",     "etcd-key",       "heartbeats-per-second",
      "web-listen", "web-token-file"};
  const std::vector<std::string> kFlags = {"help", "insecure"};
  PTC_ASSIGN_OR_RETURN(Args args, Args::Parse(argc, argv, 1, kOptions, kFlags));
  if (args.Flag("help")) {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  PTC_ASSIGN_OR_RETURN(const Settings settings,
                       Settings::Load(args, kOptions, kFlags));
  PTC_RETURN_IF_ERROR(SetLogLevel(settings.Get("log-level", "info")));
  // A connection per host and per training process that follows its job.
  if (const int64_t files = RaiseOpenFilesLimit(); files < 65536) {
    Log("coordinator")
        ->warn(
            "this process may open {} files: each host and each training "
            "process holds a connection to the coordinator, so it serves "
            "fewer than that; raise the limit (LimitNOFILE= of its systemd "
            "unit; deploy/systemd/ptc-coordinator.service sets 1048576)",
            files);
  }
  PTC_ASSIGN_OR_RETURN(const bool insecure, settings.Flag("insecure"));
  PTC_RETURN_IF_ERROR(ConfigureProcessSecurity(
      {settings.Get("tls-ca"), settings.Get("tls-cert"),
       settings.Get("tls-key"), insecure},
      "ptc-coordinator"));
  PTC_RETURN_IF_ERROR(ConfigureJobTokens(settings.Get("token-key")));
  CoordinatorServerOptions options;
  options.listen_address = settings.Get("listen", "127.0.0.1:7000");
  if (settings.Has("etcd") == settings.Has("state-dir")) {
    return absl::InvalidArgumentError(
        "give --state-dir (one coordinator) or --etcd (several), not both");
  }
  options.service.state_dir = settings.Get("state-dir");
  double timeout = 5;
  if (!absl::SimpleAtod(settings.Get("host-timeout", "5"), &timeout) ||
      timeout <= 0) {
    return absl::InvalidArgumentError(
        "--host-timeout needs a positive number of seconds");
  }
  options.service.host_timeout = absl::Seconds(timeout);
  double expiry = 86400;
  if (!absl::SimpleAtod(settings.Get("host-expiry", "86400"), &expiry) ||
      !(expiry >= timeout)) {
    return absl::InvalidArgumentError(
        "--host-expiry needs seconds, at least the host timeout");
  }
  options.service.host_expiry = absl::Seconds(expiry);
  options.service.heartbeat_interval =
      std::min(absl::Seconds(1), absl::Seconds(timeout / 4));
  double rate = 500;
  if (!absl::SimpleAtod(settings.Get("heartbeats-per-second", "500"),
                        &rate) ||
      !(rate >= 1 && rate <= 1e6)) {
    return absl::InvalidArgumentError(
        "--heartbeats-per-second needs a number from 1 to 1000000");
  }
  options.service.max_heartbeats_per_second = rate;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atomic<bool> stopping{false};
  absl::Notification stop;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    Log("coordinator")->info("signal {}: stopping", sig);
    stopping = true;
    stop.Notify();
  });
  waiter.detach();
  std::shared_ptr<EtcdControlStore> etcd;
  if (settings.Has("etcd")) {
    EtcdOptions eo;
    eo.endpoints = absl::StrSplit(settings.Get("etcd"), ',', absl::SkipEmpty());
    eo.prefix = settings.Get("etcd-prefix", "/ptc");
    eo.ca = settings.Get("etcd-ca");
    eo.cert = settings.Get("etcd-cert");
    eo.key = settings.Get("etcd-key");
    if (eo.ca.empty() && !insecure) {
      return absl::InvalidArgumentError(
          "--etcd needs --etcd-ca, --etcd-cert and --etcd-key (etcd's CA and "
          "this coordinator's client certificate from it), or --insecure");
    }
    double lease = 5;
    if (!absl::SimpleAtod(settings.Get("etcd-lease", "5"), &lease) ||
        !(lease >= 2 && lease <= 300) || lease != static_cast<int>(lease)) {
      return absl::InvalidArgumentError(
          "--etcd-lease needs whole seconds from 2 to 300 (etcd's leases "
          "are whole seconds)");
    }
    eo.lease = absl::Seconds(static_cast<int64_t>(lease));
    eo.identity = settings.Get("advertise", options.listen_address);
    PTC_ASSIGN_OR_RETURN(etcd, EtcdControlStore::Connect(std::move(eo)));
    // Until it leads it answers every call with the leader's address, and
    // tells channels that follow the leader that it does not serve.
    PTC_ASSIGN_OR_RETURN(
        std::unique_ptr<StandbyServer> standby,
        StandbyServer::Start(options.listen_address,
                             [e = etcd.get()] { return e->SeenLeader(); }));
    // The leader's server takes the same port (one picked for port 0).
    options.listen_address =
        absl::StrCat(options.listen_address.substr(
                         0, options.listen_address.rfind(':')),
                     ":", standby->port());
    Log("coordinator")
        ->info("standing by on port {}; campaigning in {}", standby->port(),
               etcd->Describe());
    absl::Status led = etcd->Campaign(stopping, [](const std::string& why) {
      // Everything this process knows may be stale now, and a standby is
      // taking over: stop at once (a service manager starts it again, as a
      // standby). Its writes would be refused anyway.
      Log("coordinator")->critical("stopping: lost the lead ({})", why);
      std::_Exit(75);
    });
    if (absl::IsCancelled(led)) return absl::OkStatus();
    PTC_RETURN_IF_ERROR(led);
    standby->Shutdown();
    options.service.store = etcd;
  }
  PTC_ASSIGN_OR_RETURN(auto server, CoordinatorServer::Start(options));
  std::unique_ptr<MetricsServer> metrics;
  if (settings.Has("metrics-listen")) {
    PTC_ASSIGN_OR_RETURN(metrics,
                         MetricsServer::Start(settings.Get("metrics-listen")));
  }
  std::unique_ptr<WebView> web;
  if (settings.Has("web-listen") != settings.Has("web-token-file")) {
    return absl::InvalidArgumentError(
        "--web-listen and --web-token-file go together (the view needs its "
        "viewer token)");
  }
  if (settings.Has("web-listen")) {
    WebView::Options wo;
    wo.listen = settings.Get("web-listen");
    PTC_ASSIGN_OR_RETURN(wo.token,
                         WebView::ReadToken(settings.Get("web-token-file")));
    if (!insecure) {
      auto from = [&](const char* option, const char* env) {
        const char* e = std::getenv(env);
        return settings.Get(option, e != nullptr ? e : "");
      };
      wo.tls_cert = from("tls-cert", "PTC_TLS_CERT");
      wo.tls_key = from("tls-key", "PTC_TLS_KEY");
    }
    // The view asks this coordinator over gRPC, as any client would.
    std::string host =
        options.listen_address.substr(0, options.listen_address.rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]")
      host = "127.0.0.1";
    wo.coordinator = absl::StrCat(host, ":", server->port());
    PTC_ASSIGN_OR_RETURN(web, WebView::Start(std::move(wo)));
  }
  if (settings.Has("port-file")) {
    const std::string path = settings.Get("port-file");
    {
      std::ofstream out(path + ".tmp");
      out << server->port() << "\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  Log("coordinator")
      ->info("ptc-coordinator serving on port {}, state in {}", server->port(),
             etcd != nullptr ? etcd->Describe()
                             : "state directory " + options.service.state_dir);
  stop.WaitForNotification();
  server->Shutdown();
  // A standby takes over now rather than when the lease runs out.
  if (etcd != nullptr) etcd->Resign();
  return absl::OkStatus();
}

}  // namespace
}  // namespace ptc

int main(int argc, char** argv) {
  ptc::InstallCrashHandler(argv[0]);
  ptc::ConfigureMutexChecks();
  // glibc gives each thread that allocates an arena of its own, up to 8 per
  // core, and frees little of them back: the coordinator's 256 RPC threads
  // left its memory 25-35% above what 4 arenas hold on a 2-core machine
  // (docs/benchmarks.md). Two per core, at least 4; MALLOC_ARENA_MAX in the
  // environment still decides.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) {
    mallopt(M_ARENA_MAX,
            std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency())));
  }
  const absl::Status s = ptc::Run(argc, argv);
  if (!s.ok()) {
    std::cerr << "ptc-coordinator: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
