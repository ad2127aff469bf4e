// The fingerprint calls of a reconfiguration's proof: each host is asked
// for the partition-invariant fingerprints (ptc/fingerprint.h) of its
// share of a version, a few calls per host at once (each up to 256 tensors
// in one Fingerprints call, or a call per tensor where the host's ptcd
// predates it), and the answers are added up per tensor. A call that cannot
// finish is not waited for: all of them end when the change is cancelled or the
// caller stops them (its staging failed), and a call to a host that stops
// heartbeating ends as UNAVAILABLE naming it, so that the caller can ask
// another holder. A stopped host (SIGSTOP, a hung kernel) otherwise answers
// nothing until the call's deadline, minutes for a large share.
//
//   std::map<int32_t, std::vector<FingerprintAsk>> asks = {
//       {0, {{0, {Region{{0, 512}}}}}}, {1, {{0, {Region{{512, 1024}}}}}}};
//   FingerprintCalls calls;
//   calls.job = "run7";
//   calls.version = 3;
//   calls.tensor_keys = &keys;     // tensor index -> key
//   calls.addresses = &addresses;  // host -> gRPC address
//   int32_t failed_host = -1;
//   auto sums = AskFingerprints(asks, calls, &failed_host);
//   // (*sums)[0] = (fingerprint, elements) of [0, 1024) of tensor 0
//
// Threads: up to `calls_per_host` per host (at most 128 in all), plus one
// watcher; all are joined before AskFingerprints returns.
#ifndef PTC_COORDINATOR_INTERNAL_FINGERPRINT_CALLS_H_
#define PTC_COORDINATOR_INTERNAL_FINGERPRINT_CALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ptc/region.h"

namespace ptc::coordinator_internal {

// One call's worth: the regions of one tensor whose fingerprint a host
// computes (every element of them once).
struct FingerprintAsk {
  int tensor = 0;  // index into FingerprintCalls::tensor_keys
  std::vector<Region> regions;
};

struct FingerprintCalls {
  std::string job;
  int64_t version = 0;
  // The key of each tensor index; its size is the number of tensors.
  const std::vector<std::string>* tensor_keys = nullptr;
  // The gRPC address of every host asked.
  const std::map<int32_t, std::string>* addresses = nullptr;
  // How errors name a host (default: "host N (ADDRESS)").
  std::function<std::string(int32_t host)> label;
  // Whether a host still heartbeats (empty: every host does).
  std::function<bool(int32_t host)> is_alive;
  // Set by another thread to end every call: `cancel` when the change is
  // aborted by request, `stop` when the caller no longer needs the answer
  // (its staging failed). Either may be null.
  const std::atomic<bool>* cancel = nullptr;
  const std::atomic<bool>* stop = nullptr;
  size_t calls_per_host = 4;
  // How often the hosts with a call in flight are checked with is_alive.
  absl::Duration liveness_poll = absl::Milliseconds(200);
};

// The (fingerprint, element count) of every tensor, summed over `asks`
// (host -> its share). On an error, *failed_host is the host it names, or
// -1 for none (cancelled, stopped).
absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> AskFingerprints(
    const std::map<int32_t, std::vector<FingerprintAsk>>& asks,
    const FingerprintCalls& calls, int32_t* failed_host);

}  // namespace ptc::coordinator_internal

#endif  // PTC_COORDINATOR_INTERNAL_FINGERPRINT_CALLS_H_
