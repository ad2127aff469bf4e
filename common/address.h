// Network addresses as ptc's config files and requests write them:
// "HOST:PORT", where HOST is a name ("gpu-node-17"), an IPv4 address
// ("10.0.0.7") or a bracketed IPv6 address ("[fd00::7]").
//
//   PTC_ASSIGN_OR_RETURN(HostPort a, ParseHostPort("gpu-node-17:7070"));
#ifndef PTC_COMMON_ADDRESS_H_
#define PTC_COMMON_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ptc {

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
};

// INVALID_ARGUMENT naming the text unless it is HOST:PORT with a port in
// [1, 65535] (or [0, 65535] with `allow_port_zero`, for "pick one") and a
// host of at most 253 characters of letters, digits, '.', '-' and '_'
// (or an IPv6 address in brackets).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       bool allow_port_zero = false);

// A host's failure domain, a path from the widest ("rack3", "dc1/rack3"):
// empty (none), or 1 to 8 names of 1 to 63 letters, digits, '.', '-' or
// '_' joined by '/', at most 253 characters. INVALID_ARGUMENT says the
// rule.
absl::Status ValidateDomain(absl::string_view domain);

}  // namespace ptc

#endif  // PTC_COMMON_ADDRESS_H_
