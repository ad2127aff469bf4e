#include "tools/internal/format.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace ptc::tools {

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrFormat("%.0f B", bytes);
  return absl::StrFormat("%.2f %s", bytes, kUnits[u]);
}

std::string HumanSeconds(double s) {
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.1f ms", s * 1e3);
  if (s < 120) return absl::StrFormat("%.2f s", s);
  return absl::StrFormat("%dm%02ds", static_cast<int>(s) / 60,
                         static_cast<int>(s) % 60);
}

std::string PercentOver(double value, double base) {
  if (base == 0) return value == 0 ? "+0.0%" : "n/a";
  return absl::StrFormat("%+.1f%%", 100.0 * (value - base) / base);
}

}  // namespace ptc::tools
