// An in-process ptc cluster for client tests: a coordinator on
// localhost:0 and daemons named host0, host1, ... that register with it
// through the same agent ptcd uses.
#ifndef PTC_CLIENT_INTERNAL_TESTING_H_
#define PTC_CLIENT_INTERNAL_TESTING_H_

#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator_server.h"
#include "ptcd/coordinator_agent.h"
#include "tests/testing.h"

namespace ptc::testing {

struct ClientCluster {
  ClientCluster(int hosts, int gpus_per_host);
  // Registers `job` (model, config) on `hosts` (names); REQUIREs success.
  void RegisterJob(const std::string& job, const std::string& model,
                   const std::string& config,
                   const std::vector<std::string>& hosts);
  // Forgets `job` (its GPUs become free for the next); REQUIREs success.
  void ForgetJob(const std::string& job);
  // Reconfigures `job` to `config` on `hosts`; returns the status.
  absl::Status Reconfigure(const std::string& job, const std::string& config,
                           const std::vector<std::string>& hosts);

  TempDir dir;
  DaemonCluster daemons;
  std::unique_ptr<CoordinatorServer> coordinator;
  std::string address;
  std::vector<std::unique_ptr<CoordinatorAgent>> agents;
};

}  // namespace ptc::testing

#endif  // PTC_CLIENT_INTERNAL_TESTING_H_
