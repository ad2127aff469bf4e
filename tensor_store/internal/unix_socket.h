// One message (and its file descriptors, if any) per SOCK_SEQPACKET packet,
// for the local protocol of ptcd.
#ifndef PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_
#define PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ptc::store_internal {

// Largest local protocol message.
inline constexpr int kMaxPacket = 64 * 1024;
// Most puts one CommitPuts commits, and the longest message of one put's
// answer: the answer to a whole batch fits one packet.
inline constexpr int kMaxCommitPuts = 128;
inline constexpr int kMaxPutResultMessage = 200;
// Most regions one MapMany leases, most leases one Release lets go of, and
// most leases one connection holds at once (each pins its region's memory
// and a few hundred bytes of bookkeeping).
inline constexpr int kMaxMapRegions = 128;
inline constexpr int kMaxReleaseLeases = 4096;
inline constexpr int kMaxLeasesPerConnection = 1 << 18;

// Most descriptors one packet carries (a MapMany's answer: one per
// region at most).
inline constexpr int kMaxPacketFds = 128;

// Sends `bytes` and copies of `fds` (at most kMaxPacketFds).
absl::Status SendPacket(int socket, const std::string& bytes,
                        const std::vector<int>& fds);
// Sends `bytes` and, if fd >= 0, a copy of `fd`.
absl::Status SendPacket(int socket, const std::string& bytes, int fd = -1);

// Receives one packet. UNAVAILABLE when the peer closed the connection;
// INVALID_ARGUMENT for a packet larger than kMaxPacket; DEADLINE_EXCEEDED
// when the socket has a receive timeout (SO_RCVTIMEO) and it passed. A
// received fd (or -1) is stored in *fd; the caller owns it.
absl::StatusOr<std::string> ReceivePacket(int socket, int* fd);
// As ReceivePacket, keeping every descriptor received (at most
// kMaxPacketFds; the kernel closes any beyond), in order, in *fds; the
// caller owns them.
absl::StatusOr<std::string> ReceivePacket(int socket, std::vector<int>* fds);

}  // namespace ptc::store_internal

#endif  // PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_
