// `ptcctl store ls|stat|stats --host ADDR`: what a ptcd holds.
#ifndef PTC_TOOLS_PTCCTL_STORE_COMMAND_H_
#define PTC_TOOLS_PTCCTL_STORE_COMMAND_H_

namespace ptc::tools {

extern const char kStoreUsage[];

// Returns the exit code: 0 success, 1 error from the daemon, 2 usage.
int RunStoreCommand(int argc, const char* const* argv);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_PTCCTL_STORE_COMMAND_H_
