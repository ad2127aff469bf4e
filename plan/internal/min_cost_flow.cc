#include "plan/internal/min_cost_flow.h"

#include <algorithm>
#include <deque>
#include <limits>

namespace ptc::plan_internal {

int MinCostFlow::AddEdge(int from, int to, int64_t capacity, int64_t cost) {
  const int id = static_cast<int>(edges_.size());
  edges_.push_back({to, capacity, 0, cost});
  edges_.push_back({from, 0, 0, -cost});
  adj_[from].push_back(id);
  adj_[to].push_back(id + 1);
  return id;
}

std::pair<int64_t, int64_t> MinCostFlow::Solve(int s, int t, int64_t want) {
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  const int n = static_cast<int>(adj_.size());
  int64_t sent = 0, total = 0;
  std::vector<int64_t> dist(n);
  std::vector<int> via(n);
  std::vector<char> queued(n);
  while (sent < want) {
    // Shortest path by queue-based Bellman-Ford: the residual graph has
    // negative reverse edges but no negative cycle (flows are cheapest).
    std::fill(dist.begin(), dist.end(), kInf);
    std::fill(via.begin(), via.end(), -1);
    std::deque<int> queue{s};
    dist[s] = 0;
    queued[s] = 1;
    while (!queue.empty()) {
      const int v = queue.front();
      queue.pop_front();
      queued[v] = 0;
      for (int id : adj_[v]) {
        const Edge& e = edges_[id];
        if (e.cap - e.flow <= 0 || dist[v] + e.cost >= dist[e.to]) continue;
        dist[e.to] = dist[v] + e.cost;
        via[e.to] = id;
        if (!queued[e.to]) {
          queued[e.to] = 1;
          queue.push_back(e.to);
        }
      }
    }
    if (dist[t] == kInf) break;
    int64_t push = want - sent;
    for (int v = t; v != s; v = edges_[via[v] ^ 1].to) {
      const Edge& e = edges_[via[v]];
      push = std::min(push, e.cap - e.flow);
    }
    for (int v = t; v != s; v = edges_[via[v] ^ 1].to) {
      edges_[via[v]].flow += push;
      edges_[via[v] ^ 1].flow -= push;
    }
    sent += push;
    total += push * dist[t];
  }
  return {sent, total};
}

}  // namespace ptc::plan_internal
