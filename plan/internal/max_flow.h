// Dinic's maximum flow on small graphs with int64 capacities. The planner's
// balancing network has one node per class of pieces (pieces with the same
// set of possible senders) and one per host, so it stays small even for
// thousands of GPUs.
//
//   MaxFlow f(4);
//   int e = f.AddEdge(0, 1, 10);
//   int64_t total = f.Solve(0, 3);
//   int64_t on_e = f.Flow(e);
#ifndef PTC_PLAN_INTERNAL_MAX_FLOW_H_
#define PTC_PLAN_INTERNAL_MAX_FLOW_H_

#include <cstdint>
#include <vector>

namespace ptc::plan_internal {

class MaxFlow {
 public:
  explicit MaxFlow(int num_nodes) : adj_(num_nodes) {}

  // Adds an edge and returns its id.
  int AddEdge(int from, int to, int64_t capacity);
  // Changes an edge's capacity; call Reset() before solving again.
  void SetCapacity(int edge, int64_t capacity) { edges_[edge].cap = capacity; }
  // Clears all flow.
  void Reset();
  // Pushes as much flow as possible from s to t (on top of existing flow)
  // and returns the total flow out of s.
  int64_t Solve(int s, int t);
  int64_t Flow(int edge) const { return edges_[edge].flow; }

 private:
  struct Edge {
    int to;
    int64_t cap;
    int64_t flow;
  };
  bool Bfs(int s, int t);
  int64_t Dfs(int v, int t, int64_t pushed);

  std::vector<Edge> edges_;  // edge i and its reverse i ^ 1
  std::vector<std::vector<int>> adj_;
  std::vector<int> level_, next_;
  int64_t total_ = 0;
};

}  // namespace ptc::plan_internal

#endif  // PTC_PLAN_INTERNAL_MAX_FLOW_H_
