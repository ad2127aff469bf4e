#include "common/channel.h"

#include <arpa/inet.h>
#include <grpcpp/support/client_interceptor.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/address.h"
#include "common/job_token.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

struct Security {
  bool configured = false;
  bool tls = false;
  std::string ca_pem, cert_pem, key_pem;
  // A channel's, made once from the files (null without TLS).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

absl::Mutex mu;
Security& Current() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  static Security* s = new Security;
  return *s;
}

absl::Status ReadPem(const std::string& path, const char* what,
                     const char* marker, std::string* out) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the ", what, " file '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  *out = text.str();
  if (!absl::StrContains(*out, marker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " file '", path, "' holds no PEM ", marker, " block"));
  }
  return absl::OkStatus();
}

// A channel's TLS credentials from `s`'s files, made once per security
// rather than per channel: a channel made for a call then costs its
// caller half (tools/fanout_benchmark, mutual TLS: 2.2-2.4 ms against
// 5.0-5.2 ms).
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsOf(
    const Security& s) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = s.ca_pem;
  ssl.pem_cert_chain = s.cert_pem;
  ssl.pem_private_key = s.key_pem;
  return grpc::SslCredentials(ssl);
}

absl::Status Apply(const SecurityOptions& o, const std::string& program,
                   Security* s) {
  const bool any = !o.ca.empty() || !o.cert.empty() || !o.key.empty();
  if (o.insecure && any) {
    return absl::InvalidArgumentError(
        "both TLS files and insecure were given; choose one");
  }
  if (o.insecure) {
    Log("security")
        ->warn(
            "{}: plaintext gRPC (--insecure): anyone who can reach the "
            "ports can read and change every job's state",
            program);
    *s = Security{true, false, "", "", ""};
    return absl::OkStatus();
  }
  if (o.ca.empty() || o.cert.empty() || o.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        program,
        " needs TLS: give the cluster CA, this process's certificate and its "
        "key (tls_ca, tls_cert, tls_key; tools/ptc-certs makes them), or "
        "--insecure for plaintext"));
  }
  Security next{true, true, "", "", ""};
  PTC_RETURN_IF_ERROR(
      ReadPem(o.ca, "CA certificate", "CERTIFICATE", &next.ca_pem));
  PTC_RETURN_IF_ERROR(
      ReadPem(o.cert, "certificate", "CERTIFICATE", &next.cert_pem));
  PTC_RETURN_IF_ERROR(ReadPem(o.key, "key", "PRIVATE KEY", &next.key_pem));
  next.credentials = ChannelCredentialsOf(next);
  *s = std::move(next);
  return absl::OkStatus();
}

// Puts a job's token on every call of a channel.
class TokenCredentials : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenCredentials(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(
      grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
      const grpc::AuthContext& /*channel_auth_context*/,
      std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({kJobTokenMetadata, token_});
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

// The process's security, from the environment if nobody configured it.
Security Get() {
  absl::MutexLock lock(&mu);
  Security& s = Current();
  if (!s.configured) {
    const SecurityOptions env = SecurityFromEnvironment();
    if (env.insecure || !env.ca.empty() || !env.cert.empty() ||
        !env.key.empty()) {
      if (absl::Status st = Apply(env, "this process", &s); !st.ok()) {
        Log("security")
            ->error("PTC_TLS_* / PTC_INSECURE: {}; connections will fail",
                    std::string(st.message()));
        // TLS with no files: every handshake fails, nothing goes in clear.
        s = Security{true, true, "", "", ""};
        s.credentials = ChannelCredentialsOf(s);
      }
    } else {
      // A library in a process that chose nothing (an in-process test):
      // plaintext, said once.
      Log("security")
          ->warn(
              "no transport security configured (PTC_TLS_CA, "
              "PTC_TLS_CERT, PTC_TLS_KEY); using plaintext gRPC");
      s = Security{true, false, "", "", ""};
    }
  }
  return s;
}

}  // namespace

namespace {

// KeptChannel's channels, by kind, expected name and address.
constexpr size_t kMaxKeptChannels = 16384;
absl::Mutex kept_mu;
std::map<std::string, std::shared_ptr<grpc::Channel>>& Kept()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kept_mu) {
  static auto* kept = new std::map<std::string, std::shared_ptr<grpc::Channel>>;
  return *kept;
}

}  // namespace

absl::Status ConfigureSecurity(const SecurityOptions& options,
                               const std::string& program) {
  Security next;
  if (absl::Status s = Apply(options, program, &next); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu);
    Current() = std::move(next);
  }
  // Channels kept with the security before are not used again.
  absl::MutexLock lock(&kept_mu);
  Kept().clear();
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> KeptChannel(const std::string& address,
                                           const std::string& kind,
                                           grpc::ChannelArguments args,
                                           const std::string& expected_name) {
  const std::string key = absl::StrCat(kind, "|", expected_name, "|", address);
  {
    absl::MutexLock lock(&kept_mu);
    auto it = Kept().find(key);
    if (it != Kept().end()) {
      const grpc_connectivity_state state = it->second->GetState(false);
      if (state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
          state != GRPC_CHANNEL_SHUTDOWN)
        return it->second;
    }
  }
  // A connection of its own: one made anew never shares a connection
  // that another channel's backoff holds down.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::Channel> channel =
      OpenChannel(address, std::move(args), expected_name);
  absl::MutexLock lock(&kept_mu);
  auto& kept = Kept();
  if (kept.size() >= kMaxKeptChannels && kept.count(key) == 0)
    kept.erase(kept.begin());
  kept[key] = channel;
  return channel;
}

std::shared_ptr<grpc::Channel> HostChannel(const std::string& address,
                                           bool patient,
                                           const std::string& expected_name) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (patient) SetKeepalive(args, /*patient=*/true);
  return KeptChannel(address, patient ? "host, patient" : "host", args,
                     expected_name);
}

absl::Status ConfigureProcessSecurity(SecurityOptions given,
                                      const std::string& program) {
  const SecurityOptions env = SecurityFromEnvironment();
  const bool files =
      !given.ca.empty() || !given.cert.empty() || !given.key.empty();
  if (!given.insecure && !files) {
    given = env;
  } else if (files) {
    if (given.ca.empty()) given.ca = env.ca;
    if (given.cert.empty()) given.cert = env.cert;
    if (given.key.empty()) given.key = env.key;
  }
  return ConfigureSecurity(given, program);
}

SecurityOptions SecurityFromEnvironment() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  SecurityOptions o;
  o.ca = env("PTC_TLS_CA");
  o.cert = env("PTC_TLS_CERT");
  o.key = env("PTC_TLS_KEY");
  const std::string insecure = env("PTC_INSECURE");
  o.insecure = !insecure.empty() && insecure != "0";
  return o;
}

bool TlsEnabled() { return Get().tls; }

std::string ChannelTarget(const std::string& addresses) {
  if (!absl::StrContains(addresses, ',')) return addresses;
  std::vector<std::string> v4, v6;
  for (absl::string_view entry : absl::StrSplit(addresses, ',')) {
    auto hp = ParseHostPort(entry);
    if (!hp.ok()) {
      Log("net")->warn("{}", std::string(hp.status().message()));
      continue;
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(hp->host.c_str(), nullptr, &hints, &found) != 0 ||
        found == nullptr) {
      Log("net")->warn("{} does not resolve: left out of {}", hp->host,
                       addresses);
      continue;
    }
    char text[INET6_ADDRSTRLEN] = {0};
    if (found->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr,
                text, sizeof(text));
      v4.push_back(absl::StrCat(text, ":", hp->port));
    } else if (found->ai_family == AF_INET6) {
      inet_ntop(AF_INET6,
                &reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr,
                text, sizeof(text));
      v6.push_back(absl::StrCat("[", text, "]:", hp->port));
    }
    freeaddrinfo(found);
  }
  if (!v4.empty() && !v6.empty()) {
    Log("net")->warn("{} mixes IPv4 and IPv6: only the IPv4 addresses are used",
                     addresses);
  }
  if (!v4.empty()) return absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
  if (!v6.empty()) return absl::StrCat("ipv6:", absl::StrJoin(v6, ","));
  return addresses;
}

// A coordinator whose RPC threads are all busy (thousands of a job's
// processes asking at once) refuses a call before running it
// (RESOURCE_EXHAUSTED): it is sent again after a jittered backoff (gRPC
// retries: 5 attempts, about 0.1 to 2 s apart), so a burst spreads out
// instead of failing processes.
constexpr char kCoordinatorRetries[] =
    R"("methodConfig": [{"name": [{"service": "ptc.proto.Coordinator"}],)"
    R"( "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s",)"
    R"( "maxBackoff": "2s", "backoffMultiplier": 3,)"
    R"( "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}])";

// Puts a job's token on every call of a plaintext channel (call
// credentials need a secure one).
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string token) : token_(std::move(token)) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kJobTokenMetadata, token_});
    }
    methods->Proceed();
  }

 private:
  const std::string token_;
};

class TokenInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token)
      : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(token_);
  }

 private:
  const std::string token_;
};

namespace {
// SlowKeepalivesForProcess's, or 0: the times in channel.h.
std::atomic<int> slow_keepalive_ms{0};
}  // namespace

void SlowKeepalivesForProcess(int every_ms) {
  slow_keepalive_ms.store(every_ms);
}

void SetKeepalive(grpc::ChannelArguments& args, bool patient) {
  const int slow = slow_keepalive_ms.load();
  args.SetInt(
      GRPC_ARG_KEEPALIVE_TIME_MS,
      slow > 0 ? slow : (patient ? kPatientKeepaliveTimeMs : kKeepaliveTimeMs));
  args.SetInt(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      slow > 0 ? slow
               : (patient ? kPatientKeepaliveTimeoutMs : kKeepaliveTimeoutMs));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // Keep pinging through a long wait with no data (a Watch stream, a
  // change's staging call): gRPC's default stops after two pings.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           grpc::ChannelArguments args,
                                           const std::string& expected_name,
                                           const std::string& job_token) {
  if (absl::StartsWith(address, "unix:"))
    return OpenLocalChannel(address.substr(5), job_token);
  // A connection whose peer vanished without closing it (a link cut, a
  // machine powered off) would keep the channel READY, and every call on
  // it would wait out its deadline. While a call is open the channel pings
  // its peer every kKeepaliveTime and drops the connection when a ping is
  // not answered within kKeepaliveTimeout: the call fails UNAVAILABLE and
  // the next one connects afresh. Idle channels do not ping.
  const grpc_channel_args set = args.c_channel_args();
  bool keepalive_set = false;
  for (size_t i = 0; i < set.num_args; ++i) {
    keepalive_set =
        keepalive_set ||
        std::strcmp(set.args[i].key, GRPC_ARG_KEEPALIVE_TIME_MS) == 0;
  }
  if (!keepalive_set)
    SetKeepalive(args, /*patient=*/expected_name == "coordinator");
  const std::string target = ChannelTarget(address);
  std::string config = kCoordinatorRetries;
  if (absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:")) {
    // Several peers, of which one serves (the coordinators: one leads):
    // the channel connects to all of them, asks each one's gRPC health
    // service, and sends calls only to a peer that says SERVING. A peer
    // without the service counts as serving. One that comes back is tried
    // within seconds (gRPC's default backoff grows to two minutes).
    config =
        absl::StrCat(R"("loadBalancingConfig": [{"round_robin": {}}],)",
                     R"( "healthCheckConfig": {"serviceName": ""}, )", config);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  } else if (expected_name == "coordinator") {
    // A coordinator back from an outage (stopped, restarted, its etcd
    // without a majority) is reached within seconds by every client that
    // waited through it, not up to two minutes later: its hosts' streams,
    // agents and processes would otherwise learn of the job's news late.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  }
  args.SetServiceConfigJSON(absl::StrCat("{", config, "}"));
  const Security s = Get();
  if (!s.tls) {
    return grpc::CreateCustomChannel(target,
                                     grpc::InsecureChannelCredentials(), args);
  }
  if (!expected_name.empty()) args.SetSslTargetNameOverride(expected_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials = s.credentials;
  if (!job_token.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::MetadataCredentialsFromPlugin(
                         std::make_unique<TokenCredentials>(job_token)));
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

std::shared_ptr<grpc::Channel> OpenLocalChannel(const std::string& socket_path,
                                                const std::string& job_token) {
  grpc::ChannelArguments args;
  args.SetServiceConfigJSON(absl::StrCat("{", kCoordinatorRetries, "}"));
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!job_token.empty())
    interceptors.push_back(
        std::make_unique<TokenInterceptorFactory>(job_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      absl::StrCat("unix:", socket_path), grpc::InsecureChannelCredentials(),
      args, std::move(interceptors));
}

void AllowKeepalivePings(grpc::ServerBuilder& builder) {
  // gRPC servers answer pings more often than every 5 minutes with a
  // GOAWAY ("too_many_pings") by default; ptc's channels ping every
  // kKeepaliveTimeMs while a call is open.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // The server also pings its clients, so that a stream to a client that
  // vanished (a Watch, a Put) is closed instead of held; nothing waits on
  // that, so a client slow to answer is given time.
  const int slow = slow_keepalive_ms.load();
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             slow > 0 ? slow : kPatientKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             slow > 0 ? slow : kPatientKeepaliveTimeoutMs);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  const Security s = Get();
  if (!s.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = s.ca_pem;
  ssl.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

std::string PeerName(const grpc::ServerContextBase& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  for (const grpc::string_ref& cn :
       auth->FindPropertyValues("x509_common_name")) {
    return std::string(cn.data(), cn.size());
  }
  return "";
}

}  // namespace ptc
