#include "common/args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ptc {

absl::StatusOr<Args> Args::Parse(int argc, const char* const* argv, int first,
                                 const std::vector<std::string>& value_options,
                                 const std::vector<std::string>& flags) {
  Args args;
  auto known = [](const std::vector<std::string>& list,
                  const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      args.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (known(flags, name) && !inline_value) {
      args.flags_[name] = true;
      continue;
    }
    if (!known(value_options, name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option --", name));
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("option --", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[name] = value;
  }
  return args;
}

std::string Args::Get(const std::string& name,
                      const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<std::string> Args::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing required option --", name));
  }
  return it->second;
}

}  // namespace ptc
