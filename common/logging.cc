#include "common/logging.h"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace ptc {

std::shared_ptr<spdlog::logger> Log(const std::string& component) {
  static std::once_flag env_once;
  std::call_once(env_once, [] { spdlog::cfg::load_env_levels(); });
  std::shared_ptr<spdlog::logger> logger = spdlog::get(component);
  if (logger) return logger;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  logger = spdlog::get(component);
  if (logger) return logger;
  logger = spdlog::stderr_color_mt(component);
  // Loggers created after SPDLOG_LEVEL was read take the default level it
  // set, unless it named this component.
  spdlog::cfg::load_env_levels();
  return logger;
}

bool LogAllowed(absl::string_view key, int64_t* suppressed, int per_second,
                absl::Time now) {
  struct Window {
    absl::Time start = absl::InfinitePast();
    int logged = 0;
    int64_t held = 0;
  };
  static std::mutex mu;
  static auto* windows = new std::map<std::string, Window, std::less<>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = windows->find(key);
  if (it == windows->end()) it = windows->emplace(std::string(key), Window()).first;
  Window& w = it->second;
  if (now - w.start >= absl::Seconds(1)) {
    w.start = now;
    w.logged = 0;
  }
  if (w.logged >= per_second) {
    ++w.held;
    return false;
  }
  ++w.logged;
  *suppressed = w.held;
  w.held = 0;
  return true;
}

std::string SuppressedNote(int64_t suppressed) {
  if (suppressed <= 0) return "";
  return absl::StrCat(" (", suppressed, " more like it not logged)");
}

absl::Status SetLogLevel(const std::string& level) {
  const spdlog::level::level_enum l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", level,
        "'; expected trace, debug, info, warn, error, critical or off"));
  }
  spdlog::set_level(l);
  return absl::OkStatus();
}

}  // namespace ptc
