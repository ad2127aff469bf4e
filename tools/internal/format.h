// Numbers for people: bytes in binary units, durations, ratios.
//
//   HumanBytes(3 << 30) == "3.00 GiB";  HumanSeconds(0.0123) == "12.3 ms"
#ifndef PTC_TOOLS_INTERNAL_FORMAT_H_
#define PTC_TOOLS_INTERNAL_FORMAT_H_

#include <cstdint>
#include <string>

namespace ptc::tools {

std::string HumanBytes(double bytes);
std::string HumanSeconds(double seconds);
// "+1.2%" over `base`; "n/a" if base is 0 and value is not.
std::string PercentOver(double value, double base);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_FORMAT_H_
