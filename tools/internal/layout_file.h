// The spec a ptcctl command works on: --layout FILE (a JSON layout spec)
// or --model NAME (a built-in model's generated spec).
#ifndef PTC_TOOLS_INTERNAL_LAYOUT_FILE_H_
#define PTC_TOOLS_INTERNAL_LAYOUT_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "ptc/model_spec.h"

namespace ptc::tools {

// Reads a JSON layout spec; at most 256 MiB. Errors name the file.
absl::StatusOr<ModelSpec> ReadLayoutFile(const std::string& path);

// The spec of --layout FILE or --model NAME, whichever is given (exactly
// one must be).
absl::StatusOr<ModelSpec> SpecFromOptions(const std::string& layout_path,
                                          const std::string& model);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_INTERNAL_LAYOUT_FILE_H_
