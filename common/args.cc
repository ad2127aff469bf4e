#include "common/args.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

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

absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"KiB", 1024.0},       {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"kB", 1e3},           {"KB", 1e3},
      {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},          {"B", 1.0}};
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double scale = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      scale = factor;
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &value) ||
      value < 0 || !std::isfinite(value * scale) || value * scale > 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text,
        "' is not a byte count; write e.g. 8GiB, 512MiB or 1000000"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::StatusOr<std::map<std::string, std::string>> ReadConfigFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::map<std::string, std::string> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view l = line;
    l = l.substr(0, l.find('#'));
    l = absl::StripAsciiWhitespace(l);
    if (l.empty()) continue;
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected 'key = value', got '", l, "'"));
    }
    out[std::string(absl::StripAsciiWhitespace(l.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(l.substr(eq + 1)));
  }
  return out;
}

absl::StatusOr<Settings> Settings::Load(
    const Args& args, const std::vector<std::string>& value_options,
    const std::vector<std::string>& flags) {
  Settings s;
  s.args_ = args;
  if (!args.Has("config")) return s;
  s.path_ = args.Get("config");
  PTC_ASSIGN_OR_RETURN(s.file_, ReadConfigFile(s.path_));
  for (const auto& [key, value] : s.file_) {
    auto known = [&](const std::vector<std::string>& names) {
      return std::any_of(names.begin(), names.end(), [&](const auto& n) {
        return n != "config" && Key(n) == key;
      });
    };
    if (!known(value_options) && !known(flags)) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.path_, ": unknown key '", key, "'"));
    }
  }
  return s;
}

std::string Settings::Key(const std::string& name) {
  return absl::StrReplaceAll(name, {{"-", "_"}});
}

bool Settings::Has(const std::string& name) const {
  return args_.Has(name) || file_.count(Key(name)) > 0;
}

std::string Settings::Get(const std::string& name,
                          const std::string& fallback) const {
  if (args_.Has(name)) return args_.Get(name);
  auto it = file_.find(Key(name));
  return it != file_.end() ? it->second : fallback;
}

absl::StatusOr<std::string> Settings::Required(const std::string& name) const {
  if (!Has(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " is required (or ", Key(name), " in the config file)"));
  }
  return Get(name);
}

absl::StatusOr<bool> Settings::Flag(const std::string& name) const {
  if (args_.Flag(name)) return true;
  auto it = file_.find(Key(name));
  if (it == file_.end() || it->second == "false") return false;
  if (it->second == "true") return true;
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ": ", Key(name), " must be 'true' or 'false', not '",
                   it->second, "'"));
}

}  // namespace ptc
