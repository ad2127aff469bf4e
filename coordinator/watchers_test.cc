// Watchers over a real gRPC server: every stream is told each change once,
// a stream that joined with old events catches up although the job is
// quiet, the source is asked for a job's whole change only while a
// stream needs it, and streams are counted as they come and go.
#include "coordinator/watchers.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/coordinator.grpc.pb.h"

namespace ptc {
namespace {

// A job whose events the test sets; Watch hands each new stream the
// events `stale` says (the job's now, or older ones).
class Service : public proto::Coordinator::CallbackService {
 public:
  Service()
      : watchers_([this](const std::map<std::string, bool>& jobs) {
          absl::MutexLock lock(&mu_);
          std::map<std::string, Watchers::Events> out;
          for (const auto& [job, whole] : jobs) {
            if (job != "gpt" || gone_) continue;
            out[job] = Make(epoch_, whole);
            if (whole) ++whole_reads_;
          }
          return out;
        }) {}

  grpc::ServerWriteReactor<proto::ReconfigureEvent>* Watch(
      grpc::CallbackServerContext*, const proto::WatchRequest* req) override {
    Watchers::Events now;
    {
      absl::MutexLock lock(&mu_);
      now = Make(stale_ > 0 ? stale_ : epoch_, !req->follow());
    }
    return watchers_.Watch(*req, now);
  }

  void SetEpoch(int64_t e) {
    absl::MutexLock lock(&mu_);
    epoch_ = e;
  }
  void SetStale(int64_t e) {
    absl::MutexLock lock(&mu_);
    stale_ = e;
  }
  void Forget() {
    absl::MutexLock lock(&mu_);
    gone_ = true;
  }
  int whole_reads() {
    absl::MutexLock lock(&mu_);
    return whole_reads_;
  }
  Watchers& watchers() { return watchers_; }

 private:
  static Watchers::Events Make(int64_t epoch, bool whole) {
    Watchers::Events e;
    e.follow.set_layout_epoch(epoch);
    if (whole) {  // a change staging (a plain watcher's stream ends with it)
      e.change = e.follow;
      e.change.set_phase(proto::PHASE_STAGING);
      e.change.set_bytes_total(epoch * 1000);
    }
    return e;
  }

  absl::Mutex mu_;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t stale_ ABSL_GUARDED_BY(mu_) = 0;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int whole_reads_ ABSL_GUARDED_BY(mu_) = 0;
  Watchers watchers_;  // last: its publisher reads the fields above
};

// A client stream and the epochs it was told, read on its own thread.
struct Reader {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<proto::ReconfigureEvent>> stream;
  absl::Mutex mu;
  std::vector<int64_t> epochs ABSL_GUARDED_BY(mu);
  grpc::Status status;
  std::thread thread;

  Reader(proto::Coordinator::Stub* stub, bool follow) {
    proto::WatchRequest req;
    req.set_job("gpt");
    req.set_follow(follow);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(300)));
    stream = stub->Watch(&ctx, req);
    thread = std::thread([this] {
      proto::ReconfigureEvent e;
      while (stream->Read(&e)) {
        absl::MutexLock lock(&mu);
        epochs.push_back(e.layout_epoch());
      }
      status = stream->Finish();
    });
  }
  ~Reader() {
    ctx.TryCancel();
    Join();
  }
  // Until the server ends the stream.
  void Join() {
    if (thread.joinable()) thread.join();
  }
  std::vector<int64_t> Told() {
    absl::MutexLock lock(&mu);
    return epochs;
  }
  // Waits (up to 60 s) until the last epoch told is `epoch`.
  bool Until(int64_t epoch) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu);
        if (!epochs.empty() && epochs.back() == epoch) return true;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
};

bool Eventually(const std::function<bool()>& ok) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!ok()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST_CASE(
    "watchers: many followers are each told every change once; a late "
    "joiner with old events catches up while the job is quiet",
    "[coordinator]") {
  Service service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  auto stub = proto::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  {
    constexpr int kFollowers = 200;
    std::vector<std::unique_ptr<Reader>> readers;
    for (int i = 0; i < kFollowers; ++i)
      readers.push_back(std::make_unique<Reader>(stub.get(), true));
    for (auto& r : readers) REQUIRE(r->Until(1));
    CHECK(service.watchers().count() == kFollowers);
    // Followers only: the source is never asked for the whole change.
    CHECK(service.whole_reads() == 0);

    service.SetEpoch(2);
    for (auto& r : readers) REQUIRE(r->Until(2));
    service.SetEpoch(3);
    for (auto& r : readers) REQUIRE(r->Until(3));
    // Quiet rounds write nothing again.
    absl::SleepFor(absl::Milliseconds(200));
    for (auto& r : readers) CHECK(r->Told() == std::vector<int64_t>{1, 2, 3});

    // A stream that joins with events older than the job's (read before a
    // round the others saw) is told the job's now at the next round,
    // although nothing changed for the others.
    service.SetStale(2);
    auto late = std::make_unique<Reader>(stub.get(), true);
    REQUIRE(late->Until(3));
    CHECK(late->Told() == std::vector<int64_t>{2, 3});
    service.SetStale(0);
    for (auto& r : readers) CHECK(r->Told() == std::vector<int64_t>{1, 2, 3});

    // A plain watcher makes the source read the whole change, until it
    // goes.
    {
      auto plain = std::make_unique<Reader>(stub.get(), false);
      REQUIRE(plain->Until(3));
      CHECK(Eventually([&] { return service.whole_reads() > 0; }));
    }
    const int reads = service.whole_reads();
    CHECK(Eventually(
        [&] { return service.watchers().count() == kFollowers + 1; }));
    absl::SleepFor(absl::Milliseconds(200));
    CHECK(service.whole_reads() <= reads + 1);  // a round in flight at most

    // Half the followers go; the rest are still told.
    readers.resize(kFollowers / 2);
    CHECK(Eventually(
        [&] { return service.watchers().count() == kFollowers / 2 + 1; }));
    service.SetEpoch(4);
    for (auto& r : readers) REQUIRE(r->Until(4));
    REQUIRE(late->Until(4));

    // The job is forgotten: every stream ends with NOT_FOUND.
    service.Forget();
    for (auto& r : readers) r->Join();
    late->Join();
    for (auto& r : readers)
      CHECK(r->status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(late->status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(Eventually([&] { return service.watchers().count() == 0; }));
  }
  server->Shutdown();
}

}  // namespace
}  // namespace ptc
