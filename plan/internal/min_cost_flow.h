// Minimum-cost flow by successive shortest paths (Bellman-Ford on the
// residual graph), for the small class graphs of the placement: one node
// per class of equal blocks and one per class of equal hosts.
//
//   MinCostFlow f(4);
//   int e = f.AddEdge(0, 1, /*capacity=*/3, /*cost=*/5);
//   auto [flow, cost] = f.Solve(0, 3, /*want=*/3);
//   int64_t on_e = f.Flow(e);
#ifndef PTC_PLAN_INTERNAL_MIN_COST_FLOW_H_
#define PTC_PLAN_INTERNAL_MIN_COST_FLOW_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace ptc::plan_internal {

class MinCostFlow {
 public:
  explicit MinCostFlow(int num_nodes) : adj_(num_nodes) {}

  // Adds an edge (cost >= 0) and returns its id.
  int AddEdge(int from, int to, int64_t capacity, int64_t cost);
  // Sends up to `want` units from s to t, each along a cheapest path;
  // returns (units sent, their total cost).
  std::pair<int64_t, int64_t> Solve(int s, int t, int64_t want);
  int64_t Flow(int edge) const { return edges_[edge].flow; }

 private:
  struct Edge {
    int to;
    int64_t cap, flow, cost;
  };
  std::vector<Edge> edges_;  // edge i and its reverse i ^ 1
  std::vector<std::vector<int>> adj_;
};

}  // namespace ptc::plan_internal

#endif  // PTC_PLAN_INTERNAL_MIN_COST_FLOW_H_
