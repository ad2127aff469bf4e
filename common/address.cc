#include "common/address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ptc {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       bool allow_port_zero) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", absl::CHexEscape(text.substr(0, 300)),
                     "' is not HOST:PORT (", why, ")"));
  };
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  HostPort out;
  absl::string_view host = text.substr(0, colon);
  if (!absl::SimpleAtoi(text.substr(colon + 1), &out.port) ||
      out.port < (allow_port_zero ? 0 : 1) || out.port > 65535) {
    return bad("the port must be a number from 1 to 65535");
  }
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("unclosed '['");
    const std::string v6(host.substr(1, host.size() - 2));
    struct in6_addr parsed;
    if (inet_pton(AF_INET6, v6.c_str(), &parsed) != 1)
      return bad("not an IPv6 address in brackets");
    out.host = v6;
    return out;
  }
  if (host.empty()) return bad("no host");
  if (host.size() > 253) return bad("the host is longer than 253 characters");
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
      return bad(c == ':' ? "an IPv6 address needs brackets"
                          : "the host has a character other than letters, "
                            "digits, '.', '-' and '_'");
    }
  }
  out.host = std::string(host);
  return out;
}

absl::Status ValidateDomain(absl::string_view domain) {
  if (domain.empty()) return absl::OkStatus();
  const std::vector<absl::string_view> parts = absl::StrSplit(domain, '/');
  const bool valid =
      domain.size() <= 253 && parts.size() <= 8 &&
      std::all_of(parts.begin(), parts.end(), [](absl::string_view p) {
        return !p.empty() && p.size() <= 63 &&
               std::all_of(p.begin(), p.end(), [](char c) {
                 return absl::ascii_isalnum(c) || c == '.' || c == '-' ||
                        c == '_';
               });
      });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "failure domain '", absl::CHexEscape(domain.substr(0, 300)),
      "' must be a path of 1 to 8 names ('rack3', 'dc1/rack3'), each of 1 "
      "to 63 letters, digits, '.', '-' or '_'"));
}

}  // namespace ptc
