// The coordinator's direct questions to hosts whose heartbeats are late:
// each host's ptcd is asked for its Stats (its uptime) on a connection of
// its own, without a thread per call. The monitor loop asks in one round
// and reads the answers in a later one, so that a host that does not
// answer (a cut link holds the call for its whole deadline) delays no
// other host's verdict and no decided commit's retry: a rack behind a
// failed switch is judged in one host timeout, not in waves of a few
// hosts at a time.
//
//   HostProbes probes;
//   probes.Ask("host7", "10.0.0.7:7070", absl::Seconds(2.5));
//   ... a round later ...
//   for (HostProbes::Answer& a : probes.Take()) {
//     if (a.uptime.ok()) ...  // alive: it answered
//   }
//   probes.Drop("host7");  // its heartbeats came back, or it is dead
//
// Thread-safe. The calls' answers arrive on gRPC's threads and wait in a
// queue for Take.
#ifndef PTC_COORDINATOR_HOST_PROBES_H_
#define PTC_COORDINATOR_HOST_PROBES_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tensor_store.grpc.pb.h"

namespace ptc {

class HostProbes {
 public:
  // At most this many calls in flight: more overdue hosts are asked in
  // later rounds. Every call holds a connection, and this bounds them
  // whatever the number of hosts.
  static constexpr int kMaxInFlight = 1024;

  struct Answer {
    std::string host;
    absl::Time asked;  // when the call started
    // The ptcd's uptime, or why it did not answer.
    absl::StatusOr<absl::Duration> uptime;
  };

  explicit HostProbes(int max_in_flight = kMaxInFlight)
      : max_in_flight_(max_in_flight) {}
  HostProbes(const HostProbes&) = delete;
  HostProbes& operator=(const HostProbes&) = delete;
  // Cancels the calls in flight and waits for them to end.
  ~HostProbes();

  // Asks `host`'s ptcd at `address` for its uptime, with `deadline`,
  // unless a call to it is in flight, its answer is not yet taken, or
  // the most calls are (kMaxInFlight); whether a call started. A host asked at a new
  // address gets a new connection.
  bool Ask(const std::string& host, const std::string& address,
           absl::Duration deadline);

  // The answers that arrived since the last Take, in the order they came.
  std::vector<Answer> Take();

  // Closes `host`'s connection (a call in flight is cancelled, and its
  // answer is not given): once it answered, its heartbeats came back, it
  // was marked dead or forgotten. The coordinator does not keep a
  // connection to every host that was ever late.
  void Drop(const std::string& host);

  // Connections open (hosts being asked, or asked and not yet dropped).
  int open() const;
  // Calls in flight.
  int in_flight() const;

 private:
  struct Probe {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<proto::TensorStore::Stub> stub;
    // The call in flight (null when none).
    std::unique_ptr<grpc::ClientContext> ctx;
    proto::StatsRequest req;
    proto::StatsResponse resp;
    absl::Time asked;
    bool in_flight = false;
    bool answered = false;  // its answer waits in answers_
    bool dropped = false;   // in ending_: closed once its call ends
  };

  // A call's end, on a gRPC thread: queues its answer.
  void Finished(Probe* probe, const std::string& host,
                const grpc::Status& status);
  // Destroys the dropped probes whose calls ended (on the caller's thread,
  // never on gRPC's).
  void CollectEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_in_flight_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Probe>> probes_ ABSL_GUARDED_BY(mu_);
  // Dropped while in flight: kept until their call ends.
  std::vector<std::unique_ptr<Probe>> ending_ ABSL_GUARDED_BY(mu_);
  std::vector<Answer> answers_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ptc

#endif  // PTC_COORDINATOR_HOST_PROBES_H_
