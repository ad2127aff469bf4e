// `ptcctl layout`: validate a layout spec against a parallel config with
// no cluster (check), and show how it cuts every tensor and what every
// rank holds (show).
#ifndef PTC_TOOLS_PTCCTL_LAYOUT_COMMAND_H_
#define PTC_TOOLS_PTCCTL_LAYOUT_COMMAND_H_

namespace ptc::tools {

// Returns the process exit code: 0 on success, 1 if the spec or config is
// refused, 2 on a usage error.
int RunLayoutCommand(int argc, const char* const* argv);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_PTCCTL_LAYOUT_COMMAND_H_
