#include "coordinator/etcd_control_store.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

// The first key after every key that starts with `prefix` (etcd's
// range_end for a prefix).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// Whether etcd refused a request rather than failing to answer it: it
// checks a request (its size, its operations, the caller's permissions,
// its space quota) before it applies any of it, so nothing of a refused
// one is written, and sending it again is refused again. "too many
// requests" (RESOURCE_EXHAUSTED as well) is etcd shedding load: it passes.
bool RefusedByEtcd(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::OUT_OF_RANGE:
      return true;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return !absl::StrContains(s.error_message(), "too many requests");
    default:
      return false;
  }
}

absl::Status EtcdError(const std::string& what, const grpc::Status& s) {
  const absl::Status status = FromGrpcStatus(s);
  return absl::Status(status.code(),
                      absl::StrCat("etcd: ", what, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdControlStore>> EtcdControlStore::Connect(
    EtcdOptions options) {
  if (options.endpoints.empty())
    return absl::InvalidArgumentError("etcd: no endpoints given");
  if (options.prefix.empty() || options.prefix[0] != '/' ||
      absl::EndsWith(options.prefix, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd prefix '", options.prefix,
        "' must start with '/' and not end with one (e.g. /ptc)"));
  }
  if (options.lease < absl::Seconds(2) || options.lease > absl::Minutes(5)) {
    return absl::InvalidArgumentError(
        "the etcd lease must be 2 to 300 seconds");
  }
  if (options.identity.empty())
    return absl::InvalidArgumentError("etcd: this coordinator has no address");
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const int files = !options.ca.empty() + !options.cert.empty() +
                    !options.key.empty();
  if (files != 0 && files != 3) {
    return absl::InvalidArgumentError(
        "etcd TLS needs its CA, a client certificate and its key (all three)");
  }
  if (files == 3) {
    grpc::SslCredentialsOptions ssl;
    for (auto [path, pem] : {std::pair{&options.ca, &ssl.pem_root_certs},
                             {&options.cert, &ssl.pem_cert_chain},
                             {&options.key, &ssl.pem_private_key}}) {
      PTC_ASSIGN_OR_RETURN(std::optional<std::string> text,
                           ReadFileIfExists(*path));
      if (!text) {
        return absl::NotFoundError(
            absl::StrCat("etcd TLS: cannot read '", *path, "'"));
      }
      *pem = *std::move(text);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  SetKeepalive(args);
  // ReadAll's pages (each at most etcd's response limit).
  args.SetMaxReceiveMessageSize(64 << 20);
  if (files == 3) args.SetSslTargetNameOverride("etcd");
  // A member that comes back is tried again within a second (gRPC's
  // default backoff grows to two minutes). Not the minimum backoff: gRPC
  // gives a connection attempt that long to finish its handshake.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::vector<Endpoint> members;
  for (const std::string& address : options.endpoints) {
    auto channel = grpc::CreateCustomChannel(address, credentials, args);
    members.push_back({address, etcdserverpb::KV::NewStub(channel),
                       etcdserverpb::Lease::NewStub(channel)});
  }
  return std::unique_ptr<EtcdControlStore>(
      new EtcdControlStore(std::move(options), std::move(members)));
}

EtcdControlStore::EtcdControlStore(EtcdOptions options,
                                   std::vector<Endpoint> members)
    : options_(std::move(options)), members_(std::move(members)) {}

const EtcdControlStore::Endpoint& EtcdControlStore::Using() const {
  return members_[member_.load() % members_.size()];
}

std::string EtcdControlStore::SeenLeader() const {
  absl::MutexLock lock(&mu_);
  return seen_leader_;
}

void EtcdControlStore::Answered(const Endpoint& member,
                                const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
    return;
  if (members_.size() < 2) return;
  size_t index = &member - members_.data();
  const size_t next = (index + 1) % members_.size();
  // Only the first of several calls that failed on the same member moves
  // on (the others found it moved already).
  if (member_.compare_exchange_strong(index, next)) {
    Log("coordinator")
        ->warn("etcd member {} did not answer ({}): using {}", member.address,
               status.error_message(), members_[next].address);
  }
}

EtcdControlStore::~EtcdControlStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (renewer_.joinable()) renewer_.join();
}

std::unique_ptr<grpc::ClientContext> EtcdControlStore::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  // A member that refuses connections fails the call at once: the caller
  // moves to the next one (Answered) and tries again.
  return ctx;
}

absl::StatusOr<std::string> EtcdControlStore::Leader() {
  etcdserverpb::RangeRequest req;
  req.set_key(LeaderKey());
  etcdserverpb::RangeResponse resp;
  auto ctx = Context();
  const Endpoint& member = Using();
  grpc::Status s = member.kv->Range(ctx.get(), req, &resp);
  Answered(member, s);
  if (!s.ok()) return EtcdError("reading the leader key", s);
  return resp.kvs().empty() ? std::string() : resp.kvs(0).value();
}

absl::Status EtcdControlStore::Campaign(
    const std::atomic<bool>& stop,
    std::function<void(const std::string&)> on_lost) {
  std::string shown;  // the leader last logged
  absl::Status last_error;
  while (!stop.load()) {
    absl::StatusOr<std::string> leader = Leader();
    if (!leader.ok()) {
      if (leader.status().ToString() != last_error.ToString()) {
        Log("coordinator")
            ->warn("standing by: {} (retrying)", leader.status().ToString());
        last_error = leader.status();
      }
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    last_error = absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      seen_leader_ = *leader;
    }
    if (!leader->empty()) {
      if (*leader != shown) {
        Log("coordinator")
            ->info("standing by: the coordinator at {} leads", *leader);
        shown = *leader;
      }
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    // Nobody leads: a lease, and the leader key if it is still absent.
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(absl::ToInt64Seconds(options_.lease));
    etcdserverpb::LeaseGrantResponse granted;
    const absl::Time asked = absl::Now();  // the lease runs from no earlier
    auto ctx = Context();
    const Endpoint& member = Using();
    grpc::Status s = member.lease->LeaseGrant(ctx.get(), grant, &granted);
    Answered(member, s);
    if (!s.ok() || !granted.error().empty()) {
      Log("coordinator")
          ->warn("standing by: etcd granted no lease: {}",
                 s.ok() ? granted.error() : s.error_message());
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    etcdserverpb::TxnRequest txn;
    auto* cmp = txn.add_compare();
    cmp->set_key(LeaderKey());
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(LeaderKey());
    put->set_value(options_.identity);
    put->set_lease(granted.id());
    etcdserverpb::TxnResponse won;
    ctx = Context();
    s = member.kv->Txn(ctx.get(), txn, &won);
    Answered(member, s);
    if (!s.ok() || !won.succeeded()) {
      etcdserverpb::LeaseRevokeRequest revoke;
      revoke.set_id(granted.id());
      etcdserverpb::LeaseRevokeResponse revoked;
      auto rctx = Context();
      const Endpoint& revoker = Using();
      Answered(revoker, revoker.lease->LeaseRevoke(rctx.get(), revoke,
                                                   &revoked));  // best effort
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      lease_id_ = granted.id();
      leader_revision_ = won.header().revision();
      lease_valid_until_ = asked + options_.lease;
      on_lost_ = std::move(on_lost);
    }
    Log("coordinator")
        ->info("leading: holds {} (lease {:x}, {} s)", LeaderKey(),
               granted.id(), absl::ToInt64Seconds(options_.lease));
    renewer_ = std::thread([this, asked] { Renew(asked + options_.lease); });
    return absl::OkStatus();
  }
  return absl::CancelledError("stopped before this coordinator led");
}

absl::Duration EtcdControlStore::Margin() const {
  return std::max(absl::Milliseconds(500), options_.lease / 5);
}

void EtcdControlStore::Renew(absl::Time valid_until) {
  // The lease is known good until `valid_until`; it is renewed every
  // third of its TTL, and the lead is given up a margin before it could
  // have run out unrenewed.
  const absl::Duration margin = Margin();
  // After a failed renewal (an etcd member died, etcd is electing its
  // leader) the next try comes at once, not a third of the TTL later.
  bool failed = false;
  while (true) {
    int64_t id;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(
              absl::Condition(&stop_),
              failed ? absl::Milliseconds(100) : options_.lease / 3))
        return;
      id = lease_id_;
      if (id == 0) return;  // resigned
    }
    const absl::Time sent = absl::Now();
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(
        std::min(sent + options_.lease / 3, valid_until - margin)));
    const Endpoint& member = Using();
    auto stream = member.lease->LeaseKeepAlive(&ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(id);
    etcdserverpb::LeaseKeepAliveResponse resp;
    bool renewed = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    if (renewed) {
      ctx.TryCancel();
    }
    const grpc::Status finished = stream->Finish();
    if (!renewed) {
      // A stream the member ended without an answer says why; one that
      // ran out of time may end CANCELLED: the member did not answer.
      Answered(member, finished.ok() || finished.error_code() ==
                                            grpc::StatusCode::CANCELLED
                           ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                          "no renewal in time")
                           : finished);
    }
    if (renewed && resp.ttl() <= 0) {
      Lost("etcd says the leader's lease is gone (expired or revoked)");
      return;
    }
    failed = !renewed;
    if (renewed) {
      valid_until = sent + absl::Seconds(resp.ttl());
      absl::MutexLock lock(&mu_);
      lease_valid_until_ = valid_until;
    } else if (absl::Now() >= valid_until - margin) {
      Lost(absl::StrCat("the leader's lease could not be renewed for ",
                        absl::FormatDuration(absl::Now() - (valid_until -
                                                            options_.lease)),
                        " (etcd unreachable, or this machine stalled)"));
      return;
    }
  }
}

void EtcdControlStore::Lost(const std::string& reason) {
  std::function<void(const std::string&)> on_lost;
  {
    absl::MutexLock lock(&mu_);
    if (leader_revision_ == 0) return;
    leader_revision_ = 0;
    on_lost = std::move(on_lost_);
  }
  Log("coordinator")->error("lost the lead: {}", reason);
  if (on_lost) on_lost(reason);
}

void EtcdControlStore::Resign() {
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = lease_id_;
    lease_id_ = 0;
    leader_revision_ = 0;
    on_lost_ = nullptr;
  }
  if (id == 0) return;
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  auto ctx = Context();
  const Endpoint& member = Using();
  grpc::Status s = member.lease->LeaseRevoke(ctx.get(), req, &resp);
  Answered(member, s);
  if (s.ok()) {
    Log("coordinator")->info("resigned the lead");
  } else {
    Log("coordinator")
        ->warn("resigning the lead: {} (a standby takes over when the lease "
               "runs out)",
               s.error_message());
  }
}

absl::StatusOr<std::map<std::string, std::string>>
EtcdControlStore::ReadAll() {
  const std::string prefix = RecordKey("");
  std::map<std::string, std::string> out;
  std::string from = prefix;
  int64_t revision = 0;  // every page read at the first page's revision
  while (true) {
    etcdserverpb::RangeRequest req;
    req.set_key(from);
    req.set_range_end(PrefixEnd(prefix));
    req.set_limit(256);
    req.set_revision(revision);
    etcdserverpb::RangeResponse resp;
    // Pages are read at one revision: a failed page is read again from the
    // next member, which serves the same revision.
    grpc::Status s;
    for (size_t tries = 0; tries < members_.size(); ++tries) {
      auto ctx = Context();
      const Endpoint& member = Using();
      s = member.kv->Range(ctx.get(), req, &resp);
      Answered(member, s);
      if (s.ok()) break;
    }
    if (!s.ok()) return EtcdError("reading the coordinator's records", s);
    if (revision == 0) revision = resp.header().revision();
    for (const auto& kv : resp.kvs())
      out[kv.key().substr(prefix.size())] = kv.value();
    if (!resp.more() || resp.kvs().empty()) break;
    from = resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0');
  }
  return out;
}

absl::Status EtcdControlStore::Commit(const Writes& writes) {
  etcdserverpb::TxnRequest txn;
  {
    absl::MutexLock lock(&mu_);
    if (leader_revision_ == 0) {
      return absl::FailedPreconditionError(
          "this coordinator does not lead: it writes nothing");
    }
    // Fencing: only while the leader key is the one this process created.
    auto* cmp = txn.add_compare();
    cmp->set_key(LeaderKey());
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_create_revision(leader_revision_);
  }
  if (writes.size() > kMaxRecordsPerCommit)
    return TooManyRecords(writes.size());
  for (const auto& [key, value] : writes) {
    if (value) {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(RecordKey(key));
      put->set_value(*value);
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(
          RecordKey(key));
    }
  }
  if (static_cast<int64_t>(txn.ByteSizeLong()) > kMaxEtcdTransactionBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a transaction of ", txn.ByteSizeLong(),
        " bytes is more than etcd takes (", kMaxEtcdTransactionBytes,
        "); nothing was written"));
  }
  // A call that fails (an etcd member died, etcd is electing a leader)
  // is sent again, to the next member if this one did not answer, until
  // it is answered (etcd's refusals, RefusedByEtcd, are answers): the
  // transaction sets absolute
  // values under this coordinator's leadership, and nothing else writes
  // meanwhile (the coordinator waits for this call), so applying it twice
  // is applying it once. Only when no answer comes before the lease could
  // have ended is the outcome unknown.
  etcdserverpb::TxnResponse resp;
  grpc::Status s(grpc::StatusCode::DEADLINE_EXCEEDED,
                 "no answer before the lease could have ended");
  bool unanswered = false;  // a try got no answer: it may have been applied
  while (true) {
    absl::Time until;
    {
      absl::MutexLock lock(&mu_);
      until = lease_valid_until_ - Margin();
    }
    const absl::Time now = absl::Now();
    if (now >= until) break;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(std::min(now + absl::Seconds(2), until)));
    const Endpoint& member = Using();
    s = member.kv->Txn(&ctx, txn, &resp);
    Answered(member, s);
    if (s.ok()) break;
    // A refusal says nothing was written only if no earlier try may have
    // been applied (one that got no answer); else the outcome is unknown,
    // as when no answer comes at all (below).
    if (RefusedByEtcd(s) && !unanswered) {
      const absl::Status refused =
          EtcdError("writing the coordinator's records", s);
      return absl::Status(
          // FAILED_PRECONDITION says "another leads" to the coordinator;
          // etcd means a permission it lacks.
          refused.code() == absl::StatusCode::kFailedPrecondition
              ? absl::StatusCode::kPermissionDenied
              : refused.code(),
          absl::StrCat(refused.message(), "; nothing was written",
                       s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED
                           ? " (etcd's space quota is used up: compact and "
                             "defragment etcd, then disarm its NOSPACE alarm)"
                           : ""));
    }
    if (RefusedByEtcd(s)) break;
    unanswered = true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!s.ok()) {
    // etcd may still apply it (a proposal it took before its majority
    // went away commits when the majority returns): what this process
    // holds in memory may differ from what etcd will hold. It steps down;
    // the next leader reads what etcd holds.
    const absl::Status failed =
        EtcdError("writing the coordinator's records", s);
    Lost(absl::StrCat(failed.message(), "; whether it was written is unknown"));
    return absl::UnavailableError(absl::StrCat(
        failed.message(),
        "; whether it was written is unknown: this coordinator steps down and "
        "the next leader reads etcd (check the result once one serves)"));
  }
  if (!resp.succeeded()) {
    Lost("the leader key is no longer this coordinator's (another leads)");
    return absl::FailedPreconditionError(
        "this coordinator no longer leads (another took over): nothing was "
        "written");
  }
  return absl::OkStatus();
}

std::string EtcdControlStore::Describe() const {
  return absl::StrCat("etcd ", absl::StrJoin(options_.endpoints, ","),
                      " under ", options_.prefix);
}

}  // namespace ptc
