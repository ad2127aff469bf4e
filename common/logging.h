// Named spdlog loggers, one per component ("tensor_store", "coordinator",
// "transformer", "client", "rpc"); levels from SPDLOG_LEVEL (e.g.
// SPDLOG_LEVEL=debug or SPDLOG_LEVEL=info,tensor_store=trace) or SetLogLevel.
//
//   Log("tensor_store")->info("job {} version {} committed", job, v);
#ifndef PTC_COMMON_LOGGING_H_
#define PTC_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ptc {

// The logger named `component`, created on first use (stderr, colored).
std::shared_ptr<spdlog::logger> Log(const std::string& component);

// Sets every logger's level: "trace", "debug", "info", "warn", "error",
// "critical" or "off". INVALID_ARGUMENT for anything else.
absl::Status SetLogLevel(const std::string& level);

// Whether a message of kind `key` may be logged now: at most `per_second`
// in each second, per key, so that a caller flooding refused calls cannot
// flood the log. `*suppressed` gets how many of this kind were held back
// since the last one allowed (say so in the message: SuppressedNote).
// Keys must come from a small set (an RPC's name), never from a request.
bool LogAllowed(absl::string_view key, int64_t* suppressed,
                int per_second = 10, absl::Time now = absl::Now());

// "" or " (N more like it not logged)".
std::string SuppressedNote(int64_t suppressed);

}  // namespace ptc

#endif  // PTC_COMMON_LOGGING_H_
