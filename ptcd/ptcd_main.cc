// ptcd: the per-host daemon of ptc. Holds the tensor store of the jobs
// whose ranks run on this host and serves it to peers (gRPC) and local
// training processes (Unix socket, shared memory).
//
// SIGTERM or SIGINT drains: no new calls are taken, calls in flight get
// --drain-seconds to finish, then the daemon exits 0.
#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/args.h"
#include "common/authz.h"
#include "common/channel.h"
#include "common/crash.h"
#include "common/job_token.h"
#include "common/limits.h"
#include "common/local_peer.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "ptcd/coordinator_agent.h"
#include "ptcd/coordinator_relay.h"
#include "snapshot/snapshot_dir.h"
#include "state_transformer/transformer_service.h"
#include "tensor_store/tensor_store_server.h"

namespace ptc {
namespace {

constexpr char kUsage[] =
    R"(usage: ptcd [--config FILE] [--listen HOST:PORT] [--socket PATH]
            [--memory-limit BYTES] [--log-level LEVEL] [--allowed-uids UID,...]
            [--allowed-group GROUP] [--token-key FILE] [--metrics-listen HOST:PORT]
            [--spare-pool BYTES] [--background-fingerprints on|off]
            [--drain-seconds N] [--put-timeout SECONDS] [--port-file FILE]
            [--coordinator HOST:PORT --name NAME --gpus N [--advertise HOST:PORT]
             [--bandwidth BYTES_PER_S] [--domain PATH] [--coordinator-socket PATH]]
            [--snapshot-root DIR]
            (--tls-ca FILE --tls-cert FILE --tls-key FILE | --insecure)

  --config         "key = value" file with a key for every option (the
                   option's name with '_' for '-': memory_limit, tls_ca,
                   insecure = true, ...); flags override it
  --listen         gRPC address (default 127.0.0.1:7070; port 0 picks one)
  --socket         Unix socket for local training processes
                   (default /run/ptcd/ptcd.sock; "none" disables it)
  --memory-limit   most bytes the store may hold, e.g. 64GiB (default 8GiB)
  --spare-pool     memory kept allocated for the next local saves (checkpoints
                   repeat their sizes), refilled at once from memory the store
                   frees; part of the limit, given up first when a put needs
                   room (default: memory limit / 16; 0 disables)
  --background-fingerprints
                   on (default): fingerprint every committed version's
                   regions at idle priority, so that a reconfiguration from
                   it need not; off: leave it to the reconfiguration
  --log-level      trace, debug, info, warn, error (default info)
  --allowed-uids   users besides ptcd's own and root that may use the socket
  --allowed-group  members of this group (name or gid) may use the socket
                   (default: ptcd's own group)
  --token-key      the cluster's job token key (tools/ptc-certs DIR
                   token-key); with it, local clients must show their
                   job's token and act on that job only, and clients with a
                   "client" certificate must carry one on gRPC
  --drain-seconds  how long calls in flight may finish on SIGTERM (default 10)
  --put-timeout    a save's memory reserved and not committed for this many
                   seconds (a client that hangs) is freed (default 600)
  --port-file      write the bound gRPC port here once serving
  --coordinator    register with this ptc-coordinator and heartbeat to it
                   (several, comma-separated: the one that leads)
  --coordinator-socket
                   Unix socket through which this host's training processes
                   reach the coordinator over ptcd's one connection (a
                   relayed call acts with its job's token only; default:
                   the --socket path with "-coordinator" before ".sock";
                   "none": processes connect directly)
  --name           this host's name in the cluster (default: the hostname)
  --gpus           GPUs of this host (default 8)
  --gpu-memory     memory of each GPU, e.g. 80GiB (the advisor fits configs
                   in it; default: unknown, taken as 80 GiB)
  --advertise      address peers and the coordinator use to reach this ptcd
                   (default: --listen, with the bound port)
  --bandwidth      this host's link, bytes per second (default 25e9)
  --domain         the failure domain this host shares with others, a path
                   from the widest ("rack3", "dc1/rack3"): placements keep
                   a copy of every region outside each domain where they
                   can, and say which losses they survive (default: none
                   but the host itself)
  --tls-ca, --tls-cert, --tls-key
                   the cluster CA's certificate, this host's certificate
                   (its CN is the host's --name) and key, PEM files
                   (tools/ptc-certs makes them); every gRPC connection is
                   mutual TLS. Default: $PTC_TLS_CA, $PTC_TLS_CERT,
                   $PTC_TLS_KEY
  --insecure       plaintext gRPC, no authentication (a warning is logged)
  --metrics-listen serve Prometheus metrics at http://HOST:PORT/metrics
                   (store memory, requests, errors by code, bytes moved;
                   default: off)
  --ucx-transports the UCX transports to use (UCX_TLS syntax, e.g. "^cma";
                   default: UCX's choice, or $UCX_TLS)
  --snapshot-root  snapshots are written to and read from directories
                   under DIR only (default: any absolute path the daemon
                   may write; systemd's unit allows /var/lib/ptc/snapshots)
)";

absl::Status Run(int argc, char** argv) {
  const std::vector<std::string> kOptions = {
      "config",         "listen",
      "socket",         "memory-limit",
      "spare-pool",     "background-fingerprints",
      "log-level",      "allowed-uids",
      "allowed-group",  "drain-seconds",
      "port-file",      "coordinator",
      "name",           "gpus",
      "advertise",      "gpu-memory",
      "bandwidth",      "ucx-gets",
      "tls-ca",         "tls-cert",
      "tls-key",        "token-key",
      "metrics-listen", "ucx-transports",
      "snapshot-root",  "put-timeout",
      "domain",         "coordinator-socket"};
  const std::vector<std::string> kFlags = {"help", "insecure"};
  PTC_ASSIGN_OR_RETURN(Args args, Args::Parse(argc, argv, 1, kOptions, kFlags));
  if (args.Flag("help")) {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  PTC_ASSIGN_OR_RETURN(const Settings settings,
                       Settings::Load(args, kOptions, kFlags));
  PTC_RETURN_IF_ERROR(SetLogLevel(settings.Get("log-level", "info")));
  {
    SecurityOptions security;
    security.ca = settings.Get("tls-ca", "");
    security.cert = settings.Get("tls-cert", "");
    security.key = settings.Get("tls-key", "");
    PTC_ASSIGN_OR_RETURN(security.insecure, settings.Flag("insecure"));
    PTC_RETURN_IF_ERROR(ConfigureProcessSecurity(security, "ptcd"));
    PTC_RETURN_IF_ERROR(ConfigureJobTokens(settings.Get("token-key", "")));
  }
  TensorStoreServerOptions options;
  options.listen_address = settings.Get("listen", "127.0.0.1:7070");
  options.socket_path = settings.Get("socket", "/run/ptcd/ptcd.sock");
  if (options.socket_path == "none") options.socket_path.clear();
  PTC_ASSIGN_OR_RETURN(options.memory_limit_bytes,
                       ParseBytes(settings.Get("memory-limit", "8GiB")));
  PTC_ASSIGN_OR_RETURN(
      options.spare_pool_bytes,
      ParseBytes(settings.Get(
          "spare-pool", std::to_string(options.memory_limit_bytes / 16))));
  const std::string fingerprints =
      settings.Get("background-fingerprints", "on");
  if (fingerprints != "on" && fingerprints != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("background fingerprints must be 'on' or 'off', not '",
                     fingerprints, "'"));
  }
  options.fingerprint_committed = fingerprints == "on";
  for (absl::string_view uid : absl::StrSplit(settings.Get("allowed-uids", ""),
                                              ',', absl::SkipEmpty())) {
    uid_t u;
    if (!absl::SimpleAtoi(uid, &u)) {
      return absl::InvalidArgumentError(
          absl::StrCat("allowed uid '", uid, "' is not a number"));
    }
    options.allowed_uids.push_back(u);
  }
  if (const std::string group = settings.Get("allowed-group", "");
      !group.empty()) {
    gid_t gid;
    if (absl::SimpleAtoi(group, &gid)) {
      options.allowed_gid = gid;
    } else {
      struct group entry, *found = nullptr;
      std::vector<char> buffer(16384);
      if (getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(),
                     &found) != 0 ||
          found == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("allowed group '", group, "' is not a group here"));
      }
      options.allowed_gid = found->gr_gid;
    }
  }
  double put_timeout = 0;
  if (!absl::SimpleAtod(settings.Get("put-timeout", "600"), &put_timeout) ||
      !(put_timeout >= 1 && put_timeout <= 7 * 24 * 3600)) {
    return absl::InvalidArgumentError(
        "put timeout must be seconds from 1 to a week (604800)");
  }
  options.put_timeout = absl::Seconds(put_timeout);
  int drain_seconds;
  if (!absl::SimpleAtoi(settings.Get("drain-seconds", "10"), &drain_seconds) ||
      drain_seconds < 0) {
    return absl::InvalidArgumentError(
        "drain seconds must be a non-negative integer");
  }

  // Signals go to sigwait below, not to whichever thread gRPC runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  {
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    options.host_name = settings.Get("name", hostname);
  }
  if (const std::string tls = settings.Get("ucx-transports", "");
      !tls.empty()) {
    // Read by UCX when the transformer creates its workers.
    setenv("UCX_TLS", tls.c_str(), /*overwrite=*/1);
  }
  TransformerOptions transformer;
  if (settings.Has("ucx-gets")) {
    // Accepted so that configurations of older releases still start.
    Log("ptcd")->warn(
        "ucx-gets is ignored: ptcd no longer reads peers' memory with UCX "
        "one-sided gets (they are not safe on every transport; see "
        "docs/security.md); remove it from the configuration");
  }
  transformer.snapshot_root = settings.Get("snapshot-root", "");
  if (!transformer.snapshot_root.empty()) {
    PTC_RETURN_IF_ERROR(Annotate(CheckSnapshotRoot(transformer.snapshot_root, ""),
                                 "--snapshot-root"));
  }
  PTC_RETURN_IF_ERROR(
      CheckCallerPolicies(proto::Transformer::service_full_name()));
  options.services.push_back(
      [transformer, admissions = options.peer_admissions](Store* store) {
        return std::make_unique<TransformerService>(store, transformer,
                                                    admissions);
      });
  // Started before the local socket, which tells processes where it is.
  std::unique_ptr<CoordinatorRelay> relay;
  if (const std::string coordinator = settings.Get("coordinator", "");
      !coordinator.empty() && !options.socket_path.empty()) {
    const bool given = settings.Has("coordinator-socket");
    const std::string path =
        settings.Get("coordinator-socket", RelaySocketFor(options.socket_path));
    if (!given && !FitsSocketAddress(path)) {
      Log("tensor_store")
          ->warn(
              "no coordinator relay: {} is too long for a socket's "
              "address (give --coordinator-socket); this host's "
              "processes connect to the coordinator directly",
              path);
    } else if (path != "none") {
      auto started = CoordinatorRelay::Start(
          {.socket_path = path,
           .coordinator = coordinator,
           .access = {.allowed_uids = options.allowed_uids,
                      .allowed_gid = options.allowed_gid}});
      PTC_RETURN_IF_ERROR(Annotate(started.status(), "--coordinator-socket"));
      relay = std::move(*started);
      options.coordinator_relay = path;
      options.coordinator = coordinator;
    }
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<TensorStoreServer> server,
                       TensorStoreServer::Start(options));
  if (const std::string path = settings.Get("port-file", ""); !path.empty()) {
    {
      std::ofstream out(path + ".tmp");
      out << server->port() << "\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  std::unique_ptr<MetricsServer> metrics;
  if (const std::string address = settings.Get("metrics-listen", "");
      !address.empty()) {
    PTC_ASSIGN_OR_RETURN(metrics, MetricsServer::Start(address));
  }
  std::unique_ptr<CoordinatorAgent> agent;
  if (const std::string coordinator = settings.Get("coordinator", "");
      !coordinator.empty()) {
    proto::HostStatus host;
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    host.set_name(options.host_name);
    int gpus = 8;
    double bandwidth = 25e9;
    if (!absl::SimpleAtoi(settings.Get("gpus", "8"), &gpus) || gpus < 1 ||
        gpus > kMaxGpusPerHost) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus needs a number from 1 to ", kMaxGpusPerHost));
    }
    if (!absl::SimpleAtod(settings.Get("bandwidth", "25e9"), &bandwidth) ||
        !(bandwidth > 0 && bandwidth <= kMaxHostBandwidth)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--bandwidth needs bytes per second, above 0 and at most ",
          kMaxHostBandwidth));
    }
    host.set_gpus(gpus);
    if (settings.Has("gpu-memory")) {
      auto gpu_memory = ParseBytes(settings.Get("gpu-memory"));
      PTC_RETURN_IF_ERROR(Annotate(gpu_memory.status(), "--gpu-memory"));
      host.set_gpu_memory_bytes(*gpu_memory);
    }
    host.set_bandwidth(bandwidth);
    PTC_RETURN_IF_ERROR(
        Annotate(ValidateDomain(settings.Get("domain", "")), "--domain"));
    host.set_domain(settings.Get("domain", ""));
    host.set_memory_bytes(options.memory_limit_bytes);
    if (!options.socket_path.empty()) {
      // Absolute: a launcher on this machine connects the job's processes
      // to it wherever it runs from (a path too long for sun_path once
      // absolute is not registered: ptcctl run then does not find it).
      std::error_code ignored;
      const std::filesystem::path socket =
          std::filesystem::absolute(options.socket_path, ignored);
      if (socket.string().size() <= 107) host.set_socket(socket.string());
    }
    host.set_incarnation(absl::Uniform<uint64_t>(absl::BitGen()));
    std::string advertise = settings.Get("advertise", "");
    if (advertise.empty()) {
      const std::string listen = options.listen_address;
      advertise = absl::StrCat(listen.substr(0, listen.rfind(':')), ":",
                               server->port());
      if (absl::StartsWith(advertise, "0.0.0.0:"))
        advertise = absl::StrCat(hostname, ":", server->port());
    }
    PTC_RETURN_IF_ERROR(
        Annotate(ParseHostPort(advertise).status(), "--advertise"));
    host.set_address(advertise);
    agent =
        std::make_unique<CoordinatorAgent>(coordinator, host, server->store());
  }
  Log("tensor_store")
      ->info("ptcd ready: gRPC port {}, socket {}", server->port(),
             options.socket_path.empty() ? "disabled" : options.socket_path);
  int sig = 0;
  sigwait(&signals, &sig);
  Log("tensor_store")
      ->info("signal {}: draining for up to {} s", sig, drain_seconds);
  agent.reset();
  server->Shutdown(absl::Seconds(drain_seconds));
  Log("tensor_store")->info("ptcd stopped");
  return absl::OkStatus();
}

}  // namespace
}  // namespace ptc

int main(int argc, char** argv) {
  ptc::InstallCrashHandler(argv[0]);
  ptc::ConfigureMutexChecks();
  const absl::Status status = ptc::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "ptcd: " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
