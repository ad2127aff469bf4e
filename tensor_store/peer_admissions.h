// Which hosts may read a job's state from this ptcd. For each plan epoch
// the coordinator admits the target hosts that pull from this one
// (Transformer.AdmitPeers); the transfer RPCs (SendParts, ExposePieces)
// and the store's reads by hosts (Read, GetSmallObject[s]) check here, so a
// host certificate alone reads nothing. One object per ptcd, shared by
// its tensor store and transformer services. Thread-safe.
//
//   admissions->Admit("run7", 12, {"host3", "host4"});
//   PTC_RETURN_IF_ERROR(admissions->Check("run7", 12, "host3", "SendParts"));
#ifndef PTC_TENSOR_STORE_PEER_ADMISSIONS_H_
#define PTC_TENSOR_STORE_PEER_ADMISSIONS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ptc {

class PeerAdmissions {
 public:
  // Adds `hosts` to the peers of `job` in `epoch`. A newer epoch replaces
  // the older one's peers; an older epoch than the newest admitted is
  // ignored (a late call of a plan that moved on).
  template <typename Hosts>
  void Admit(const std::string& job, int64_t epoch, const Hosts& hosts) {
    absl::MutexLock lock(&mu_);
    Peers& p = jobs_[job];
    if (epoch < p.epoch) return;
    if (epoch > p.epoch) p.hosts.clear();
    p.epoch = epoch;
    p.hosts.insert(hosts.begin(), hosts.end());
  }

  // OK if `host` is a peer of `job` in `epoch` (0: in the newest epoch
  // admitted, for calls that carry no epoch); PERMISSION_DENIED naming
  // the host, the job and `what` otherwise (and a warning in the log).
  absl::Status Check(const std::string& job, int64_t epoch,
                     const std::string& host, const char* what) const;

  // Forgets `job` (its state left this host).
  void Forget(const std::string& job);

 private:
  struct Peers {
    int64_t epoch = 0;
    std::set<std::string> hosts;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Peers> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_PEER_ADMISSIONS_H_
