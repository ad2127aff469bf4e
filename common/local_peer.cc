#include "common/local_peer.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ptc {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Whether a peer is in `gid`: its primary group, or one of its
// supplementary groups as the kernel recorded them at connect.
bool PeerInGroup(int fd, gid_t primary, gid_t gid) {
  if (primary == gid) return true;
  std::vector<gid_t> groups(64);
  socklen_t len = groups.size() * sizeof(gid_t);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return false;
    groups.resize(len / sizeof(gid_t) + 1);
    len = groups.size() * sizeof(gid_t);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0)
      return false;
  }
  groups.resize(len / sizeof(gid_t));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

}  // namespace

LocalPeer IdentifyLocalPeer(int fd) {
  LocalPeer peer;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.known = true;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    peer.pid = cred.pid;
  }
  return peer;
}

std::string RefusalOf(const LocalPeer& peer, int fd,
                      const LocalAccess& access) {
  const gid_t group = access.allowed_gid.value_or(getegid());
  if (peer.known &&
      (peer.uid == geteuid() || peer.uid == 0 ||
       std::find(access.allowed_uids.begin(), access.allowed_uids.end(),
                 peer.uid) != access.allowed_uids.end() ||
       PeerInGroup(fd, peer.gid, group))) {
    return "";
  }
  return absl::StrCat(
      "user ", peer.uid,
      " may not use this ptcd; ask the admin to add it to the daemon's "
      "group (gid ",
      group, ") or to allowed_uids");
}

bool FitsSocketAddress(const std::string& path) {
  return path.size() < sizeof(sockaddr_un::sun_path);
}

absl::StatusOr<int> ListenLocal(const std::string& path, int type,
                                const LocalAccess& access) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local socket path '", path, "' must be non-empty and shorter than ",
        sizeof(addr.sun_path), " characters"));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno(absl::StrCat("creating the socket ", path));
  unlink(path.c_str());  // a stale socket of a previous run
  absl::Status failed;
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0) {
    failed = Errno(absl::StrCat("binding ", path));
  } else if (chmod(path.c_str(), 0660);
             // The group's members reach the socket only if it is the
             // group's (the daemon's own group needs nothing).
             access.allowed_gid &&
             chown(path.c_str(), -1, *access.allowed_gid) != 0) {
    failed = Errno(absl::StrCat("giving ", path, " to group ",
                                *access.allowed_gid, " (allowed_group)"));
  } else if (listen(fd, 128) != 0) {
    failed = Errno(absl::StrCat("listening on ", path));
  }
  if (!failed.ok()) {
    close(fd);
    return failed;
  }
  return fd;
}

}  // namespace ptc
