// ptcctl: the administrator's and scheduler's command line for ptc.
#include <cstring>
#include <iostream>

#include "common/crash.h"
#include "tools/ptcctl/cluster_command.h"
#include "tools/ptcctl/layout_command.h"
#include "tools/ptcctl/plan_command.h"
#include "tools/ptcctl/store_command.h"

namespace {

constexpr char kUsage[] = R"(usage: ptcctl COMMAND [options]

commands:
  plan         preview how a job's state would move for a change of parallelism
  layout       check a layout spec file, or show what every rank holds
  store        what a ptcd holds: store ls | stat | stats --host ADDR
  register     register a job with the coordinator
  reconfigure  change a job's parallelism and hosts, with progress and a report
  prepare      have the hosts of a coming change prepare the memory it will stage
  hosts        the cluster's hosts and their liveness; add or drain hosts
  jobs         the jobs, their committed versions and reconfigurations
  status J     one job
  ranks        the ranks a host's launcher starts for a job, and their GPUs
  abort J      abort a job's reconfiguration in flight
  forget J     remove a job that has ended, and its state on every host
  token J      the token a job's processes show to act on it (PTC_JOB_TOKEN)
  snapshot     write a job's committed version to disk (or set a policy)
  restore      load a job's newest snapshot into the cluster
  export       write a snapshot's full tensors to one safetensors file
  advise       the configs the advisor considers for a job, and its choice
  auto J       a job's automatic changes: on|off, live, pinned config, ...
  run          run a job's processes on this machine (the agent per local ptcd)

Run "ptcctl COMMAND --help" for a command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  ptc::InstallCrashHandler(argv[0]);
  if (argc < 2 || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "help")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "plan"))
    return ptc::tools::RunPlanCommand(argc, argv);
  if (!std::strcmp(argv[1], "layout"))
    return ptc::tools::RunLayoutCommand(argc, argv);
  if (!std::strcmp(argv[1], "store"))
    return ptc::tools::RunStoreCommand(argc, argv);
  if (!std::strcmp(argv[1], "run"))
    return ptc::tools::RunRunCommand(argc, argv);
  if (ptc::tools::IsClusterCommand(argv[1]))
    return ptc::tools::RunClusterCommand(argc, argv);
  std::cerr << "ptcctl: unknown command '" << argv[1] << "'\n\n" << kUsage;
  return 2;
}
