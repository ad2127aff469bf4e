#include "common/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "absl/debugging/symbolize.h"

namespace ptc {
namespace {

// Everything below runs in a signal handler: no allocation, no locks, no
// stdio; only write(2) on stack buffers, backtrace(3) (primed at install,
// so that it loads its unwinder then) and absl::Symbolize (async-signal-
// safe by its contract).

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
constexpr int kMaxFrames = 64;

std::atomic<bool> crashing{false};
const char* program = "";

void Write(const char* s) {
  for (size_t n = strlen(s); n > 0;) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// "0x" and 16 hex digits.
void WriteHex(uintptr_t v) {
  char out[19] = "0x";
  for (int i = 0; i < 16; ++i)
    out[17 - i] = "0123456789abcdef"[(v >> (4 * i)) & 15];
  out[18] = '\0';
  Write(out);
}

// The program counter of the interrupted code, or 0 where not known.
uintptr_t InterruptedPc(void* ucontext) {
#if defined(__x86_64__)
  return static_cast<uintptr_t>(
      static_cast<ucontext_t*>(ucontext)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(
      static_cast<ucontext_t*>(ucontext)->uc_mcontext.pc);
#else
  return 0;
#endif
}

void WriteDecimal(int64_t v) {
  char out[24];
  int at = sizeof(out) - 1;
  out[at] = '\0';
  const bool negative = v < 0;
  uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : v;
  do {
    out[--at] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u > 0);
  if (negative) out[--at] = '-';
  Write(out + at);
}

void Handler(int sig, siginfo_t* info, void* ucontext) {
  if (crashing.exchange(true)) {
    // A second crash (in this handler, or another thread's): let the
    // first report finish; the default action ends the process.
    signal(sig, SIG_DFL);
    return;
  }
  alarm(3);  // a report that hangs must not keep a broken process alive
  Write("*** ");
  Write(program);
  Write(": ");
  Write(sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "signal");
  Write(" (");
  Write(sigdescr_np(sig) != nullptr ? sigdescr_np(sig) : "?");
  if (info->si_code > 0) {  // a fault: where it happened
    Write(") at address ");
    WriteHex(reinterpret_cast<uintptr_t>(info->si_addr));
  } else {  // raised (abort(), kill): by whom
    Write(") sent by process ");
    WriteDecimal(info->si_pid);
  }
  Write("; stack of the thread that crashed:\n");
  void* pcs[kMaxFrames];
  const int n = backtrace(pcs, kMaxFrames);
  // From the interrupted instruction on (this handler's frames and the
  // signal trampoline before it are left out, where it is found).
  const uintptr_t interrupted = InterruptedPc(ucontext);
  int first = 0;
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(pcs[i]) == interrupted) first = i;
  }
  char name[512];
  for (int i = first; i < n; ++i) {
    // A return address points after its call: look up the call itself.
    const uintptr_t pc = reinterpret_cast<uintptr_t>(pcs[i]);
    const uintptr_t lookup = pc == interrupted ? pc : pc - 1;
    Write("    @ ");
    WriteHex(pc);
    Write("  ");
    Write(absl::Symbolize(reinterpret_cast<void*>(lookup), name, sizeof(name))
              ? name
              : "(unknown)");
    Write("\n");
  }
  // Die of the signal: a fault re-executes the faulting instruction under
  // the default action; a raised signal, and a trap (which would resume
  // after its instruction), is raised again.
  signal(sig, SIG_DFL);
  if (info->si_code <= 0 || sig == SIGTRAP) raise(sig);
}

}  // namespace

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  const char* slash = strrchr(argv0, '/');
  program = slash != nullptr ? slash + 1 : argv0;
  void* prime[1];
  backtrace(prime, 1);
  // Its own stack (the main thread's): a stack overflow there is reported
  // too.
  static char alternate[64 << 10];
  stack_t ss{};
  ss.ss_sp = alternate;
  ss.ss_size = sizeof(alternate);
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = Handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

}  // namespace ptc
