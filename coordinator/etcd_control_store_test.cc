// The etcd control store against a real etcd (one member, started here):
// one leader at a time, records round-trip, and fencing: a coordinator
// whose lease ended (revoked here, as etcd does when it expires) writes
// nothing once another leads, and is told it lost the lead.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/etcd_control_store.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "tensor_store/internal/testing.h"

extern char** environ;

namespace ptc {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One etcd member on loopback, in a temporary directory.
class Etcd {
 public:
  // `flags`: more of etcd's command line.
  explicit Etcd(std::vector<std::string> flags = {})
      : client_(FreePort()), peer_(FreePort()) {
    const std::string c = "http://127.0.0.1:" + std::to_string(client_);
    const std::string p = "http://127.0.0.1:" + std::to_string(peer_);
    std::vector<std::string> args = {
        "etcd", "--name", "t", "--data-dir", dir_.path() + "/etcd",
        "--listen-client-urls", c, "--advertise-client-urls", c,
        "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
        "--initial-cluster", "t=" + p};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    const std::string log = dir_.path() + "/etcd.log";
    posix_spawn_file_actions_addopen(&files, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    // etcd from Debian's etcd-server (tools/setup.sh installs it).
    REQUIRE(posix_spawnp(&pid_, "etcd", &files, nullptr, argv.data(),
                         environ) == 0);
    posix_spawn_file_actions_destroy(&files);
  }
  ~Etcd() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::string endpoint() const {
    return "127.0.0.1:" + std::to_string(client_);
  }

 private:
  testing::TempDir dir_;
  int client_, peer_;
  pid_t pid_ = 0;
};

// `lease` long enough that a renewal held back by a loaded machine (etcd
// and the renewing thread both share it) does not lose the lead.
std::unique_ptr<EtcdControlStore> Store(
    const Etcd& etcd, const std::string& identity,
    absl::Duration lease = absl::Seconds(4)) {
  EtcdOptions o;
  o.endpoints = {etcd.endpoint()};
  o.identity = identity;
  o.lease = lease;
  auto store = EtcdControlStore::Connect(o);
  REQUIRE(store.ok());
  return *std::move(store);
}

// Campaign, given up (a failed test, not a hung one) after a minute.
absl::Status Lead(EtcdControlStore& store,
                  std::function<void(const std::string&)> on_lost) {
  std::atomic<bool> stop{false};
  absl::Notification done;
  std::thread timer([&] {
    if (!done.WaitForNotificationWithTimeout(absl::Minutes(1))) stop = true;
  });
  absl::Status s = store.Campaign(stop, std::move(on_lost));
  done.Notify();
  timer.join();
  return s;
}

// The leader key's lease, revoked as if it had expired.
void RevokeLeaderLease(const Etcd& etcd) {
  auto channel = grpc::CreateChannel(etcd.endpoint(),
                                     grpc::InsecureChannelCredentials());
  auto kv = etcdserverpb::KV::NewStub(channel);
  auto lease = etcdserverpb::Lease::NewStub(channel);
  etcdserverpb::RangeRequest range;
  range.set_key("/ptc/leader");
  etcdserverpb::RangeResponse found;
  grpc::ClientContext ctx;
  REQUIRE(kv->Range(&ctx, range, &found).ok());
  REQUIRE(found.kvs_size() == 1);
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(found.kvs(0).lease());
  etcdserverpb::LeaseRevokeResponse revoked;
  grpc::ClientContext ctx2;
  REQUIRE(lease->LeaseRevoke(&ctx2, revoke, &revoked).ok());
}

TEST_CASE("a deposed leader writes nothing; the new one reads and writes") {
  Etcd etcd;
  auto a = Store(etcd, "10.0.0.1:7000");
  auto b = Store(etcd, "10.0.0.2:7000");
  absl::Notification a_lost;
  std::string why;
  // etcd is starting: Campaign retries until it answers.
  REQUIRE(Lead(*a, [&](const std::string& reason) {
            why = reason;
            a_lost.Notify();
          }).ok());
  CHECK(*a->Leader() == "10.0.0.1:7000");
  REQUIRE(a->Commit({{kClusterRecord, "from a"}, {JobRecord("j"), "j1"}}).ok());
  CHECK(*b->ReadAll() == std::map<std::string, std::string>{
                             {"cluster", "from a"}, {"jobs/j", "j1"}});

  // b stands by while a leads.
  std::atomic<bool> b_leads{false};
  absl::Status b_campaign;
  std::thread campaign([&] {
    b_campaign = Lead(*b, [](const std::string&) {});
    b_leads = b_campaign.ok();
  });
  absl::SleepFor(absl::Milliseconds(600));
  CHECK_FALSE(b_leads.load());

  // a's lease ends (as when a stalls or loses etcd): b takes the lead.
  RevokeLeaderLease(etcd);
  campaign.join();
  REQUIRE(b_campaign.ok());
  CHECK(b_leads.load());
  CHECK(*b->Leader() == "10.0.0.2:7000");

  // a still believes it leads, until a write: refused, nothing written,
  // and it is told.
  const absl::Status refused = a->Commit({{JobRecord("j"), "j2 from a"}});
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(a_lost.WaitForNotificationWithTimeout(absl::Seconds(10)));
  CHECK(a->Commit({{JobRecord("k"), "k"}}).code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(b->Commit({{JobRecord("j"), "j2 from b"}, {kClusterRecord,
                                                     std::nullopt}})
              .ok());
  CHECK(*a->ReadAll() ==
        std::map<std::string, std::string>{{"jobs/j", "j2 from b"}});

  // b resigns: its lease is revoked at once and a standby could lead.
  b->Resign();
  CHECK(b->Leader()->empty());
  CHECK(b->Commit({{JobRecord("j"), "x"}}).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a leader keeps its lease past its TTL by renewing it") {
  Etcd etcd;
  // 6 s: a write is given what is left of the lease less a margin. Beside
  // a build (a CI run), a 4 s lease's leader got no answer to this test's
  // write within that (1.5 s) and stepped down, as it must.
  auto a = Store(etcd, "10.0.0.1:7000", absl::Seconds(6));
  std::atomic<bool> lost{false};
  REQUIRE(Lead(*a, [&](const std::string&) { lost = true; }).ok());
  absl::SleepFor(absl::Seconds(15));  // 2.5 TTLs
  CHECK_FALSE(lost.load());
  CHECK(*a->Leader() == "10.0.0.1:7000");
  CHECK(a->Commit({{JobRecord("j"), "still leading"}}).ok());
}

TEST_CASE("a transaction larger than etcd takes is refused before it is sent") {
  Etcd etcd;
  auto a = Store(etcd, "10.0.0.1:7000");
  REQUIRE(Lead(*a, [](const std::string&) {}).ok());
  const absl::Status s = a->Commit(
      {{JobRecord("huge"), std::string(kMaxEtcdTransactionBytes, 'x')}});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("more than etcd takes") !=
        std::string::npos);
  CHECK(a->ReadAll()->empty());
  CHECK(a->Commit({{JobRecord("small"), "ok"}}).ok());  // still leads
}

TEST_CASE(
    "a transaction of more records than etcd takes at once is refused "
    "before it is sent") {
  Etcd etcd;
  auto a = Store(etcd, "10.0.0.1:7000");
  REQUIRE(Lead(*a, [](const std::string&) {}).ok());
  ControlStore::Writes writes;
  for (size_t i = 0; i <= kMaxRecordsPerCommit; ++i)
    writes[HostRecord("h" + std::to_string(i))] = "host";
  const absl::Status s = a->Commit(writes);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("more than the store takes") !=
        std::string::npos);
  CHECK(a->ReadAll()->empty());
  writes.erase(writes.begin());
  CHECK(a->Commit(writes).ok());  // exactly as many: one transaction
  CHECK(a->ReadAll()->size() == kMaxRecordsPerCommit);
}

TEST_CASE("a transaction etcd refuses is answered at once, not sent again") {
  // An etcd that takes fewer operations per transaction than its default:
  // its refusal is an answer (nothing was written), where sending it again
  // until the lease ends would hold the coordinator for ever (the lease
  // is renewed meanwhile) and a store that is full would never recover.
  Etcd etcd({"--max-txn-ops", "16"});
  auto a = Store(etcd, "10.0.0.1:7000");
  std::atomic<bool> lost{false};
  REQUIRE(Lead(*a, [&](const std::string&) { lost = true; }).ok());
  ControlStore::Writes writes;
  for (int i = 0; i < 32; ++i)
    writes[HostRecord("h" + std::to_string(i))] = "host";
  const absl::Time start = absl::Now();
  const absl::Status s = a->Commit(writes);
  CHECK(absl::Now() - start < absl::Seconds(30));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("nothing was written") !=
        std::string::npos);
  CHECK(a->ReadAll()->empty());
  CHECK_FALSE(lost.load());
  CHECK(a->Commit({{JobRecord("small"), "ok"}}).ok());  // still leads
}

}  // namespace
}  // namespace ptc
