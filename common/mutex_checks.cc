#include "common/mutex_checks.h"

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace ptc {

bool ConfigureMutexChecks() {
  const char* env = std::getenv("PTC_MUTEX_CHECKS");
  const bool on = env != nullptr && std::strcmp(env, "1") == 0;
  absl::SetMutexDeadlockDetectionMode(on ? absl::OnDeadlockCycle::kAbort
                                         : absl::OnDeadlockCycle::kIgnore);
  return on;
}

}  // namespace ptc
