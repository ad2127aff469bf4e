// ptcctl commands that talk to ptc-coordinator: register, reconfigure,
// hosts, jobs, status, abort.
#ifndef PTC_TOOLS_PTCCTL_CLUSTER_COMMAND_H_
#define PTC_TOOLS_PTCCTL_CLUSTER_COMMAND_H_

namespace ptc::tools {

extern const char kClusterUsage[];

// True if argv[1] is one of this file's commands.
bool IsClusterCommand(const char* command);
// Exit code: 0 success, 1 failure (also an aborted reconfiguration), 2 usage.
int RunClusterCommand(int argc, const char* const* argv);
// ptcctl run ... -- COMMAND: replaces this process with ptc's agent for
// every host of this machine; returns only on failure.
int RunRunCommand(int argc, const char* const* argv);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_PTCCTL_CLUSTER_COMMAND_H_
