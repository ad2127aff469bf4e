// The advisor: which parallel config a job should run on a number of
// GPUs. Pure (no RPC, no clock): the coordinator asks it when a host of an
// automatically changing job dies, is drained or added, and `ptcctl
// advise` prints what it considered.
//
//   AdvisorInput in{.spec = &spec, .current = current, .gpus = 6,
//                   .gpus_per_host = 2, .gpu_memory_bytes = 80 << 30};
//   std::vector<ConfigCandidate> c = EnumerateConfigs(in, policy);
//   ... the caller plans the change to the candidates within the margin
//       and fills bytes_moved ...
//   PTC_ASSIGN_OR_RETURN(Choice choice, ChooseConfig(c, policy));
//
// The choice: among configs that run the spec (CheckConfig), fit each
// GPU's memory and meet the job's constraints, those whose estimated step
// time is within `margin` of the fastest; of those, the ones whose
// placement survives any one host's loss from memory if there are such;
// of those, the one whose change moves the fewest bytes between hosts
// (then the faster). With fewer GPUs
// than any config can use, it tries one GPU fewer, down to 1.
//
// The step-time model is coarse and meant for ranking, not prediction:
// compute is 6 x parameters x tokens spread over the GPUs at an effective
// 150 TFLOP/s; the pipeline bubble adds (pp - 1) / micro-batches of it;
// tensor parallelism all-reduces each layer's activations (4 per layer,
// 2 bytes per element) inside a host at 300 GB/s or across hosts at the
// link's bandwidth; data parallelism all-reduces the gradients of a
// model-parallel shard over the link. Nothing overlaps.
#ifndef PTC_PLAN_ADVISOR_H_
#define PTC_PLAN_ADVISOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"
#include "ptc/model_spec.h"
#include "ptc/parallel_config.h"

namespace ptc {

inline constexpr int64_t kDefaultGpuMemoryBytes = int64_t{80} << 30;
// A GPU's memory the job's state, gradients and optimizer may fill; the
// rest is left for activations and workspace.
inline constexpr double kStateMemoryFraction = 0.85;

struct AdvisorInput {
  const ModelSpec* spec = nullptr;
  // The job's config now: its mesh axes, order and zero flag carry over;
  // axes other than tp, pp, dp, ep and cp keep their degree.
  ParallelConfig current;
  // GPUs available; the candidates use at most this many.
  int gpus = 0;
  // GPUs of the smallest host (tensor parallelism beyond it crosses the
  // link).
  int gpus_per_host = 1;
  int64_t gpu_memory_bytes = kDefaultGpuMemoryBytes;
  // Link bandwidth between hosts, bytes per second.
  double link_bandwidth = 25e9;
};

struct ConfigCandidate {
  std::string config;
  int gpus = 0;
  int64_t state_bytes_per_gpu = 0;
  int64_t gpu_bytes_needed = 0;
  bool fits = false;
  std::string why_not;
  double step_seconds = 0, compute_seconds = 0, bubble_seconds = 0,
         tp_seconds = 0, dp_seconds = 0;
  // Filled by the caller (a plan of the change); -1: not planned.
  int64_t bytes_moved = -1;
  double change_seconds = 0;
  // Filled by the caller: its planned placement survives the loss of any
  // one host from memory.
  bool survives_host_loss = false;
};

// Every config of the job's mesh on the largest GPU count (<= in.gpus,
// and <= policy.max_gpus when set) for which one fits, fastest first;
// with policy.pinned_config, only that one. Candidates that do not fit
// are listed too, with why_not. INVALID_ARGUMENT for a pinned config the
// spec cannot run; FAILED_PRECONDITION if nothing fits even on one GPU.
absl::StatusOr<std::vector<ConfigCandidate>> EnumerateConfigs(
    const AdvisorInput& in, const proto::AutoPolicy& policy);

// The candidates worth planning: those that fit and are within the
// policy's margin of the fastest.
std::vector<int> WithinMargin(const std::vector<ConfigCandidate>& candidates,
                              const proto::AutoPolicy& policy);

struct Choice {
  int index = -1;
  std::string explanation;
};
// The choice among `candidates` (bytes_moved filled for WithinMargin's).
absl::StatusOr<Choice> ChooseConfig(
    const std::vector<ConfigCandidate>& candidates,
    const proto::AutoPolicy& policy);

}  // namespace ptc

#endif  // PTC_PLAN_ADVISOR_H_
