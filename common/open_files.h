// The limit on a process's open files. A coordinator holds a connection
// per host and per training process (16,384 processes need more than the
// 1,024 most systems allow by default); a ptcd one per peer and local
// process. Each daemon raises its own soft limit to the hard one at start.
//
//   const int64_t files = RaiseOpenFilesLimit();
#ifndef PTC_COMMON_OPEN_FILES_H_
#define PTC_COMMON_OPEN_FILES_H_

#include <cstdint>

namespace ptc {

// Raises the soft limit on open files to the hard limit; returns the
// limit in force after (-1 if it cannot be read).
int64_t RaiseOpenFilesLimit();

}  // namespace ptc

#endif  // PTC_COMMON_OPEN_FILES_H_
