// ptcctl: the administrator's and scheduler's command line for ptc.
#include <cstring>
#include <iostream>

#include "tools/ptcctl/plan_command.h"
#include "tools/ptcctl/store_command.h"

namespace {

constexpr char kUsage[] = R"(usage: ptcctl COMMAND [options]

commands:
  plan     preview how a job's state would move for a change of parallelism
  store    what a ptcd holds: store ls | stat | stats --host ADDR

Run "ptcctl COMMAND --help" for a command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "help")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "plan"))
    return ptc::tools::RunPlanCommand(argc, argv);
  if (!std::strcmp(argv[1], "store"))
    return ptc::tools::RunStoreCommand(argc, argv);
  std::cerr << "ptcctl: unknown command '" << argv[1] << "'\n\n" << kUsage;
  return 2;
}
