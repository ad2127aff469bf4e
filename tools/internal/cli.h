// How ptcctl commands fail: the message on stderr (with the usage for
// usage errors), and with --json also {"error": {"code", "message"}} on
// stdout for machines. Returns `exit_code`.
#ifndef PTC_TOOLS_INTERNAL_CLI_H_
#define PTC_TOOLS_INTERNAL_CLI_H_

#include <string>

#include "absl/status/status.h"

namespace ptc::tools {

int Fail(const std::string& command, const absl::Status& status, int exit_code,
         bool json, const char* usage = nullptr);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_CLI_H_
