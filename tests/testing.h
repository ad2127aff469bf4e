// Shared pieces of the integration tests: four in-process ptcd daemons
// (store + transformer) on localhost:0, and saving / verifying a job's
// synthetic state rank by rank.
#ifndef PTC_TESTS_TESTING_H_
#define PTC_TESTS_TESTING_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/plan_scenario.h"
#include "tensor_store/internal/testing.h"

namespace ptc::testing {

struct DaemonCluster {
  explicit DaemonCluster(int hosts);
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::map<int32_t, std::string> addresses;
};

// Saves every source rank's regions of `s` into its host's daemon as
// `version` (regions shared by ranks of a host once) and commits it.
void SaveSource(DaemonCluster& c, const std::string& job, const PlanScenario& s,
                int64_t version);
// Reads every target rank's regions of `s` from its host and checks every byte.
void VerifyTarget(DaemonCluster& c, const std::string& job,
                  const PlanScenario& s, int64_t version);

}  // namespace ptc::testing

#endif  // PTC_TESTS_TESTING_H_
