#include "common/parallel_for.h"

#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace ptc {
namespace {

TEST_CASE("parallel for: every index runs once, on at most the threads asked",
          "[common]") {
  const int max_threads = GENERATE(1, 3, 64);
  std::mutex mu;
  std::vector<int> runs(100, 0);
  std::set<std::thread::id> threads;
  std::atomic<int> running{0}, most{0};
  REQUIRE(ParallelFor(runs.size(), max_threads, [&](size_t i) {
            const int now = ++running;
            int seen = most.load();
            while (now > seen && !most.compare_exchange_weak(seen, now)) {
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            {
              std::lock_guard<std::mutex> lock(mu);
              ++runs[i];
              threads.insert(std::this_thread::get_id());
            }
            --running;
            return absl::OkStatus();
          }).ok());
  for (int r : runs) CHECK(r == 1);
  CHECK(most.load() <= max_threads);
  CHECK(threads.size() <= static_cast<size_t>(max_threads));
  CHECK(threads.count(std::this_thread::get_id()) == 0);
}

TEST_CASE("parallel for: nothing to do starts no thread and succeeds",
          "[common]") {
  bool called = false;
  CHECK(ParallelFor(0, 8, [&](size_t) {
          called = true;
          return absl::OkStatus();
        }).ok());
  CHECK_FALSE(called);
  // A thread count below one still runs the work (on one thread).
  int runs = 0;
  CHECK(ParallelFor(3, 0, [&](size_t) {
          ++runs;
          return absl::OkStatus();
        }).ok());
  CHECK(runs == 3);
}

TEST_CASE("parallel for: the first error stops new indices and is returned",
          "[common]") {
  std::atomic<int> started{0};
  const absl::Status s = ParallelFor(1000, 1, [&](size_t i) {
    ++started;
    if (i == 5) return absl::DataLossError("piece 5 is damaged");
    if (i == 6) return absl::InternalError("never reached");
    return absl::OkStatus();
  });
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == "piece 5 is damaged");
  CHECK(started.load() == 6);  // one thread: 0..5, nothing after the error
}

TEST_CASE("parallel for: cancellation stops new indices and says so",
          "[common]") {
  std::atomic<bool> cancel{false};
  std::atomic<int> started{0};
  const absl::Status s = ParallelFor(
      1000, 2,
      [&](size_t i) {
        ++started;
        if (i == 10) cancel = true;
        return absl::OkStatus();
      },
      &cancel);
  CHECK(s.code() == absl::StatusCode::kCancelled);
  CHECK(started.load() < 1000);
  // Cancelled after the last index started: everything ran, so it is ok.
  std::atomic<bool> late{false};
  CHECK(ParallelFor(
            3, 1,
            [&](size_t i) {
              if (i == 2) late = true;
              return absl::OkStatus();
            },
            &late)
            .ok());
}

}  // namespace
}  // namespace ptc
