#include "tensor_store/internal/unix_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ptc::store_internal {

absl::Status SendPacket(int socket, const std::string& bytes,
                        const std::vector<int>& fds) {
  if (fds.size() > static_cast<size_t>(kMaxPacketFds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " descriptors in one packet; at most ", kMaxPacketFds));
  }
  struct iovec iov;
  iov.iov_base = const_cast<char*>(bytes.data());
  iov.iov_len = bytes.size();
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(kMaxPacketFds * sizeof(int))];
  if (!fds.empty()) {
    const size_t n = fds.size() * sizeof(int);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(n);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n);
    std::memcpy(CMSG_DATA(c), fds.data(), n);
  }
  while (sendmsg(socket, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("sending on the local socket: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendPacket(int socket, const std::string& bytes, int fd) {
  if (fd < 0) return SendPacket(socket, bytes, std::vector<int>());
  return SendPacket(socket, bytes, std::vector<int>{fd});
}

absl::StatusOr<std::string> ReceivePacket(int socket, int* fd) {
  *fd = -1;
  std::vector<int> fds;
  absl::StatusOr<std::string> packet = ReceivePacket(socket, &fds);
  // The first is the caller's; a peer that sends more leaks none.
  for (size_t i = 0; i < fds.size(); ++i) {
    if (i == 0 && packet.ok()) {
      *fd = fds[0];
    } else {
      close(fds[i]);
    }
  }
  return packet;
}

absl::StatusOr<std::string> ReceivePacket(int socket, std::vector<int>* fds) {
  fds->clear();
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
  // All descriptors that arrive are taken; the kernel closes those that do
  // not fit.
  alignas(struct cmsghdr) char control[CMSG_SPACE(kMaxPacketFds * sizeof(int))];
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
      fds->push_back(got);
    }
  }
  auto drop = [&] {
    for (int got : *fds) close(got);
    fds->clear();
  };
  if (n == 0) {
    drop();
    return absl::UnavailableError("the peer closed the local connection");
  }
  if (msg.msg_flags & MSG_TRUNC) {
    drop();
    return absl::InvalidArgumentError(
        absl::StrCat("a local message is larger than ", kMaxPacket, " bytes"));
  }
  return std::string(buf.get(), static_cast<size_t>(n));
}

}  // namespace ptc::store_internal
