// Inputs that crashed ptcd or broke its accounting, from the network or a
// local client: each is refused (or made harmless), the daemon keeps
// serving, and its memory accounting stays exact.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "ptc/region_proto.h"
#include "tensor_store/internal/testing.h"
#include "tensor_store/local_client.h"

namespace ptc {
namespace {

using testing::StartDaemon;

constexpr int64_t kRows = 64, kCols = 1024;  // 256 KiB of fp32

int64_t MemoryUsed(testing::Daemon& d) {
  auto stats = d.client->Stats();
  REQUIRE(stats.ok());
  return testing::DataBytesUsed(*stats);
}

int OpenDescriptors() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

int ConnectRaw(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST_CASE(
    "hostile: a shape whose element count overflows int64 is refused "
    "(it made the memory accounting negative)",
    "[tensor_store][hostile]") {
  auto d = StartDaemon(int64_t{256} << 20);
  for (const Shape& shape :
       {Shape{int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40},
        Shape{int64_t{1} << 32, int64_t{1} << 32},
        Shape{int64_t{1} << 40, int64_t{1} << 20, 0, int64_t{1} << 40,
              int64_t{1} << 40}}) {
    const absl::Status s =
        d->client->Declare("job", {TensorDecl{"w", DType::kFloat32, shape}});
    INFO(s.ToString());
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
      // An empty tensor is fine whatever its other extents.
      CHECK(s.ok());
      continue;
    }
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains("larger than 2^50"));
  }
  CHECK(MemoryUsed(*d) == 0);
  // The limit still holds: a put larger than the store is refused.
  REQUIRE(d->client->Declare("job", {{"big", DType::kUInt8, {300 << 20}}}).ok());
  std::vector<char> bytes(300 << 20);
  const absl::Status put =
      d->client
          ->Put("job", 1, "big", Region{{0, 300 << 20}}, bytes.data(),
                bytes.size())
          .status();
  CHECK(put.code() == absl::StatusCode::kResourceExhausted);
  CHECK(MemoryUsed(*d) == 0);
}

TEST_CASE(
    "hostile: one declaration naming a tensor twice with different shapes is "
    "refused",
    "[tensor_store][hostile]") {
  auto d = StartDaemon();
  const absl::Status s =
      d->client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}},
                                 {"w", DType::kFloat32, {kRows * 2, kCols}}});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("declared twice"));
  // Nothing of it was declared; the same tensor twice identically is fine.
  CHECK(d->client
            ->Declare("job", {{"w", DType::kFloat32, {kRows * 2, kCols}},
                              {"w", DType::kFloat32, {kRows * 2, kCols}}})
            .ok());
}

TEST_CASE(
    "hostile: a local client cannot shrink or grow its put's shared memory "
    "(shrinking was a SIGBUS in the checksum)",
    "[tensor_store][hostile]") {
  auto d = StartDaemon();
  REQUIRE(
      d->client->Declare("job", {{"w", DType::kFloat32, {kRows, kCols}}}).ok());
  auto c = LocalClient::Connect(d->socket_path());
  REQUIRE(c.ok());
  proto::LocalRequest req;
  proto::AllocatePutOp* op = req.mutable_allocate_put();
  op->set_job("job");
  op->set_version(1);
  op->set_tensor("w");
  RegionToProto(Region{{0, kRows}, {0, kCols}}, op->mutable_region());
  int fd = -1;
  auto allocated = (*c)->Call(req, &fd);
  REQUIRE(allocated.ok());
  REQUIRE(allocated->code() == 0);
  REQUIRE(fd >= 0);
  const int64_t bytes = kRows * kCols * 4;
  CHECK(ftruncate(fd, 0) != 0);
  CHECK(errno == EPERM);
  CHECK(ftruncate(fd, bytes * 1024) != 0);
  CHECK(errno == EPERM);
  CHECK(MemoryUsed(*d) == bytes);
  close(fd);

  proto::LocalRequest commit;
  commit.mutable_commit_put()->set_handle(allocated->handle());
  commit.mutable_commit_put()->set_checksum(
      Checksum(std::vector<char>(bytes, 0).data(), bytes));
  auto committed = (*c)->Call(commit, nullptr);
  REQUIRE(committed.ok());
  CHECK(committed->code() == 0);
  CHECK(MemoryUsed(*d) == bytes);
}

TEST_CASE(
    "hostile: local packets carrying many descriptors leak none, and the "
    "socket keeps serving after running out of descriptors",
    "[tensor_store][hostile]") {
  auto d = StartDaemon();
  const int sock = ConnectRaw(d->socket_path());
  REQUIRE(sock >= 0);
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(null >= 0);
  proto::LocalRequest hello;
  hello.mutable_hello()->set_job("job");
  hello.set_request_id(7);  // so that the answer is not an empty packet
  const std::string packet = hello.SerializeAsString();
  {
    // One exchange first: the daemon has accepted the connection.
    REQUIRE(send(sock, packet.data(), packet.size(), 0) ==
            static_cast<ssize_t>(packet.size()));
    char buf[4096];
    REQUIRE(recv(sock, buf, sizeof(buf), 0) > 0);
  }
  const int before = OpenDescriptors();
  for (int i = 0; i < 50; ++i) {
    int fds[3] = {null, null, null};
    struct iovec iov = {const_cast<char*>(packet.data()), packet.size()};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(fds));
    std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
    REQUIRE(sendmsg(sock, &msg, 0) == static_cast<ssize_t>(packet.size()));
    char buf[4096];
    REQUIRE(recv(sock, buf, sizeof(buf), 0) > 0);
  }
  CHECK(OpenDescriptors() == before);
  close(null);
  close(sock);

  // Run the process (daemon and clients share it here) out of
  // descriptors, then give them back: the daemon serves again.
  struct rlimit old;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = OpenDescriptors() + 16;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> held;
  for (int i = 0; i < 64; ++i) {
    const int fd = ConnectRaw(d->socket_path());
    if (fd < 0) break;
    held.push_back(fd);
  }
  // Leave the accept loop time to hit the limit.
  usleep(300 * 1000);
  for (int fd : held) close(fd);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
  // A fresh client is answered (before, the accept loop had given up for
  // good: the connection was queued and never served).
  const int fresh = ConnectRaw(d->socket_path());
  REQUIRE(fresh >= 0);
  struct timeval wait = {5, 0};
  REQUIRE(setsockopt(fresh, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait)) == 0);
  REQUIRE(send(fresh, packet.data(), packet.size(), 0) ==
          static_cast<ssize_t>(packet.size()));
  char buf[4096];
  const ssize_t n = recv(fresh, buf, sizeof(buf), 0);
  CHECK(n > 0);
  close(fresh);
}

}  // namespace
}  // namespace ptc
