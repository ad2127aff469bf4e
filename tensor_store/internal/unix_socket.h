// One message (and at most one file descriptor) per SOCK_SEQPACKET packet,
// for the local protocol of ptcd.
#ifndef PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_
#define PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_

#include <string>

#include "absl/status/statusor.h"

namespace ptc::store_internal {

// Largest local protocol message.
inline constexpr int kMaxPacket = 64 * 1024;
// Most puts one CommitPuts commits, and the longest message of one put's
// answer: the answer to a whole batch fits one packet.
inline constexpr int kMaxCommitPuts = 128;
inline constexpr int kMaxPutResultMessage = 200;

// Sends `bytes` and, if fd >= 0, a copy of `fd`.
absl::Status SendPacket(int socket, const std::string& bytes, int fd = -1);

// Receives one packet. UNAVAILABLE when the peer closed the connection;
// INVALID_ARGUMENT for a packet larger than kMaxPacket; DEADLINE_EXCEEDED
// when the socket has a receive timeout (SO_RCVTIMEO) and it passed. A
// received fd (or -1) is stored in *fd; the caller owns it.
absl::StatusOr<std::string> ReceivePacket(int socket, int* fd);

}  // namespace ptc::store_internal

#endif  // PTC_TENSOR_STORE_INTERNAL_UNIX_SOCKET_H_
