#include "tensor_store/peer_admissions.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ptc {

absl::Status PeerAdmissions::Check(const std::string& job, int64_t epoch,
                                   const std::string& host,
                                   const char* what) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end() && (epoch == 0 || it->second.epoch == epoch) &&
        it->second.hosts.count(host) > 0) {
      return absl::OkStatus();
    }
  }
  if (int64_t held = 0; LogAllowed(absl::StrCat("refused ", what), &held)) {
    Log("security")
        ->warn("refused {} of job {} epoch {} to host '{}': not admitted{}",
               what, job, epoch, host, SuppressedNote(held));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "host '", host, "' is not a peer of ",
      epoch == 0 ? std::string("the current plan epoch")
                 : absl::StrCat("plan epoch ", epoch),
      " of job '", job,
      "' here (the coordinator admits the hosts that pull from this one)"));
}

void PeerAdmissions::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job);
}

}  // namespace ptc
