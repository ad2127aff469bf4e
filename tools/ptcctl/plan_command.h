// `ptcctl plan`: previews how a job's state would move for a change of
// parallelism and hosts, without touching any host.
#ifndef PTC_TOOLS_PTCCTL_PLAN_COMMAND_H_
#define PTC_TOOLS_PTCCTL_PLAN_COMMAND_H_

namespace ptc::tools {

extern const char kPlanUsage[];

// Returns the process exit code: 0 on success, 1 on a planning error,
// 2 on a usage error.
int RunPlanCommand(int argc, const char* const* argv);

}  // namespace ptc::tools

#endif  // PTC_TOOLS_PTCCTL_PLAN_COMMAND_H_
