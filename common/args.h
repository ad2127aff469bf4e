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

// Parses a byte count: "1073741824", "8GiB", "512MiB", "64KiB", "2TiB", or
// decimal "8GB", "500MB", "10kB". INVALID_ARGUMENT names the text.
absl::StatusOr<int64_t> ParseBytes(const std::string& text);

// Reads a config file of "key = value" lines; '#' starts a comment. Keys
// are returned as written. INVALID_ARGUMENT names the file and line of a
// malformed line; NOT_FOUND if the file cannot be read.
absl::StatusOr<std::map<std::string, std::string>> ReadConfigFile(
    const std::string& path);

// A daemon's options from its flags and its --config file: the file holds
// "key = value" lines whose key is an option's name with '_' for '-'
// (memory_limit for --memory-limit); a flag wins over the file. Boolean
// options are "true" or "false" in the file.
//
//   PTC_ASSIGN_OR_RETURN(Settings settings, Settings::Load(args, kOptions,
//                                                          kFlags));
//   std::string listen = settings.Get("listen", "127.0.0.1:7070");
//   PTC_ASSIGN_OR_RETURN(bool insecure, settings.Flag("insecure"));
class Settings {
 public:
  // Reads --config if `args` has it; a key that names none of
  // `value_options` and `flags` is INVALID_ARGUMENT naming file and key.
  static absl::StatusOr<Settings> Load(
      const Args& args, const std::vector<std::string>& value_options,
      const std::vector<std::string>& flags);

  bool Has(const std::string& name) const;
  std::string Get(const std::string& name,
                  const std::string& fallback = "") const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  // The flag, else the file's "true" or "false" (anything else is
  // INVALID_ARGUMENT), else false.
  absl::StatusOr<bool> Flag(const std::string& name) const;

 private:
  static std::string Key(const std::string& name);

  Args args_;
  std::string path_;
  std::map<std::string, std::string> file_;
};

}  // namespace ptc

#endif  // PTC_COMMON_ARGS_H_
