// How ptcctl commands fail: the message on stderr (with the usage for
// usage errors), and with --json also {"error": {"code", "message"}} on
// stdout for machines, unless the command already printed its one JSON
// document with the failure in it (ReportedInJson). Returns `exit_code`.
#ifndef PTC_TOOLS_INTERNAL_CLI_H_
#define PTC_TOOLS_INTERNAL_CLI_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/args.h"

namespace ptc::tools {

int Fail(const std::string& command, const absl::Status& status, int exit_code,
         bool json, const char* usage = nullptr);

// `status`, marked as already described in the JSON document the command
// printed, so that Fail adds no second document.
absl::Status ReportedInJson(absl::Status status);

// `values` and the options of a command that connects to ptc's services:
// --tls-ca, --tls-cert, --tls-key (files; the flag --insecure goes with the
// command's flags, see kSecurityFlag).
std::vector<std::string> WithSecurityOptions(std::vector<std::string> values);
inline constexpr char kSecurityFlag[] = "insecure";
// Sets this process's transport security from those options, else from
// the environment; an error says what to give.
absl::Status ConfigureCommandSecurity(const Args& args);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_CLI_H_
