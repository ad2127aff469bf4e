#include "tools/internal/layout_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ptc/families.h"
#include "ptc/layout_spec_proto.h"

namespace ptc::tools {

absl::StatusOr<ModelSpec> ReadLayoutFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the layout spec ", path));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size > (std::streamoff{256} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout spec ", path, " is over 256 MiB"));
  }
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  auto spec = SpecFromJson(text.str());
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
}

absl::StatusOr<ModelSpec> SpecFromOptions(const std::string& layout_path,
                                          const std::string& model) {
  if (layout_path.empty() == model.empty()) {
    return absl::InvalidArgumentError(
        "missing required option: give --layout FILE or --model NAME (one "
        "of them)");
  }
  if (!layout_path.empty()) return ReadLayoutFile(layout_path);
  return SpecForModel(model);
}

}  // namespace ptc::tools
