#include "plan/advisor.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "ptc/layout.h"

namespace ptc {

namespace {

// The model's constants (advisor.h).
constexpr double kEffectiveFlops = 150e12;
constexpr double kIntraHostBandwidth = 300e9;
constexpr int kDefaultMicroBatches = 8;
constexpr int64_t kDefaultTokensPerStep = int64_t{1} << 20;
constexpr double kDefaultMargin = 0.05;
constexpr const char* kVaried[] = {"tp", "pp", "dp", "ep", "cp"};

bool Varied(const std::string& axis) {
  return std::find(std::begin(kVaried), std::end(kVaried), axis) !=
         std::end(kVaried);
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

// State bytes of the fullest rank, and its parameter bytes (its gradients).
std::pair<int64_t, int64_t> FullestRank(const ModelSpec& spec,
                                        const Layout& layout, int world) {
  std::vector<int64_t> state(world, 0), params(world, 0);
  for (int t = 0; t < layout.num_tensors(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    for (const Shard& s : layout.shards(t)) {
      const int64_t b = s.region.volume() * ElementSize(ts.dtype);
      state[s.rank] += b;
      if (ts.role == Role::kParameter) params[s.rank] += b;
    }
  }
  int best = 0;
  for (int r = 1; r < world; ++r)
    if (state[r] + params[r] > state[best] + params[best]) best = r;
  return {state[best], params[best]};
}

void Estimate(const ModelSpec& spec, const ParallelConfig& c,
              const AdvisorInput& in, const proto::AutoPolicy& policy,
              ConfigCandidate* out) {
  double params = 0;
  for (const TensorSpec& t : spec.tensors)
    if (t.role == Role::kParameter) params += NumElements(t.shape);
  const double layers = std::max(1, spec.num_layers);
  const double hidden = std::sqrt(std::max(1.0, params / (12 * layers)));
  const double tokens = policy.tokens_per_step() > 0
                            ? static_cast<double>(policy.tokens_per_step())
                            : static_cast<double>(kDefaultTokensPerStep);
  const int micro = policy.micro_batches() > 0 ? policy.micro_batches()
                                               : kDefaultMicroBatches;
  const int g = c.world_size(), tp = c.tp(), pp = c.pp();
  const int replicas = std::max(1, g / (tp * pp * c.size("cp")));
  const double link = in.link_bandwidth > 0 ? in.link_bandwidth : 25e9;
  out->compute_seconds = 6 * params * tokens / (g * kEffectiveFlops);
  out->bubble_seconds = out->compute_seconds * (pp - 1) / micro;
  if (tp > 1) {
    const double bw = tp <= in.gpus_per_host ? kIntraHostBandwidth : link;
    out->tp_seconds = 4 * (layers / pp) * (tokens / replicas) * hidden * 2 *
                      (2.0 * (tp - 1) / tp) / bw;
  }
  if (replicas > 1) {
    const double bw = g <= in.gpus_per_host ? kIntraHostBandwidth : link;
    out->dp_seconds =
        2 * params / (tp * pp) * (2.0 * (replicas - 1) / replicas) / bw;
  }
  out->step_seconds = out->compute_seconds + out->bubble_seconds +
                      out->tp_seconds + out->dp_seconds;
}

// `c` judged: runs the spec, fits, meets the constraints.
ConfigCandidate Judge(const ModelSpec& spec, const ParallelConfig& c,
                      const AdvisorInput& in,
                      const proto::AutoPolicy& policy) {
  ConfigCandidate out;
  out.config = c.ToString();
  out.gpus = c.world_size();
  Estimate(spec, c, in, policy, &out);
  auto layout = BuildLayout(spec, c);
  if (!layout.ok()) {
    out.why_not = std::string(layout.status().message());
    return out;
  }
  const auto [state, params] = FullestRank(spec, *layout, c.world_size());
  out.state_bytes_per_gpu = state;
  out.gpu_bytes_needed = state + params;
  const int64_t usable = static_cast<int64_t>(
      static_cast<double>(in.gpu_memory_bytes) * kStateMemoryFraction);
  const int data_parallel = c.dp() * c.size("ep");
  if (out.gpu_bytes_needed > usable) {
    out.why_not = absl::StrCat("needs ", Gib(out.gpu_bytes_needed),
                               " per GPU (state and gradients); ",
                               Gib(usable), " of ",
                               Gib(in.gpu_memory_bytes), " is usable");
  } else if (policy.global_batch() > 0 &&
             policy.global_batch() % data_parallel != 0) {
    out.why_not = absl::StrCat("data parallelism ", data_parallel,
                               " does not divide the global batch ",
                               policy.global_batch());
  } else {
    out.fits = true;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ConfigCandidate>> EnumerateConfigs(
    const AdvisorInput& in, const proto::AutoPolicy& policy) {
  if (in.spec == nullptr) return absl::InvalidArgumentError("no spec");
  const ModelSpec& spec = *in.spec;
  int most = in.gpus;
  if (policy.max_gpus() > 0) most = std::min(most, policy.max_gpus());
  if (most < 1) {
    return absl::FailedPreconditionError(
        "no GPU is available to the job (its pool's live hosts have none "
        "free)");
  }
  if (!policy.pinned_config().empty()) {
    PTC_ASSIGN_OR_RETURN(ParallelConfig c,
                         ParallelConfig::Parse(policy.pinned_config(), spec.mesh));
    PTC_RETURN_IF_ERROR(CheckConfig(spec, c));
    if (c.world_size() > most) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the pinned config ", policy.pinned_config(), " needs ",
          c.world_size(), " GPUs; ", most, " are available"));
    }
    return std::vector<ConfigCandidate>{Judge(spec, c, in, policy)};
  }
  // The degrees of the axes that do not vary.
  int fixed = 1;
  std::vector<int> varied;  // indices into current.axes
  for (size_t i = 0; i < in.current.axes.size(); ++i) {
    if (Varied(in.current.axes[i])) {
      varied.push_back(static_cast<int>(i));
    } else {
      fixed *= in.current.sizes[i];
    }
  }
  for (int g = most; g >= 1; --g) {
    if (g % fixed != 0) continue;
    std::vector<ConfigCandidate> out;
    ParallelConfig c = in.current;
    c.layers_per_stage.clear();
    std::function<void(size_t, int)> assign = [&](size_t k, int left) {
      if (k + 1 == varied.size() || varied.empty()) {
        if (!varied.empty()) c.sizes[varied[k]] = left;
        else if (left != 1) return;
        if (CheckConfig(spec, c).ok()) out.push_back(Judge(spec, c, in, policy));
        return;
      }
      for (int d = 1; d <= left; ++d) {
        if (left % d != 0) continue;
        c.sizes[varied[k]] = d;
        assign(k + 1, left / d);
      }
    };
    assign(0, g / fixed);
    if (std::none_of(out.begin(), out.end(),
                     [](const ConfigCandidate& x) { return x.fits; }))
      continue;
    std::sort(out.begin(), out.end(),
              [](const ConfigCandidate& a, const ConfigCandidate& b) {
                if (a.fits != b.fits) return a.fits;
                if (a.step_seconds != b.step_seconds)
                  return a.step_seconds < b.step_seconds;
                return a.config < b.config;
              });
    return out;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no parallel config of the job fits on 1 to ", most, " GPUs of ",
      Gib(in.gpu_memory_bytes), " under its constraints"));
}

std::vector<int> WithinMargin(const std::vector<ConfigCandidate>& candidates,
                              const proto::AutoPolicy& policy) {
  const double margin = policy.margin() > 0 ? policy.margin() : kDefaultMargin;
  double best = -1;
  for (const ConfigCandidate& c : candidates)
    if (c.fits && (best < 0 || c.step_seconds < best)) best = c.step_seconds;
  std::vector<int> out;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].fits &&
        candidates[i].step_seconds <= best * (1 + margin) + 1e-12)
      out.push_back(static_cast<int>(i));
  }
  return out;
}

absl::StatusOr<Choice> ChooseConfig(
    const std::vector<ConfigCandidate>& candidates,
    const proto::AutoPolicy& policy) {
  const std::vector<int> near = WithinMargin(candidates, policy);
  // Recoverability first: a config whose placement survives any one
  // host's loss, where one within the margin does.
  const bool any_survives = std::any_of(near.begin(), near.end(), [&](int i) {
    return candidates[i].bytes_moved >= 0 && candidates[i].survives_host_loss;
  });
  Choice choice;
  for (int i : near) {
    const ConfigCandidate& c = candidates[i];
    if (c.bytes_moved < 0) continue;
    if (any_survives && !c.survives_host_loss) continue;
    if (choice.index < 0) {
      choice.index = i;
      continue;
    }
    const ConfigCandidate& b = candidates[choice.index];
    if (c.bytes_moved < b.bytes_moved ||
        (c.bytes_moved == b.bytes_moved && c.step_seconds < b.step_seconds))
      choice.index = i;
  }
  if (choice.index < 0) {
    return absl::FailedPreconditionError(
        "no config within the margin could be planned on these hosts");
  }
  const ConfigCandidate& c = candidates[choice.index];
  const double margin = policy.margin() > 0 ? policy.margin() : kDefaultMargin;
  if (!policy.pinned_config().empty()) {
    choice.explanation = absl::StrCat(
        c.config, ": the job's pinned config; its change moves ",
        c.bytes_moved, " bytes between hosts");
    return choice;
  }
  choice.explanation = absl::StrFormat(
      "%s on %d GPUs: %d config(s) fit each GPU and are within %.0f%% of "
      "the fastest estimated step (%.3f s); of those%s it moves the fewest "
      "bytes between hosts (%d) at an estimated step of %.3f s",
      c.config, c.gpus, static_cast<int>(near.size()), margin * 100,
      candidates[near.front()].step_seconds,
      any_survives ? " that survive the loss of any one host," : "",
      c.bytes_moved, c.step_seconds);
  return choice;
}

}  // namespace ptc
