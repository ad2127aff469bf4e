// Atomic file replacement: write a temporary file, fsync it, rename it over
// the target and fsync the directory, so that after a crash the file holds
// either the old or the new contents, never a mix.
//
//   PTC_RETURN_IF_ERROR(WriteFileAtomically(dir + "/state.pb", bytes));
//   PTC_ASSIGN_OR_RETURN(std::optional<std::string> bytes,
//   ReadFileIfExists(path));
#ifndef PTC_COMMON_ATOMIC_FILE_H_
#define PTC_COMMON_ATOMIC_FILE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ptc {

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);
// nullopt if the file does not exist.
absl::StatusOr<std::optional<std::string>> ReadFileIfExists(
    const std::string& path);

}  // namespace ptc

#endif  // PTC_COMMON_ATOMIC_FILE_H_
