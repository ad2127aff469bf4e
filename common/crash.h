// A crash report for ptc's programs: on SIGSEGV, SIGBUS, SIGILL, SIGFPE,
// SIGABRT or SIGTRAP the program writes the signal, the faulting address
// and a symbolized stack trace of the thread that crashed to stderr (the
// journal, under systemd), then dies of the same signal as it would have
// (same exit status, a core dump where they are enabled).
//
//   int main(int argc, char** argv) {
//     ptc::InstallCrashHandler(argv[0]);
//     ...
//   }
#ifndef PTC_COMMON_CRASH_H_
#define PTC_COMMON_CRASH_H_

namespace ptc {

// Call once, first thing in main. `argv0` locates the program's symbols.
void InstallCrashHandler(const char* argv0);

}  // namespace ptc

#endif  // PTC_COMMON_CRASH_H_
