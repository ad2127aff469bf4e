// The watchers of jobs' events (Coordinator.Watch): each job's event is
// read once per round (every 20 ms) for all of its watchers, and written
// to a watcher only when it changed; a round in which it did not change
// looks at no stream but those added since. A watcher is a gRPC callback
// stream: no thread waits per watcher, so 16,384 processes following their job
// cost the coordinator one read of the job per round and a write per
// change, not a thread and a poll each.
//
// The coordinator gives a function that reads the events of the watched
// jobs under its lock; the publisher calls it from its own thread.
//
//   Watchers watchers([this](const std::set<std::string>& jobs) {...});
//   return watchers.Watch(request, first_events);  // from the handler
#ifndef PTC_COORDINATOR_WATCHERS_H_
#define PTC_COORDINATOR_WATCHERS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/coordinator.pb.h"

namespace ptc {

class Watchers {
 public:
  // What a job's watchers see now: its change's event, and the same with
  // the job's layout epoch, committed version and pending change (what a
  // follower, WatchRequest.follow, sees).
  // `change` is empty where no watcher of the job needs it (every one
  // follows: the job's processes): the change's whole event, with its
  // plan's host-to-host matrix and each target host's progress, is then
  // neither copied nor serialized.
  struct Events {
    proto::ReconfigureEvent change;
    proto::ReconfigureEvent follow;
  };
  // The events of each job of `jobs` (job -> whether a watcher needs the
  // change's whole event); a job missing from the answer is gone.
  using Source = std::function<std::map<std::string, Events>(
      const std::map<std::string, bool>& jobs)>;

  explicit Watchers(Source source);
  // Stops the publisher; the server has finished every stream by then.
  ~Watchers();
  Watchers(const Watchers&) = delete;
  Watchers& operator=(const Watchers&) = delete;

  // A new watcher of `req.job()` whose job holds `now` (checked by the
  // caller; `now.change` may be empty for a follower): written `now` at
  // once, then every change. A follower watches
  // until it goes; another watcher until the change ends (its final
  // event), or NOT_FOUND when the job is forgotten.
  grpc::ServerWriteReactor<proto::ReconfigureEvent>* Watch(
      const proto::WatchRequest& req, const Events& now);

  // A stream that only says `status` (a refused call).
  static grpc::ServerWriteReactor<proto::ReconfigureEvent>* Refuse(
      grpc::Status status);

  // Streams open now.
  int count() const;

 private:
  class Stream;
  // A job's events as its streams share them: one copy and one
  // serialization per round for all of them (16,384 followers of a job do
  // not hold 16,384 copies), and the bytes a stream compares with what it
  // wrote.
  struct Shared {
    std::shared_ptr<const proto::ReconfigureEvent> change, follow;
    std::shared_ptr<const std::string> change_bytes, follow_bytes;
    bool operator==(const Shared& o) const {
      return *change_bytes == *o.change_bytes &&
             *follow_bytes == *o.follow_bytes;
    }
  };
  static Shared Share(Events e);
  void Publish();
  // Called by a stream when it is done (gRPC will not touch it again).
  void Remove(Stream* stream);

  // A watched job's streams. A quiet round (the job's events as the last
  // round offered them) looks at its fresh streams only and counts
  // nothing: 4,096 followers of a job walked every 20 ms were 70% of a
  // 512-host coordinator's steady-state CPU.
  struct Watched {
    std::set<Stream*> all;
    // Streams to look at even in a quiet round: added since the last
    // round (written events read before it, maybe older), or skipped by
    // it (added while it ran).
    std::set<Stream*> fresh;
    int wholes = 0;  // streams that are not followers (need `change`)
    std::optional<Shared> published;  // the events last offered to `all`
  };

  const Source source_;
  mutable absl::Mutex mu_;
  std::map<std::string, Watched> streams_ ABSL_GUARDED_BY(mu_);
  // The publisher's rounds: a stream added during a round has been
  // written newer events than the round read, and is skipped by it.
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread publisher_;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_WATCHERS_H_
