// Command-line options for ptc's binaries: "--name value", "--name=value" and
// boolean "--flag"; anything else is positional. Unknown options are an
// error that names them.
//
//   PTC_ASSIGN_OR_RETURN(Args args, Args::Parse(argc, argv, 2, {"model"},
//   {"json"})); std::string model = args.Get("model"); bool json =
//   args.Flag("json");
#ifndef PTC_COMMON_ARGS_H_
#define PTC_COMMON_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ptc {

class Args {
 public:
  static absl::StatusOr<Args> Parse(
      int argc, const char* const* argv, int first,
      const std::vector<std::string>& value_options,
      const std::vector<std::string>& flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name,
                  const std::string& fallback = "") const;
  bool Flag(const std::string& name) const { return flags_.count(name) > 0; }
  // INVALID_ARGUMENT naming the option if it is missing.
  absl::StatusOr<std::string> Required(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_;
  std::vector<std::string> positional_;
};

}  // namespace ptc

#endif  // PTC_COMMON_ARGS_H_
