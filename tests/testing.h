// Shared pieces of the integration tests: four in-process ptcd daemons
// (store + transformer) on localhost:0, and saving / verifying a job's
// synthetic state rank by rank.
#ifndef PTC_TESTS_TESTING_H_
#define PTC_TESTS_TESTING_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/plan_scenario.h"
#include "proto/coordinator.pb.h"
#include "tensor_store/internal/testing.h"

namespace ptc::testing {

struct DaemonCluster {
  // `spare_pool`: each daemon's --spare-pool bytes.
  explicit DaemonCluster(int hosts, int64_t spare_pool = 0);
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::map<int32_t, std::string> addresses;
};

// Coordinator metadata that knows the cluster's daemons as live hosts
// "host0", "host1", ... with `gpus` GPUs each (no jobs yet).
proto::CoordinatorState KnownHosts(const DaemonCluster& c, int gpus);

// (small object name, rank) -> the bytes that rank holds.
using SmallObjects = std::map<std::pair<std::string, int>, std::string>;

// Saves every source rank's regions of `s` into its host's daemon as
// `version` (regions shared by ranks of a host once), and every rank's
// small objects, and commits it. Returns the small objects saved.
SmallObjects SaveSource(DaemonCluster& c, const std::string& job,
                        const PlanScenario& s, int64_t version);
// Reads every target rank's regions of `s` from its host and checks every
// byte; with `small`, also that every target rank holds exactly those
// small objects.
void VerifyTarget(DaemonCluster& c, const std::string& job,
                  const PlanScenario& s, int64_t version,
                  const SmallObjects* small = nullptr);
// The small objects the target ranks hold after `plan` ran on `before`
// into `target_version` of `job` (derived ones: their derived seed).
SmallObjects AfterPlan(const std::string& job, const SmallObjects& before,
                       const Plan& plan, int64_t target_version);

}  // namespace ptc::testing

#endif  // PTC_TESTS_TESTING_H_
