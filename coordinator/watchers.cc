#include "coordinator/watchers.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "proto/enum_names.h"

namespace ptc {
namespace {

constexpr absl::Duration kRound = absl::Milliseconds(20);

// A stream that finishes at once with a status.
class Refused : public grpc::ServerWriteReactor<proto::ReconfigureEvent> {
 public:
  explicit Refused(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

Watchers::Shared Watchers::Share(Events e) {
  Shared s;
  s.change_bytes =
      std::make_shared<const std::string>(e.change.SerializeAsString());
  s.follow_bytes =
      std::make_shared<const std::string>(e.follow.SerializeAsString());
  s.change =
      std::make_shared<const proto::ReconfigureEvent>(std::move(e.change));
  s.follow =
      std::make_shared<const proto::ReconfigureEvent>(std::move(e.follow));
  return s;
}

// One watcher's stream. Its state is guarded by the Watchers' lock; gRPC
// calls (StartWrite, Finish) are made outside it, since a reaction may
// run on the calling thread. A write is in flight at most once; Finish is
// called once, never while a write is in flight; gRPC's OnDone, the last
// reaction, removes and deletes the stream.
class Watchers::Stream
    : public grpc::ServerWriteReactor<proto::ReconfigureEvent> {
 public:
  Stream(Watchers* owner, std::string job, bool follow)
      : owner_(owner), job_(std::move(job)), follow_(follow) {}

  const std::string& job() const { return job_; }
  bool follows() const { return follow_; }
  // The publisher's round when the stream was added.
  uint64_t born = 0;

  // What to do after a look under the lock.
  struct Act {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    int64_t bytes = 0;  // of the event written
  };

  // The job's events now (null: the job is gone).
  Act Offer(const Shared* now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (now == nullptr) {
      return FinishLocked(
          grpc::Status(grpc::StatusCode::NOT_FOUND,
                       absl::StrCat("job '", job_, "' is unknown")));
    }
    const std::shared_ptr<const std::string>& b =
        follow_ ? now->follow_bytes : now->change_bytes;
    const std::shared_ptr<const std::string>& seen =
        has_pending_ ? pending_bytes_ : last_;
    if (seen != nullptr && (seen == b || *seen == *b)) return {};
    pending_ = follow_ ? now->follow : now->change;
    pending_bytes_ = b;
    has_pending_ = true;
    return WriteLocked();
  }

  void Run(const Act& act) {
    if (act.write) {
      static Counter& events = GetCounter("ptc_watch_events_written_total");
      static Counter& bytes = GetCounter("ptc_watch_bytes_written_total");
      events.Add();
      bytes.Add(act.bytes);
      StartWrite(out_.get());
    }
    if (act.finish) Finish(act.status);
  }

  void OnWriteDone(bool ok) override {
    Act act;
    {
      absl::MutexLock lock(&owner_->mu_);
      writing_ = false;
      if (!ok) {
        act = FinishLocked(grpc::Status::CANCELLED);
      } else if (deferred_.has_value()) {
        act = FinishLocked(*deferred_);
      } else if (!follow_ && PhaseEnded(out_->phase())) {
        act = FinishLocked(grpc::Status::OK);  // the change ended
      } else {
        act = WriteLocked();
      }
    }
    Run(act);
  }

  void OnCancel() override {
    Act act;
    {
      absl::MutexLock lock(&owner_->mu_);
      act = FinishLocked(grpc::Status::CANCELLED);
    }
    Run(act);
  }

  void OnDone() override {
    owner_->Remove(this);
    delete this;
  }

 private:
  Act WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (writing_ || finished_ || !has_pending_) return {};
    out_ = std::move(pending_);
    has_pending_ = false;
    last_ = std::move(pending_bytes_);
    writing_ = true;
    Act act;
    act.write = true;
    act.bytes = static_cast<int64_t>(last_->size());
    return act;
  }

  Act FinishLocked(grpc::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (finished_) return {};
    if (writing_) {
      // After the write in flight (OnWriteDone finishes it).
      if (!deferred_.has_value()) deferred_ = std::move(status);
      return {};
    }
    finished_ = true;
    Act act;
    act.finish = true;
    act.status = std::move(status);
    return act;
  }

  Watchers* const owner_;
  const std::string job_;
  const bool follow_;
  // The events are the job's, shared with its other streams.
  std::shared_ptr<const proto::ReconfigureEvent> out_;      // being written
  std::shared_ptr<const proto::ReconfigureEvent> pending_;  // to write next
  std::shared_ptr<const std::string> pending_bytes_;        // ... serialized
  bool has_pending_ = false;
  std::shared_ptr<const std::string> last_;  // the last event written
  bool writing_ = false;
  bool finished_ = false;
  // How the stream ends once the write in flight is done.
  std::optional<grpc::Status> deferred_;
};

Watchers::Watchers(Source source) : source_(std::move(source)) {
  publisher_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), kRound)) return;
      }
      Publish();
    }
  });
}

Watchers::~Watchers() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  publisher_.join();
}

grpc::ServerWriteReactor<proto::ReconfigureEvent>* Watchers::Watch(
    const proto::WatchRequest& req, const Events& now) {
  auto* stream = new Stream(this, req.job(), req.follow());
  const Shared shared = Share(now);
  Stream::Act act;
  {
    absl::MutexLock lock(&mu_);
    stream->born = round_;
    Watched& w = streams_[req.job()];
    w.all.insert(stream);
    w.fresh.insert(stream);  // the next round looks at it
    if (!stream->follows()) ++w.wholes;
    act = stream->Offer(&shared);
  }
  stream->Run(act);
  return stream;
}

grpc::ServerWriteReactor<proto::ReconfigureEvent>* Watchers::Refuse(
    grpc::Status status) {
  return new Refused(std::move(status));
}

int Watchers::count() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [job, w] : streams_) n += w.all.size();
  return n;
}

void Watchers::Publish() {
  // Each watched job, and whether a stream of it is not a follower.
  std::map<std::string, bool> jobs;
  uint64_t round = 0;
  {
    absl::MutexLock lock(&mu_);
    round = ++round_;
    for (const auto& [job, w] : streams_) jobs[job] = w.wholes > 0;
  }
  if (jobs.empty()) return;
  std::map<std::string, Events> read = source_(jobs);
  // Each job's events copied and serialized once for all of its streams.
  std::map<std::string, Shared> now;
  for (auto& [job, events] : read) now[job] = Share(std::move(events));
  std::vector<std::pair<Stream*, Stream::Act>> acts;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [job, w] : streams_) {
      auto it = now.find(job);
      const Shared* b = it == now.end() ? nullptr : &it->second;
      if (b == nullptr && !jobs.count(job)) continue;  // watched since
      // Quiet (what every stream but the fresh ones was offered last
      // round): only the fresh ones are looked at, the steady state of a
      // job with thousands of followers.
      const bool quiet =
          b != nullptr && w.published.has_value() && *w.published == *b;
      std::set<Stream*> skipped;
      for (Stream* s : quiet ? w.fresh : w.all) {
        // Added after this round read the events: it was written newer
        // ones (an older event would go back in time, or end it).
        if (s->born == round) {
          skipped.insert(s);
          continue;
        }
        Stream::Act act = s->Offer(b);
        if (act.write || act.finish) acts.push_back({s, std::move(act)});
      }
      w.fresh = std::move(skipped);
      if (b != nullptr) w.published = *b;
    }
  }
  // A stream is not deleted before its Finish has run, and only this
  // thread or the stream's own reactions call it: each is alive here.
  for (auto& [stream, act] : acts) stream->Run(act);
}

void Watchers::Remove(Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream->job());
  if (it == streams_.end()) return;
  Watched& w = it->second;
  if (w.all.erase(stream) == 0) return;
  w.fresh.erase(stream);
  if (!stream->follows()) --w.wholes;
  if (w.all.empty()) streams_.erase(it);
}

}  // namespace ptc
