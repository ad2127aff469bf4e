// ConfigureMutexChecks: PTC_MUTEX_CHECKS=1 keeps absl's lock-order check
// (a cycle aborts the process); otherwise it is off.
#include "common/mutex_checks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"

namespace ptc {
namespace {

// Runs, in a child process with PTC_MUTEX_CHECKS set to `env` (or unset),
// two locks taken in both orders; returns the child's wait status.
int InvertLocks(const char* env) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (env == nullptr) {
      unsetenv("PTC_MUTEX_CHECKS");
    } else {
      setenv("PTC_MUTEX_CHECKS", env, 1);
    }
    ConfigureMutexChecks();
    absl::Mutex a, b;
    {
      absl::MutexLock la(&a);
      absl::MutexLock lb(&b);
    }
    {
      absl::MutexLock lb(&b);
      absl::MutexLock la(&a);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST_CASE("mutex checks: on with PTC_MUTEX_CHECKS=1, off otherwise",
          "[common]") {
  const int checked = InvertLocks("1");
  CHECK(WIFSIGNALED(checked));
  CHECK(WTERMSIG(checked) == SIGABRT);
  for (const char* env : {static_cast<const char*>(nullptr), "0"}) {
    const int unchecked = InvertLocks(env);
    CHECK(WIFEXITED(unchecked));
    CHECK(WEXITSTATUS(unchecked) == 0);
  }
}

}  // namespace
}  // namespace ptc
