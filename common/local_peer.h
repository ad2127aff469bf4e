// Who may use a ptcd's Unix sockets (the local store socket and the
// coordinator relay): the daemon's own user, root, `allowed_uids`, and
// members of `allowed_gid` (primary or supplementary group, as the kernel
// recorded them at connect: SO_PEERCRED and SO_PEERGROUPS). Both sockets
// are created mode 0660 and, with `allowed_gid`, belong to that group, so
// that other users cannot even connect.
//
//   PTC_ASSIGN_OR_RETURN(int fd, ListenLocal(path, SOCK_STREAM, access));
//   ... int client = accept4(fd, ...);
//   LocalPeer peer = IdentifyLocalPeer(client);
//   if (std::string why = RefusalOf(peer, client, access); !why.empty()) ...
#ifndef PTC_COMMON_LOCAL_PEER_H_
#define PTC_COMMON_LOCAL_PEER_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ptc {

struct LocalAccess {
  // Users allowed besides the daemon's own and root.
  std::vector<uid_t> allowed_uids;
  // Members of this group may connect; nullopt: the daemon's own group.
  std::optional<gid_t> allowed_gid;
};

// The process at the other end of a connected Unix socket.
struct LocalPeer {
  bool known = false;  // the kernel told its credentials
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

LocalPeer IdentifyLocalPeer(int fd);

// Empty if `peer` (connected on `fd`) may use the socket; otherwise what
// to tell it (which user, and what the admin can do).
std::string RefusalOf(const LocalPeer& peer, int fd, const LocalAccess& access);

// Whether `path` fits a Unix socket's address (107 bytes at most).
bool FitsSocketAddress(const std::string& path);

// A listening Unix socket at `path` (a stale one is replaced), of `type`
// (SOCK_STREAM, SOCK_SEQPACKET), close-on-exec, mode 0660 and given to
// `access.allowed_gid`. INVALID_ARGUMENT for a path that does not fit a
// socket address; UNAVAILABLE naming the step that failed.
absl::StatusOr<int> ListenLocal(const std::string& path, int type,
                                const LocalAccess& access);

}  // namespace ptc

#endif  // PTC_COMMON_LOCAL_PEER_H_
