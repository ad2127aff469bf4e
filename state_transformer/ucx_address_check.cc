#include "state_transformer/ucx_address_check.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics.h"

extern char** environ;

namespace ptc {
namespace {

Counter& address_checks_total =
    GetCounter("ptc_transformer_ucx_address_checks_total");

constexpr char kCheckVariable[] = "PTC_UCX_ADDRESS_CHECK";
constexpr int kUnparsed = 3;  // the child's exit code: UCX refused it
// How long a check may take. It takes about a third of a second on an
// idle machine; a check still running after this is killed, and the
// address is not taken: the peer is asked again later, as a peer that
// missed a deadline is (DEADLINE_EXCEEDED), since on a loaded host (two
// test suites on two cores) a check took more than 10 s.
constexpr absl::Duration kCheckTimeout = absl::Seconds(30);

// The child: reads the address from standard input and has UCX create an
// endpoint to it, as UcxWorker does. Runs before main() in the re-executed
// binary (a static initializer), so nothing of the daemon starts.
[[noreturn]] void RunCheck() {
  std::string address;
  char buf[4096];
  for (ssize_t n; (n = read(0, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || address.size() > kMaxUcxAddressBytes) _exit(kUnparsed);
    address.append(buf, n);
  }
  // The address ends where an unreadable page begins: UCX does not know
  // its length, and a read past the end (a truncated address) must kill
  // this child rather than read whatever follows, as it might in the
  // daemon.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t span = (address.size() + page - 1) / page * page + page;
  char* mem = static_cast<char*>(mmap(nullptr, span, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (mem == MAP_FAILED || mprotect(mem + span - page, page, PROT_NONE) != 0)
    _exit(2);
  char* at = mem + span - page - address.size();
  std::memcpy(at, address.data(), address.size());
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) _exit(2);
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
  ucp_context_h ctx;
  const ucs_status_t init = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (init != UCS_OK) _exit(2);
  ucp_worker_params_t wp = {};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker;
  if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) _exit(2);
  ucp_ep_params_t ep = {};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(at);
  ucp_ep_h created;
  _exit(ucp_ep_create(worker, &ep, &created) == UCS_OK ? 0 : kUnparsed);
}

const bool kIsCheck = [] {
  if (std::getenv(kCheckVariable) != nullptr) RunCheck();
  return false;
}();

// Runs the check in a child; returns its wait status, or an error.
absl::StatusOr<int> SpawnCheck(const std::string& address) {
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) {
    return absl::UnavailableError(
        absl::StrCat("a pipe for the check: ", std::strerror(errno)));
  }
  // The child sees only UCX's settings (the same transports as this
  // process), where its libraries are, and the switch; nothing else of
  // this environment (no tokens or keys).
  std::vector<std::string> env = {absl::StrCat(kCheckVariable, "=1")};
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "UCX_") ||
        absl::StartsWith(*e, "LD_LIBRARY_PATH=")) {
      env.emplace_back(*e);
    }
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  char name[] = "ptc-ucx-address-check";
  char* argv[] = {name, nullptr};
  pid_t pid;
  const int spawned = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr,
                                  argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  if (spawned != 0) {
    close(in[1]);
    return absl::UnavailableError(absl::StrCat(
        "starting the UCX address check: ", std::strerror(spawned)));
  }
  address_checks_total.Add();
  // The pipe holds 64 KiB, and the address is at most that: no blocking.
  const ssize_t wrote = write(in[1], address.data(), address.size());
  close(in[1]);
  (void)wrote;  // a short write is a truncated address: the child refuses
  const absl::Time deadline = absl::Now() + kCheckTimeout;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("waiting for the UCX address check: ",
                       std::strerror(errno)));
    }
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(
          absl::StrCat("UCX did not finish parsing it within ",
                       absl::FormatDuration(kCheckTimeout),
                       " (a loaded host?); not taken this time"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

absl::Mutex checked_mu;
// The addresses themselves (not a hash: a crafted address must not pass
// as one that collides with a checked one).
absl::flat_hash_set<std::string>& Checked() {
  static auto* checked = new absl::flat_hash_set<std::string>();
  return *checked;
}
int running ABSL_GUARDED_BY(checked_mu) = 0;

}  // namespace

absl::Status CheckUcxAddress(const std::string& address) {
  if (address.size() > kMaxUcxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a peer's UCX worker address of ", address.size(),
                     " bytes is longer than any UCX makes"));
  }
  {
    absl::MutexLock lock(&checked_mu);
    if (Checked().contains(address)) return absl::OkStatus();
    checked_mu.Await(absl::Condition(
        +[](int* n) { return *n < kMaxChecksAtOnce; }, &running));
    ++running;
  }
  absl::StatusOr<int> status = SpawnCheck(address);
  absl::MutexLock lock(&checked_mu);
  --running;
  if (!status.ok()) {
    return absl::Status(status.status().code(),
                        absl::StrCat("a peer's UCX worker address: ",
                                     status.status().message()));
  }
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
    if (Checked().size() >= kMaxCheckedAddresses) Checked().clear();
    Checked().insert(address);
    return absl::OkStatus();
  }
  if (WIFEXITED(*status) && WEXITSTATUS(*status) != kUnparsed) {
    return absl::UnavailableError(absl::StrCat(
        "the UCX address check could not start UCX (exit ",
        WEXITSTATUS(*status), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a peer's UCX worker address (", address.size(),
      " bytes) is not one this UCX can use: ",
      WIFSIGNALED(*status)
          ? absl::StrCat("parsing it killed the check process (signal ",
                         WTERMSIG(*status), ")")
          : std::string("UCX refused it")));
}

}  // namespace ptc
