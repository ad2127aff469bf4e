// Bounds on counts that arrive in requests: every count that sizes a
// buffer, a thread pool or a loop is checked against one of these before
// it is used, and a request beyond it gets INVALID_ARGUMENT naming it.
#ifndef PTC_COMMON_LIMITS_H_
#define PTC_COMMON_LIMITS_H_

#include <cstdint>

namespace ptc {

// Pulls one host runs at once in a reconfiguration (each is a thread).
inline constexpr int kMaxParallelPulls = 64;

// GPUs one host may declare.
inline constexpr int kMaxGpusPerHost = 1024;

// A host's declared link, bytes per second (10 Tb/s: far above any NIC).
inline constexpr double kMaxHostBandwidth = 1.25e12;

// Threads a daemon's gRPC server runs calls on; calls beyond them wait or
// get RESOURCE_EXHAUSTED, they never add threads.
inline constexpr int kMaxRpcThreads = 256;

// Local clients (training processes) one ptcd serves at once, one thread
// each; more are refused with a message.
inline constexpr int kMaxLocalConnections = 1024;

// Tensors one Fingerprints call may ask for.
inline constexpr int kMaxFingerprintsPerCall = 4096;

// Small objects one GetSmallObjects call may ask for, and the bytes its
// answer carries (it answers the first that fit, at least one; the caller
// asks again for the rest).
inline constexpr int kMaxSmallObjectsPerCall = 1024;
inline constexpr int64_t kSmallObjectsAnswerBytes = int64_t{4} << 20;

// Largest request the coordinator takes (a job's layout spec is the
// largest); a larger one gets RESOURCE_EXHAUSTED from gRPC.
inline constexpr int kMaxCoordinatorRequestBytes = 64 << 20;

}  // namespace ptc

#endif  // PTC_COMMON_LIMITS_H_
