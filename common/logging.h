// Named spdlog loggers, one per component ("tensor_store", "coordinator",
// "transformer", "client", "rpc"); levels from SPDLOG_LEVEL (e.g.
// SPDLOG_LEVEL=debug or SPDLOG_LEVEL=info,tensor_store=trace) or SetLogLevel.
//
//   Log("tensor_store")->info("job {} version {} committed", job, v);
#ifndef PTC_COMMON_LOGGING_H_
#define PTC_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace ptc {

// The logger named `component`, created on first use (stderr, colored).
std::shared_ptr<spdlog::logger> Log(const std::string& component);

// Sets every logger's level: "trace", "debug", "info", "warn", "error",
// "critical" or "off". INVALID_ARGUMENT for anything else.
absl::Status SetLogLevel(const std::string& level);

}  // namespace ptc

#endif  // PTC_COMMON_LOGGING_H_
