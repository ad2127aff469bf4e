// Status plumbing shared by every ptc component.
//
//   absl::StatusOr<Layout> BuildIt() {
//     PTC_RETURN_IF_ERROR(Check());
//     PTC_ASSIGN_OR_RETURN(Layout layout, BuildLayout(spec, config));
//     return layout;
//   }
#ifndef PTC_COMMON_STATUS_MACROS_H_
#define PTC_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PTC_STATUS_CONCAT_INNER_(a, b) a##b
#define PTC_STATUS_CONCAT_(a, b) PTC_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define PTC_RETURN_IF_ERROR(expr)              \
  do {                                         \
    const absl::Status ptc_status_ = (expr);   \
    if (!ptc_status_.ok()) return ptc_status_; \
  } while (0)

// Evaluates `rexpr` (a StatusOr); returns its status on error, otherwise
// moves the value into `lhs` (which may be a declaration).
#define PTC_ASSIGN_OR_RETURN(lhs, rexpr)                                       \
  PTC_ASSIGN_OR_RETURN_IMPL_(PTC_STATUS_CONCAT_(ptc_statusor_, __LINE__), lhs, \
                             rexpr)

#define PTC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()

namespace ptc {

// Returns `status` with `context` prepended to its message, keeping its code
// and payloads:
// "planning tensor 'x': region ... has no surviving copy".
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), std::string(context) + ": " +
                                            std::string(status.message()));
  // What the payloads say (busy, through a relay, ...) holds for the
  // annotated status too.
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& value) {
    annotated.SetPayload(url, value);
  });
  return annotated;
}

}  // namespace ptc

#endif  // PTC_COMMON_STATUS_MACROS_H_
