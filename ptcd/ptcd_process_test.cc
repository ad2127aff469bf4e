// The real ptcd binary as a separate process, with client processes that
// are SIGKILLed half way through a save: nothing partial stays, and the
// daemon serves on and exits cleanly on SIGTERM.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tensor_store/internal/testing.h"
#include "tensor_store/local_client.h"
#include "tensor_store/store_client.h"

namespace ptc {
namespace {

constexpr int64_t kBytes = int64_t{64} << 20;

pid_t StartPtcd(const std::string& dir) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string socket = dir + "/ptcd.sock", port = dir + "/port";
    execl("ptcd/ptcd", "ptcd", "--listen", "127.0.0.1:0", "--socket",
          socket.c_str(), "--port-file", port.c_str(), "--memory-limit", "1GiB",
          "--log-level", "warn", "--insecure", static_cast<char*>(nullptr));
    std::perror("exec ptcd/ptcd");
    _exit(127);
  }
  return pid;
}

int WaitForPort(const std::string& dir) {
  // Up to 60 s: a ptcd starting beside a loaded machine's other tests.
  for (int i = 0; i < 6000; ++i) {
    std::ifstream in(dir + "/port");
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// A child that starts a Put (over gRPC, or through shared memory), tells
// the parent when half the bytes are in, and then hangs until killed.
pid_t StartHalfPut(const std::string& dir, bool shared_memory, int ready_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int port = WaitForPort(dir);
  auto say_ready = [&] {
    char c = 1;
    (void)!write(ready_fd, &c, 1);
    pause();
  };
  const Region r{{0, kBytes}};
  if (shared_memory) {
    auto c = LocalClient::Connect(dir + "/ptcd.sock");
    if (!c.ok()) _exit(2);
    auto buf = (*c)->AllocatePut("job", 1, "shm", r);
    if (!buf.ok()) _exit(3);
    std::memset(buf->data(), 7, kBytes / 2);
    say_ready();
  }
  auto client = StoreClient::Connect(absl::StrCat("127.0.0.1:", port));
  auto put = client->PutWith("job", 1, "grpc", r, kBytes,
                             [&](int64_t off, char* dst, int64_t n) {
                               if (off >= kBytes / 2) say_ready();
                               std::memset(dst, 7, n);
                             });
  _exit(put.ok() ? 4 : 5);  // not reached: the parent kills us first
}

TEST_CASE(
    "ptcd process: clients killed half way through a save leave nothing, and "
    "SIGTERM exits cleanly",
    "[tensor_store][process]") {
  testing::TempDir dir;
  const pid_t ptcd = StartPtcd(dir.path());
  REQUIRE(ptcd > 0);
  const int port = WaitForPort(dir.path());
  REQUIRE(port > 0);
  // The children fork before this process touches gRPC.
  int pipes[2][2];
  REQUIRE(pipe(pipes[0]) == 0);
  REQUIRE(pipe(pipes[1]) == 0);
  // A helper child declares the tensors over gRPC, so that this process
  // stays gRPC-free until the save children have forked.
  const pid_t declarer = fork();
  if (declarer == 0) {
    auto c = StoreClient::Connect(absl::StrCat("127.0.0.1:", port));
    _exit(c->Declare("job", {{"grpc", DType::kUInt8, {kBytes}},
                             {"shm", DType::kUInt8, {kBytes}}})
                  .ok()
              ? 0
              : 1);
  }
  int status = 0;
  REQUIRE(waitpid(declarer, &status, 0) == declarer);
  REQUIRE(WEXITSTATUS(status) == 0);
  const pid_t over_grpc = StartHalfPut(dir.path(), false, pipes[0][1]);
  const pid_t over_shm = StartHalfPut(dir.path(), true, pipes[1][1]);
  for (auto& p : pipes) {
    char c;
    REQUIRE(read(p[0], &c, 1) == 1);  // half way there
  }
  kill(over_grpc, SIGKILL);
  kill(over_shm, SIGKILL);
  waitpid(over_grpc, &status, 0);
  CHECK(WIFSIGNALED(status));
  waitpid(over_shm, &status, 0);
  CHECK(WIFSIGNALED(status));

  auto client = StoreClient::Connect(absl::StrCat("127.0.0.1:", port));
  int64_t used = -1;
  for (int i = 0; i < 6000; ++i) {  // up to 60 s
    auto stats = client->Stats();
    REQUIRE(stats.ok());
    used = testing::DataBytesUsed(*stats) - stats->spare_bytes();
    if (used == 0 && stats->local_clients() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(used == 0);
  auto list = client->List("job");
  REQUIRE(list.ok());
  CHECK(list->jobs(0).versions_size() == 0);
  // The daemon serves on: a whole put works.
  std::vector<char> data(kBytes, 9);
  CHECK(client->Put("job", 1, "grpc", Region{{0, kBytes}}, data.data(), kBytes)
            .ok());

  kill(ptcd, SIGTERM);
  REQUIRE(waitpid(ptcd, &status, 0) == ptcd);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(access((dir.path() + "/ptcd.sock").c_str(), F_OK) !=
        0);  // socket removed
}

}  // namespace
}  // namespace ptc
