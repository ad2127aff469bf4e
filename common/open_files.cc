#include "common/open_files.h"

#include <sys/resource.h>

namespace ptc {

int64_t RaiseOpenFilesLimit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX
                                     : static_cast<int64_t>(r.rlim_cur);
}

}  // namespace ptc
