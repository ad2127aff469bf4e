#include "plan/internal/max_flow.h"

#include <algorithm>
#include <limits>
#include <queue>

namespace ptc::plan_internal {

int MaxFlow::AddEdge(int from, int to, int64_t capacity) {
  const int id = static_cast<int>(edges_.size());
  edges_.push_back({to, capacity, 0});
  edges_.push_back({from, 0, 0});
  adj_[from].push_back(id);
  adj_[to].push_back(id + 1);
  return id;
}

void MaxFlow::Reset() {
  for (Edge& e : edges_) e.flow = 0;
  total_ = 0;
}

bool MaxFlow::Bfs(int s, int t) {
  level_.assign(adj_.size(), -1);
  std::queue<int> q;
  level_[s] = 0;
  q.push(s);
  while (!q.empty()) {
    const int v = q.front();
    q.pop();
    for (int id : adj_[v]) {
      const Edge& e = edges_[id];
      if (level_[e.to] < 0 && e.flow < e.cap) {
        level_[e.to] = level_[v] + 1;
        q.push(e.to);
      }
    }
  }
  return level_[t] >= 0;
}

int64_t MaxFlow::Dfs(int v, int t, int64_t pushed) {
  if (v == t || pushed == 0) return pushed;
  for (int& i = next_[v]; i < static_cast<int>(adj_[v].size()); ++i) {
    const int id = adj_[v][i];
    Edge& e = edges_[id];
    if (level_[e.to] != level_[v] + 1 || e.flow >= e.cap) continue;
    const int64_t got = Dfs(e.to, t, std::min(pushed, e.cap - e.flow));
    if (got > 0) {
      e.flow += got;
      edges_[id ^ 1].flow -= got;
      return got;
    }
  }
  return 0;
}

int64_t MaxFlow::Solve(int s, int t) {
  while (Bfs(s, t)) {
    next_.assign(adj_.size(), 0);
    while (int64_t f = Dfs(s, t, std::numeric_limits<int64_t>::max())) {
      total_ += f;
    }
  }
  return total_;
}

}  // namespace ptc::plan_internal
