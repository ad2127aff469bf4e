// absl::Mutex's lock-order check, on in tests and off in production.
//
// Unless absl was built with NDEBUG (Debian's is not), every acquisition
// of an absl::Mutex while the thread holds another records the pair in one
// process-wide graph, under one global lock, and aborts the process on a
// cycle (a potential deadlock). That makes a nested acquisition 5-7 times
// slower and serializes every thread that takes one. ptc's daemons turn
// the check off unless PTC_MUTEX_CHECKS=1 asks for it; the test suite sets
// it, so that every daemon a test starts checks its lock order.
//
//   int main(int argc, char** argv) {
//     ptc::ConfigureMutexChecks();
//     ...
//   }
#ifndef PTC_COMMON_MUTEX_CHECKS_H_
#define PTC_COMMON_MUTEX_CHECKS_H_

namespace ptc {

// Call first thing in main, before any thread starts. Returns whether the
// check is on.
bool ConfigureMutexChecks();

}  // namespace ptc

#endif  // PTC_COMMON_MUTEX_CHECKS_H_
