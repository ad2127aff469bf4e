#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ptc {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return Errno(absl::StrCat("creating ", tmp));
  size_t off = 0;
  while (off < contents.size()) {
    const ssize_t n = write(fd, contents.data() + off, contents.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const absl::Status s = Errno(absl::StrCat("writing ", tmp));
      close(fd);
      return s;
    }
    off += n;
  }
  if (fsync(fd) != 0) {
    const absl::Status s = Errno(absl::StrCat("fsync of ", tmp));
    close(fd);
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0)
    return Errno(absl::StrCat("renaming ", tmp));
  const std::string dir = path.substr(
      0,
      path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  const int dfd =
      open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> ReadFileIfExists(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (access(path.c_str(), F_OK) != 0) return std::optional<std::string>();
    return absl::PermissionDeniedError(absl::StrCat("cannot read ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return std::optional<std::string>(ss.str());
}

}  // namespace ptc
