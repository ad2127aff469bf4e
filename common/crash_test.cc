// InstallCrashHandler: a crash prints its signal and a symbolized stack
// trace, and the process still dies of the signal.
#include "common/crash.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

namespace ptc {
namespace {

// Writes through `p` (null): a SIGSEGV in a frame with a known name.
__attribute__((noinline)) void CrashOnPurpose(volatile int* p) {
  *p = 1;
  asm volatile("" ::: "memory");  // not a tail call: this frame stays
}

// Aborts (SIGABRT, raised rather than a fault) from a frame with a known
// name.
__attribute__((noinline)) void AbortOnPurpose() {
  std::abort();
  asm volatile("" ::: "memory");
}

// A breakpoint trap (SIGTRAP), after which execution would resume.
__attribute__((noinline)) void TrapOnPurpose() {
  asm volatile("int3" ::: "memory");
  asm volatile("" ::: "memory");
}

enum class Crash { kFault, kAbort, kTrap };

// The caller whose frame the report must reach past the signal.
__attribute__((noinline)) void CallerOfTheCrash(Crash how) {
  volatile int* null = nullptr;
  switch (how) {
    case Crash::kFault:
      CrashOnPurpose(null);
      break;
    case Crash::kAbort:
      AbortOnPurpose();
      break;
    case Crash::kTrap:
      TrapOnPurpose();
      break;
  }
  asm volatile("" ::: "memory");
}

TEST_CASE(
    "crash handler: a crash prints the signal and where it happened, and "
    "the process dies of it",
    "[common][crash]") {
  const Crash how = GENERATE(Crash::kFault, Crash::kAbort, Crash::kTrap);
  struct Expected {
    int signal;
    const char* says;
    const char* frame;
  };
  const Expected want =
      how == Crash::kFault
          ? Expected{SIGSEGV,
                     "SEGV (Segmentation fault) at address 0x0000000000000000",
                     "CrashOnPurpose"}
      : how == Crash::kAbort
          ? Expected{SIGABRT, "ABRT (Aborted) sent by process",
                     "AbortOnPurpose"}
          : Expected{SIGTRAP, "TRAP (", "TrapOnPurpose"};
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    InstallCrashHandler("/proc/self/exe");
    CallerOfTheCrash(how);
    _exit(0);  // reached only if the handler resumed the program
  }
  close(out[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;)
    report.append(buf, n);
  close(out[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO(report);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == want.signal);
  CHECK_THAT(report, Catch::Contains(want.says));
  // The crashing frame, then its caller: unwound past the signal.
  const size_t crashed = report.find(want.frame);
  CHECK(crashed != std::string::npos);
  CHECK(report.find("CallerOfTheCrash", crashed) != std::string::npos);
}

}  // namespace
}  // namespace ptc
