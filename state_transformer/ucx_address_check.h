// Checks a peer's UCX worker address before this process's UCX parses it.
//
// UCX reads a packed worker address without knowing its length and aborts
// the process on one it cannot parse (a flipped byte or a truncation was
// enough in a fuzzing run: 3 of 200 mutated addresses killed the process).
// So an address is first parsed by UCX in a child process — this same
// binary, re-executed with PTC_UCX_ADDRESS_CHECK set, which creates a
// worker and an endpoint to the address and exits — and only an address
// the child survived reaches the daemon's own UCX.
//
// Addresses that passed are remembered (up to kMaxCheckedAddresses, then
// the record starts over), so a peer's address costs one check (about
// 50 ms) per process; at most kMaxChecksAtOnce children run at once. A
// check that does not finish in 30 s is DEADLINE_EXCEEDED: the address is
// neither taken nor refused, and the caller may ask again.
//
//   PTC_RETURN_IF_ERROR(CheckUcxAddress(peer_address));
#ifndef PTC_STATE_TRANSFORMER_UCX_ADDRESS_CHECK_H_
#define PTC_STATE_TRANSFORMER_UCX_ADDRESS_CHECK_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace ptc {

inline constexpr size_t kMaxCheckedAddresses = 4096;
inline constexpr int kMaxChecksAtOnce = 4;
// Longer addresses are refused without a check (UCX 1.13's are a few
// hundred bytes on a host with several devices).
inline constexpr size_t kMaxUcxAddressBytes = 64 << 10;

// OK if this process's UCX can parse `address`; INVALID_ARGUMENT naming
// what the check saw otherwise; UNAVAILABLE if no check could be run.
absl::Status CheckUcxAddress(const std::string& address);

}  // namespace ptc

#endif  // PTC_STATE_TRANSFORMER_UCX_ADDRESS_CHECK_H_
