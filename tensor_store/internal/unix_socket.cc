#include "tensor_store/internal/unix_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ptc::store_internal {

absl::Status SendPacket(int socket, const std::string& bytes, int fd) {
  struct iovec iov;
  iov.iov_base = const_cast<char*>(bytes.data());
  iov.iov_len = bytes.size();
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  while (sendmsg(socket, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("sending on the local socket: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReceivePacket(int socket, int* fd) {
  *fd = -1;
  // Received into this thread's buffer, allocated once and never zeroed,
  // and copied out at the packet's size: a fresh zeroed 64 KiB for every
  // packet (both ends of every local call) was a tenth of a hollow host's
  // CPU.
  thread_local const std::unique_ptr<char[]> buf(new char[kMaxPacket]);
  struct iovec iov;
  iov.iov_base = buf.get();
  iov.iov_len = kMaxPacket;
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for several descriptors: all that arrive are taken (the first is
  // returned, the others closed), so a peer that sends many leaks none. The
  // kernel closes those that do not fit.
  constexpr int kMaxFds = 16;
  alignas(struct cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  while ((n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError(
          "no local message within the socket's receive timeout");
    }
    return absl::UnavailableError(
        absl::StrCat("receiving on the local socket: ", std::strerror(errno)));
  }
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0) {
        *fd = got;
      } else {
        close(got);
      }
    }
  }
  if (n == 0) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return absl::UnavailableError("the peer closed the local connection");
  }
  if (msg.msg_flags & MSG_TRUNC) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return absl::InvalidArgumentError(
        absl::StrCat("a local message is larger than ", kMaxPacket, " bytes"));
  }
  return std::string(buf.get(), static_cast<size_t>(n));
}

}  // namespace ptc::store_internal
