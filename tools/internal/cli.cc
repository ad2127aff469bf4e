#include "tools/internal/cli.h"

#include "common/channel.h"

#include <iostream>

#include "absl/strings/cord.h"
#include "common/json_writer.h"

namespace ptc::tools {

namespace {
constexpr char kReported[] = "ptc.tools/reported-in-json";
}  // namespace

absl::Status ReportedInJson(absl::Status status) {
  status.SetPayload(kReported, absl::Cord("1"));
  return status;
}

int Fail(const std::string& command, const absl::Status& status, int exit_code,
         bool json, const char* usage) {
  if (json && !status.GetPayload(kReported).has_value()) {
    JsonWriter w;
    w.BeginObject().Key("error").BeginObject();
    w.Key("code").String(absl::StatusCodeToString(status.code()));
    w.Key("message").String(status.message()).EndObject().EndObject();
    std::cout << w.str() << "\n";
  }
  std::cerr << command << ": " << status.message() << "\n";
  if (exit_code == 2 && usage != nullptr) std::cerr << "\n" << usage;
  return exit_code;
}

std::vector<std::string> WithSecurityOptions(std::vector<std::string> values) {
  values.insert(values.end(), {"tls-ca", "tls-cert", "tls-key"});
  return values;
}

absl::Status ConfigureCommandSecurity(const Args& args) {
  return ConfigureProcessSecurity({args.Get("tls-ca"), args.Get("tls-cert"),
                                   args.Get("tls-key"),
                                   args.Flag(kSecurityFlag)},
                                  "ptcctl");
}

}  // namespace ptc::tools
