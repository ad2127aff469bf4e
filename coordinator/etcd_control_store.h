// The coordinator's control state in etcd, and the election that decides
// which of several coordinators writes it.
//
// Records live under PREFIX/records/KEY. The leader holds PREFIX/leader
// (its address as the value) bound to an etcd lease of `lease` TTL that it
// renews every third of it. Every Commit is one etcd transaction that
// applies only if PREFIX/leader is still the key this process created: a
// coordinator whose lease ran out (it stalled, or lost etcd) and was
// replaced cannot write anything, whatever it believes. Independently, a
// leader that has not renewed its lease for `lease` minus a margin calls
// `on_lost` (the coordinator exits, and comes back as a standby) before
// the lease ends, so it stops acting before a standby can take over.
//
//   auto store = EtcdControlStore::Connect({.endpoints = {"10.0.0.5:2379"},
//                                           .identity = "10.0.0.7:7000"});
//   PTC_RETURN_IF_ERROR((*store)->Campaign(stop, on_lost));  // blocks
//   service options: .store = std::move(*store)
#ifndef PTC_COORDINATOR_ETCD_CONTROL_STORE_H_
#define PTC_COORDINATOR_ETCD_CONTROL_STORE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/control_store.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace ptc {

struct EtcdOptions {
  // The etcd members, HOST:PORT each. Calls go to one of them; one that
  // fails because the member did not answer (it is down, frozen, or cut
  // off from etcd's majority) is sent to the next member.
  std::vector<std::string> endpoints;
  // TLS (PEM files; all three or none): etcd's CA, and this coordinator's
  // client certificate and key from it. Each member's certificate must
  // name "etcd" (tools/ptc-certs ETCD_DIR etcd ...). Give etcd a CA of its
  // own, so that only coordinators can reach it, not every holder of a
  // cluster certificate. None: plaintext.
  std::string ca, cert, key;
  // Where ptc's keys live; several clusters can share one etcd.
  std::string prefix = "/ptc";
  // The leader's lease: a standby takes over within about this long (plus
  // its poll) after a leader dies.
  absl::Duration lease = absl::Seconds(5);
  // This coordinator's address, written as the leader key's value.
  std::string identity;
  // Each etcd call's deadline (a Commit's tries and the lease's renewals
  // have shorter ones, within the lease).
  absl::Duration call_timeout = absl::Seconds(5);
};

// The largest transaction Commit sends: etcd refuses requests above its
// --max-request-bytes (1.5 MiB by default); this leaves room for the
// request's framing.
inline constexpr int64_t kMaxEtcdTransactionBytes = 1400 * 1024;

class EtcdControlStore final : public ControlStore {
 public:
  // Checks the options and makes the channel; contacts nobody yet.
  static absl::StatusOr<std::unique_ptr<EtcdControlStore>> Connect(
      EtcdOptions options);
  ~EtcdControlStore() override;

  // Blocks until this process leads (the leader key is its own), or
  // `stop` becomes true (CANCELLED). While another coordinator leads it
  // logs who, once. `on_lost(reason)` is called once, from another
  // thread, if the lead is lost afterwards.
  absl::Status Campaign(const std::atomic<bool>& stop,
                        std::function<void(const std::string&)> on_lost);

  // The leader's identity (empty if none leads).
  absl::StatusOr<std::string> Leader();

  // The leader's identity as Campaign last read it (empty: none led, or
  // not read yet). What a standby tells callers.
  std::string SeenLeader() const;

  // Gives the lead up now (revokes the lease), so that a standby takes
  // over without waiting for the lease to run out. Commit refuses after.
  void Resign();

  absl::StatusOr<std::map<std::string, std::string>> ReadAll() override;
  absl::Status Commit(const Writes& writes) override;
  std::string Describe() const override;

 private:
  // One etcd member: a channel of its own, so that a member that stops
  // answering is left for the next one (a channel over every member would
  // keep a frozen one whose port still accepts connections).
  struct Endpoint {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };

  EtcdControlStore(EtcdOptions options, std::vector<Endpoint> members);
  // The member calls go to now.
  const Endpoint& Using() const;
  // Records how a call to `member` ended: a member that did not answer
  // (UNAVAILABLE, DEADLINE_EXCEEDED: down, frozen, or without etcd's
  // majority) is replaced by the next one, if it is still the one in use.
  void Answered(const Endpoint& member, const grpc::Status& status);
  std::string LeaderKey() const { return options_.prefix + "/leader"; }
  std::string RecordKey(const std::string& key) const {
    return options_.prefix + "/records/" + key;
  }
  // The renewer thread: keeps the lease, which is good until `valid_until`.
  void Renew(absl::Time valid_until);
  void Lost(const std::string& reason);
  // How long before the lease could end the lead is given up.
  absl::Duration Margin() const;
  std::unique_ptr<grpc::ClientContext> Context() const;

  const EtcdOptions options_;
  const std::vector<Endpoint> members_;
  // Index into members_ of the member in use (any thread moves it on).
  std::atomic<size_t> member_{0};
  mutable absl::Mutex mu_;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The leader key's create revision while this process leads; 0 before
  // and after.
  int64_t leader_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // Until when the lease is known good (the renewer moves it on).
  absl::Time lease_valid_until_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_lost_ ABSL_GUARDED_BY(mu_);
  std::string seen_leader_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread renewer_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_ETCD_CONTROL_STORE_H_
