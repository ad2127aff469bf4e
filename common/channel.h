// Every gRPC connection of a ptc process is made here, with the process's
// one transport security: mutual TLS with the cluster's CA (each side shows
// a certificate the CA signed and checks the other's), or plaintext where
// the operator said --insecure.
//
// A binary configures it once at start (ConfigureSecurity, from its flags
// or config file); a library in a process that did not (a training job's
// client) takes it from the environment: PTC_TLS_CA, PTC_TLS_CERT and
// PTC_TLS_KEY (files), or PTC_INSECURE=1.
//
//   PTC_RETURN_IF_ERROR(ConfigureSecurity(
//       {.ca = "/etc/ptc/ca.pem", .cert = "/etc/ptc/host7.pem",
//        .key = "/etc/ptc/host7.key"}, "ptcd"));
//   auto stub = proto::TensorStore::NewStub(OpenChannel("host3:7070"));
//   builder.AddListeningPort(address, ServerCredentials());
#ifndef PTC_COMMON_CHANNEL_H_
#define PTC_COMMON_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace ptc {

struct SecurityOptions {
  // PEM files: the cluster CA's certificate, this process's certificate
  // and its key. All three, or none with `insecure`.
  std::string ca;
  std::string cert;
  std::string key;
  // Plaintext, no authentication (logged as a warning).
  bool insecure = false;
};

// Sets the process's transport security; reads and checks the files.
// INVALID_ARGUMENT names what is missing (no files and not insecure: the
// operator must choose); NOT_FOUND names a file that cannot be read.
// `program` names the process in the warning for plaintext.
absl::Status ConfigureSecurity(const SecurityOptions& options,
                               const std::string& program);

// For a binary: what its flags or config file gave (empty: not given),
// completed from the environment, then ConfigureSecurity.
absl::Status ConfigureProcessSecurity(SecurityOptions given,
                                      const std::string& program);

// The options from PTC_TLS_CA, PTC_TLS_CERT, PTC_TLS_KEY and PTC_INSECURE
// (unset fields stay empty).
SecurityOptions SecurityFromEnvironment();

// Whether connections use TLS (after ConfigureSecurity, or from the
// environment on first use).
bool TlsEnabled();

// A channel to `address` ("host:port") with the process's security; with
// several ("a:7000,b:7000": the coordinators of a cluster), to the one
// whose gRPC health service says SERVING (the leader; standbys say
// NOT_SERVING), following it when another takes over (name the peers by
// `expected_name` then). With
// TLS the peer's certificate must be signed by the cluster CA and name the
// address's host (or `expected_name`, when given: a peer known by name).
// A training job's client passes its `job_token` (common/job_token.h):
// with TLS every call on the channel carries it. "unix:PATH": a ptcd's
// coordinator relay, as OpenLocalChannel.
// A channel to the coordinator ("coordinator" as `expected_name`) uses
// the patient keepalive (kPatientKeepaliveTimeoutMs); `args` that set a
// keepalive (SetKeepalive) keep theirs.
std::shared_ptr<grpc::Channel> OpenChannel(
    const std::string& address,
    grpc::ChannelArguments args = grpc::ChannelArguments(),
    const std::string& expected_name = "", const std::string& job_token = "");

// A channel to `address` that the process keeps for its later calls of
// the same `kind` (the caller's name for its `args`) and `expected_name`:
// OpenChannel's, made once rather than per call. The coordinator's calls
// to every host (a save's proof, a change's admissions, commit and
// release) each made a channel: a connection and, with TLS, both
// handshakes per host and call (tools/fanout_benchmark: 4.3 ms of the
// caller's CPU a call against 0.3 ms on a kept channel, 16 ptcds, mutual
// TLS). A kept channel whose last connection attempt failed
// (TRANSIENT_FAILURE: it waits out a backoff, and would fail a call at
// once) is replaced by a new one, which connects at the call as a
// channel made for it would; each kept channel has a connection of its
// own. ConfigureSecurity drops them all; at most 16,384 are kept.
std::shared_ptr<grpc::Channel> KeptChannel(
    const std::string& address, const std::string& kind,
    grpc::ChannelArguments args = grpc::ChannelArguments(),
    const std::string& expected_name = "");

// The process's kept channel (KeptChannel) to the ptcd at `address`, for
// its TensorStore and Transformer calls alike (messages up to 16 MiB
// received, 64 MiB sent): one connection per host for the short calls,
// whose keepalive fails a call to a cut link within seconds, and one more,
// `patient` (kPatientKeepaliveTimeoutMs), for a change's staging streams,
// which a host too busy to answer a ping must not abort. Two connections
// per host, not one per service and keepalive: a kept TLS connection
// costs its caller about 170 KiB (tools/fanout_benchmark), 1 GiB for
// three per host at 2,048 hosts.
std::shared_ptr<grpc::Channel> HostChannel(
    const std::string& address, bool patient = false,
    const std::string& expected_name = "");

// A channel to a Unix socket of this host's ptcd (its coordinator relay,
// ptcd/coordinator_relay.h), for the coordinator's calls: plaintext (the
// socket admits only the users allowed on the daemon's local socket), with
// the job's token, when given, on every call, and the coordinator's
// retries of calls refused for busy threads.
std::shared_ptr<grpc::Channel> OpenLocalChannel(const std::string& socket_path,
                                                const std::string& job_token);

// While a call is open, a channel made by OpenChannel pings its peer
// after this long without a frame, and drops a connection whose ping is
// not answered within kKeepaliveTimeoutMs: a call to a peer behind a cut
// link fails UNAVAILABLE within about 4 s instead of waiting out its
// deadline.
inline constexpr int kKeepaliveTimeMs = 2000;
inline constexpr int kKeepaliveTimeoutMs = 2000;

// Channels to the coordinator (a ptcd's heartbeats and its relay of the
// host's processes' calls, a job's client, ptcctl), and a server's pings
// of its clients, ping after this long without a frame and wait this long
// for a ping's answer instead. A ptcd's relay carries every Watch stream
// of its host's processes: a coordinator busy for a few seconds (at 512
// hosts on two cores, 4,000 processes asking at once after a failure)
// must not have every stream of a host broken and opened again at once,
// which only adds to its load. A coordinator whose link is cut, or that
// hangs, is noticed within 20 s (its relay's calls fail, its heartbeat
// stream ends). Every 10 s rather than 2 s: 2,048 hosts' relays pinging
// every 2 s are a thousand pings a second at the coordinator. (gRPC
// 1.51's race between a ping's answer and its watchdog, grpc/grpc#32085,
// still crashed hollow hosts processes holding hundreds of such channels
// at a load average near 1,900; fewer pings did not prevent it.)
inline constexpr int kPatientKeepaliveTimeMs = 10000;
inline constexpr int kPatientKeepaliveTimeoutMs = 10000;

// Sets the keepalive above on `args` (OpenChannel does; for channels made
// with other credentials). `patient`: kPatientKeepaliveTimeoutMs.
void SetKeepalive(grpc::ChannelArguments& args, bool patient = false);

// For an instrument that runs hundreds of hosts in one process
// (ptc-hollow) on an overloaded machine: every channel and server this
// process makes afterwards pings every `every_ms` and waits as long for
// the answer, instead of the times above. gRPC 1.51 can crash when a
// ping's answer and its watchdog race (grpc/grpc#32085); answers that come
// long before the watchdog do not race. Not for a ptcd or a coordinator:
// it slows their noticing a peer behind a cut link.
void SlowKeepalivesForProcess(int every_ms);

// gRPC's target for "A:P" (itself) or "A:P,B:P,...": the addresses
// resolved now, as one ipv4: (or ipv6:) list that gRPC connects to in
// order, staying with the first that accepts. An entry that does not
// resolve is left out (logged); none resolving leaves the text as it is,
// for gRPC's own error.
std::string ChannelTarget(const std::string& addresses);

// Lets a server's clients ping as OpenChannel's channels do (gRPC refuses
// frequent pings by default), and makes the server ping idle clients.
void AllowKeepalivePings(grpc::ServerBuilder& builder);

// Server credentials with the process's security: with TLS every client
// must present a certificate the cluster CA signed.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();

// The authenticated caller's certificate name (CN): a host's name,
// "coordinator", "admin", "client" or "client:JOB". Empty over plaintext.
std::string PeerName(const grpc::ServerContextBase& ctx);

}  // namespace ptc

#endif  // PTC_COMMON_CHANNEL_H_
