#include "coordinator/internal/fingerprint_calls.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/parallel_for.h"
#include "common/status_macros.h"
#include "tensor_store/store_client.h"

namespace ptc::coordinator_internal {
namespace {

constexpr int kMaxFingerprintCalls = 128;
// Tensors asked of a host in one Fingerprints call: few calls (one per
// tensor took 0.2 s for the ~1,200 tensors of a 5 GB job on one host),
// yet each short enough that a cancelled change stops soon.
constexpr size_t kAsksPerCall = 256;

// A share of one host's asks, dealt round-robin: asks lane, lane + n, ...
struct Lane {
  int32_t host;
  const std::vector<FingerprintAsk>* asks;
  size_t lane;
};

// The lanes' calls in flight, for the watcher to end. A lane registers its
// call before making it and unregisters it after; the watcher cancels
// under the same lock, so it never touches a context that is gone.
class InFlight {
 public:
  explicit InFlight(size_t lanes) : calls_(lanes), silent_(lanes, false) {}

  void Begin(size_t lane, grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu_);
    calls_[lane] = ctx;
  }
  // Whether the watcher ended the call because its host went silent.
  bool End(size_t lane) {
    absl::MutexLock lock(&mu_);
    calls_[lane] = nullptr;
    return silent_[lane];
  }
  // Ends the calls in flight for which `end(lane)` holds; `silent` marks
  // them as ended for their host's silence.
  void CancelIf(const std::function<bool(size_t)>& end, bool silent) {
    absl::MutexLock lock(&mu_);
    for (size_t k = 0; k < calls_.size(); ++k) {
      if (calls_[k] == nullptr || !end(k)) continue;
      silent_[k] = silent_[k] || silent;
      calls_[k]->TryCancel();
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> silent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> AskFingerprints(
    const std::map<int32_t, std::vector<FingerprintAsk>>& asks,
    const FingerprintCalls& calls, int32_t* failed_host) {
  *failed_host = -1;
  const size_t num_tensors = calls.tensor_keys->size();
  for (const auto& [host, list] : asks) {
    if (calls.addresses->count(host) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("no address for host ", host));
    }
    for (const FingerprintAsk& a : list) {
      if (a.tensor < 0 || static_cast<size_t>(a.tensor) >= num_tensors) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an ask names tensor ", a.tensor, " of ", num_tensors));
      }
    }
  }
  auto label = [&](int32_t host) {
    return calls.label ? calls.label(host)
                       : absl::StrCat("host ", host, " (",
                                      calls.addresses->at(host), ")");
  };
  auto cancelled = [&] {
    return calls.cancel != nullptr && calls.cancel->load();
  };
  auto stopped = [&] { return calls.stop != nullptr && calls.stop->load(); };
  auto ended = [&] {
    return absl::CancelledError(
        cancelled() ? "the reconfiguration was aborted by request"
                    : "fingerprinting stopped (staging failed)");
  };

  std::vector<Lane> lanes;
  const size_t per_host = std::max<size_t>(calls.calls_per_host, 1);
  for (const auto& [host, list] : asks) {
    for (size_t lane = 0; lane < per_host && lane < list.size(); ++lane)
      lanes.push_back({host, &list, lane});
  }
  std::vector<std::pair<uint64_t, int64_t>> out(num_tensors, {0, 0});
  absl::Mutex mu;  // out, failure, *failed_host
  absl::Status failure;
  InFlight in_flight(lanes.size());
  std::atomic<bool> finished{false};
  std::thread watch([&] {
    absl::Time next_liveness = absl::Now() + calls.liveness_poll;
    while (!finished.load()) {
      if (cancelled() || stopped()) {
        in_flight.CancelIf([](size_t) { return true; }, /*silent=*/false);
      } else if (calls.is_alive && absl::Now() >= next_liveness) {
        next_liveness = absl::Now() + calls.liveness_poll;
        // Asked outside in_flight's lock (is_alive takes its owner's).
        std::set<int32_t> silent;
        for (const auto& [host, list] : asks)
          if (!calls.is_alive(host)) silent.insert(host);
        if (!silent.empty()) {
          in_flight.CancelIf(
              [&](size_t k) { return silent.count(lanes[k].host) > 0; },
              /*silent=*/true);
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  ParallelFor(lanes.size(), kMaxFingerprintCalls, [&](size_t k) {
    const Lane& l = lanes[k];
    auto client = StoreClient::ConnectKept(calls.addresses->at(l.host));
    // The lane's asks: lane, lane + per_host, ...
    std::vector<const FingerprintAsk*> mine;
    for (size_t i = l.lane; i < l.asks->size(); i += per_host)
      mine.push_back(&(*l.asks)[i]);
    // Up to kAsksPerCall asks in a call (Fingerprints); one by one where
    // the host's ptcd predates that call.
    bool one_by_one = false;
    for (size_t next = 0; next < mine.size();) {
      {
        absl::MutexLock lock(&mu);
        if (!failure.ok()) return failure;  // no use going on
        if (cancelled() || stopped()) {
          failure = ended();
          return failure;
        }
      }
      const size_t n =
          one_by_one ? 1 : std::min(kAsksPerCall, mine.size() - next);
      std::vector<std::pair<std::string, std::vector<Region>>> batch;
      for (size_t i = next; i < next + n; ++i)
        batch.push_back(
            {(*calls.tensor_keys)[mine[i]->tensor], mine[i]->regions});
      grpc::ClientContext ctx;
      in_flight.Begin(k, &ctx);
      absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> fp;
      if (one_by_one) {
        auto one = client->Fingerprint(calls.job, calls.version, batch[0].first,
                                       batch[0].second, &ctx);
        if (one.ok()) {
          fp = std::vector<std::pair<uint64_t, int64_t>>{
              {one->fingerprint(), one->elements()}};
        } else {
          fp = one.status();
        }
      } else {
        auto many = client->Fingerprints(calls.job, calls.version, batch, &ctx);
        if (many.ok()) {
          fp.emplace();
          for (const auto& t : many->tensors())
            fp->push_back({t.fingerprint(), t.elements()});
        } else {
          fp = many.status();
        }
      }
      const bool went_silent = in_flight.End(k);
      if (!fp.ok() && !went_silent && !one_by_one &&
          absl::IsUnimplemented(fp.status())) {
        one_by_one = true;  // an older ptcd: the same asks, one per call
        continue;
      }
      if (!fp.ok() && went_silent) {
        fp = absl::UnavailableError(
            "it went silent (no heartbeat within the host timeout)");
      }
      absl::MutexLock lock(&mu);
      if (!fp.ok() && !went_silent && (cancelled() || stopped())) {
        if (failure.ok()) failure = ended();  // not the host's doing
        return failure;
      }
      if (!fp.ok()) {
        if (failure.ok()) {  // the error and the host it names
          *failed_host = l.host;
          failure = Annotate(
              fp.status(), absl::StrCat("fingerprinting version ",
                                        calls.version, " on ", label(l.host)));
        }
        return failure;
      }
      for (size_t i = 0; i < n; ++i) {
        out[mine[next + i]->tensor].first += (*fp)[i].first;
        out[mine[next + i]->tensor].second += (*fp)[i].second;
      }
      next += n;
    }
    return absl::OkStatus();
  }).IgnoreError();  // `failure` holds the first error
  finished = true;
  watch.join();
  if (!failure.ok()) return failure;
  return out;
}

}  // namespace ptc::coordinator_internal
