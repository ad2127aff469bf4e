#include "plan/placement.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "plan/internal/grid.h"
#include "plan/internal/max_flow.h"
#include "plan/internal/min_cost_flow.h"
#include "plan/planner.h"

namespace ptc {
namespace {

using plan_internal::Grid;
using plan_internal::MaxFlow;
using plan_internal::MinCostFlow;

// Distinct (tensor, region) pairs of one layout, sorted: what a block
// needs or a host holds. Each is packed as tensor << 32 | the region's
// index among the layout's distinct regions of that tensor.
struct Regions {
  const Layout* layout = nullptr;
  std::vector<uint64_t> keys;

  static int32_t Tensor(uint64_t k) { return static_cast<int32_t>(k >> 32); }
  const Region& region(uint64_t k) const {
    return layout->regions(Tensor(k))[static_cast<int32_t>(k & 0xffffffffu)];
  }
};

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 29);
}

uint64_t Signature(const Regions& regions) {
  uint64_t h = regions.keys.size();
  for (uint64_t k : regions.keys) {
    const Region& r = regions.region(k);
    h = Mix(h, static_cast<uint64_t>(Regions::Tensor(k)));
    for (int d = 0; d < r.rank(); ++d) {
      h = Mix(h, static_cast<uint64_t>(r.dim(d).begin));
      h = Mix(h, static_cast<uint64_t>(r.dim(d).end));
    }
  }
  return h;
}

// The distinct regions of `layout` per group, where group_of(rank) < 0
// leaves a rank out.
template <typename GroupOf>
std::vector<Regions> GroupRegions(const Layout& layout, int groups,
                                  GroupOf group_of) {
  std::vector<Regions> out(groups);
  for (Regions& r : out) r.layout = &layout;
  std::vector<int> group(layout.world_size());
  for (int r = 0; r < layout.world_size(); ++r) group[r] = group_of(r);
  for (int t = 0; t < layout.num_tensors(); ++t) {
    const std::vector<Shard>& shards = layout.shards(t);
    const std::vector<int32_t>& ids = layout.region_ids(t);
    for (size_t i = 0; i < shards.size(); ++i) {
      const int g = group[shards[i].rank];
      if (g < 0 || shards[i].region.empty()) continue;
      const uint64_t key = (static_cast<uint64_t>(t) << 32) | static_cast<uint32_t>(ids[i]);
      // Shards come by tensor, so a repeat of the group's last key is the
      // common duplicate (the ranks of one host holding one region).
      std::vector<uint64_t>& keys = out[g].keys;
      if (keys.empty() || keys.back() != key) keys.push_back(key);
    }
  }
  for (Regions& r : out) {
    std::sort(r.keys.begin(), r.keys.end());
    r.keys.erase(std::unique(r.keys.begin(), r.keys.end()), r.keys.end());
  }
  return out;
}

// Per group: whether another group holds every region it holds (the
// group's loss leaves a copy of everything). Regions are compared as the
// layout's distinct regions: within one layout, copies are equal regions.
std::vector<bool> SurvivingGroups(const Layout& layout,
                                  const std::vector<Regions>& groups) {
  std::vector<std::vector<int32_t>> holders(layout.num_tensors());
  for (int t = 0; t < layout.num_tensors(); ++t)
    holders[t].assign(layout.regions(t).size(), 0);
  for (const Regions& g : groups)
    for (uint64_t k : g.keys)
      ++holders[Regions::Tensor(k)][static_cast<int32_t>(k & 0xffffffffu)];
  std::vector<bool> out;
  out.reserve(groups.size());
  for (const Regions& g : groups) {
    out.push_back(std::all_of(g.keys.begin(), g.keys.end(), [&](uint64_t k) {
      return holders[Regions::Tensor(k)][static_cast<int32_t>(k & 0xffffffffu)] >= 2;
    }));
  }
  return out;
}

// How recoverable a placement is: of the hosts it uses, how many can be
// lost with a copy of everything left on the others. More of them, as a
// share of the hosts used, is better: all of them survives any one host's
// loss; a layout without replicas survives none wherever it is placed (so
// movement decides), and packing it onto fewer hosts is no better.
struct Recoverability {
  int survivable = 0;
  int used = 1;
  static Recoverability Of(const Layout& layout,
                           const std::vector<Regions>& hosts) {
    const std::vector<bool> ok = SurvivingGroups(layout, hosts);
    Recoverability r;
    r.used = std::max<int>(1, static_cast<int>(hosts.size()));
    r.survivable =
        hosts.size() > 1
            ? static_cast<int>(std::count(ok.begin(), ok.end(), true))
            : 0;
    return r;
  }
  bool Beats(const Recoverability& o) const {
    return int64_t{survivable} * o.used > int64_t{o.survivable} * used;
  }
  bool operator==(const Recoverability& o) const {
    return int64_t{survivable} * o.used == int64_t{o.survivable} * used;
  }
};

// `items` reordered to take turns by domain: the first of each domain (in
// the order domains first appear), then the second of each, ...; the order
// within a domain is kept. Unchanged when no item has a domain.
template <typename DomainOf>
std::vector<int> InterleaveByDomain(const std::vector<int>& items,
                                    DomainOf domain_of) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_domain;
  bool any = false;
  for (int i : items) {
    const std::string& d = domain_of(i);
    any |= !d.empty();
    auto [it, fresh] = by_domain.try_emplace(d);
    if (fresh) order.push_back(d);
    it->second.push_back(i);
  }
  if (!any) return items;
  std::vector<int> out;
  out.reserve(items.size());
  for (size_t round = 0; out.size() < items.size(); ++round) {
    for (const std::string& d : order) {
      const std::vector<int>& v = by_domain[d];
      if (round < v.size()) out.push_back(v[round]);
    }
  }
  return out;
}

// Per class of items (a block class), how many of its items each failure
// domain holds (a host's domain path and each of its prefixes), and the
// choice of a host for the next: the one whose domains hold the fewest,
// the outermost first ("dc1" before "dc1/rack2").
class DomainSpread {
 public:
  explicit DomainSpread(int classes) : held_(classes) {}

  // Hosts (items of the caller's) by domain, each domain's in the order
  // given.
  class Hosts {
   public:
    // The first host left in the order given.
    int TakeFirst() {
      int best = -1;
      for (size_t d = 0; d < groups_.size(); ++d) {
        const Group& g = groups_[d];
        if (g.next < g.hosts.size() &&
            (best < 0 || g.first_rank[g.next] < Rank(best)))
          best = static_cast<int>(d);
      }
      return Pop(best);
    }

   private:
    friend class DomainSpread;
    struct Group {
      std::vector<std::string> prefixes;  // of the domain, outermost first
      std::vector<int> hosts;
      std::vector<size_t> first_rank;  // each host's place in the order given
      size_t next = 0;
    };
    size_t Rank(int d) const { return groups_[d].first_rank[groups_[d].next]; }
    int Pop(int d) { return groups_[d].hosts[groups_[d].next++]; }
    std::vector<Group> groups_;
  };

  template <typename DomainOf>
  Hosts Of(const std::vector<int>& hosts, DomainOf domain_of) const {
    Hosts out;
    std::map<std::string, int> group;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string& d = domain_of(hosts[i]);
      auto [it, fresh] =
          group.try_emplace(d, static_cast<int>(out.groups_.size()));
      if (fresh) {
        out.groups_.emplace_back();
        for (size_t slash = d.find('/'); !d.empty();
             slash = d.find('/', slash + 1)) {
          out.groups_.back().prefixes.push_back(d.substr(0, slash));
          if (slash == std::string::npos) break;
        }
      }
      out.groups_[it->second].hosts.push_back(hosts[i]);
      out.groups_[it->second].first_rank.push_back(i);
    }
    return out;
  }

  // Takes for an item of class `c` the host of `hosts` whose domains hold
  // the fewest of the class (outermost domain first; then the host given
  // first), and counts it there.
  int Take(int c, Hosts* hosts) {
    std::map<std::string, int>& held = held_[c];
    auto count = [&](const std::string& d) {
      auto it = held.find(d);
      return it == held.end() ? 0 : it->second;
    };
    int best = -1;
    std::vector<int> best_key;
    for (size_t d = 0; d < hosts->groups_.size(); ++d) {
      const Hosts::Group& g = hosts->groups_[d];
      if (g.next >= g.hosts.size()) continue;
      std::vector<int> key;
      for (const std::string& p : g.prefixes) key.push_back(count(p));
      if (best < 0 || key < best_key ||
          (key == best_key &&
           hosts->Rank(static_cast<int>(d)) < hosts->Rank(best))) {
        best = static_cast<int>(d);
        best_key = std::move(key);
      }
    }
    for (const std::string& p : hosts->groups_[best].prefixes) ++held[p];
    return hosts->Pop(best);
  }

 private:
  std::vector<std::map<std::string, int>> held_;  // per class: per domain
};

// Whether domain path `d` is `p` or inside it ("r1/h3" is inside "r1").
bool Within(const std::string& d, const std::string& p) {
  return d.size() >= p.size() && d.compare(0, p.size(), p) == 0 &&
         (d.size() == p.size() || d[p.size()] == '/');
}

// Recoverability first, between failure domains: where every block of a
// class (two or more: a stage's replicas) lies in one domain (a domain
// path or a prefix of it) while a candidate host lies outside it, one of
// them is exchanged with the block on a host outside (or moved to a free
// one) by the exchange that adds the fewest bytes, whatever it adds. An
// exchange must fit both hosts and must not leave the other block's class
// in one domain. `cost` and `fits` are per block class x host class (the
// assignment's), `host_class(c)` and `domain_of(c)` a candidate's;
// `cand_of_block` is changed.
template <typename HostClass, typename DomainOf>
void SpreadOverDomains(int block_classes, int host_classes,
                       const std::vector<int64_t>& cost,
                       const std::vector<char>& fits, int candidates,
                       HostClass host_class, DomainOf domain_of,
                       const std::vector<int>& class_of_block,
                       std::vector<int>* cand_of_block) {
  const int H = host_classes;
  std::vector<int>& on = *cand_of_block;
  std::vector<int> block_on(candidates, -1);
  std::vector<std::vector<int>> blocks_of(block_classes);
  for (size_t block = 0; block < on.size(); ++block) {
    block_on[on[block]] = static_cast<int>(block);
    blocks_of[class_of_block[block]].push_back(static_cast<int>(block));
  }
  // The outermost domain that holds every block of class `b` and that a
  // candidate lies outside ("" if none).
  auto confined = [&](int b) -> std::string {
    const std::vector<int>& mine = blocks_of[b];
    if (mine.size() < 2) return "";
    const std::string& first = domain_of(on[mine[0]]);
    for (size_t slash = first.find('/'); !first.empty();
         slash = first.find('/', slash + 1)) {
      const std::string p = first.substr(0, slash);
      for (int block : mine)
        if (!Within(domain_of(on[block]), p)) return "";
      for (int c = 0; c < candidates; ++c)
        if (!Within(domain_of(c), p)) return p;
      if (slash == std::string::npos) break;
    }
    return "";
  };
  auto exchange = [&](int y_block, int x) {
    const int y = on[y_block], x_block = block_on[x];
    on[y_block] = x;
    block_on[x] = y_block;
    block_on[y] = x_block;
    if (x_block >= 0) on[x_block] = y;
  };
  for (int b = 0; b < block_classes; ++b) {
    const std::string p = confined(b);
    if (p.empty()) continue;
    int64_t least = std::numeric_limits<int64_t>::max();
    int best_y = -1, best_x = -1;
    std::set<int> tried;  // host classes of the blocks' hosts
    for (int y_block : blocks_of[b]) {
      const int y = on[y_block], hy = host_class(y);
      if (!tried.insert(hy).second) continue;
      for (int x = 0; x < candidates; ++x) {
        if (Within(domain_of(x), p)) continue;
        const int hx = host_class(x), x_block = block_on[x];
        const int bx = x_block < 0 ? -1 : class_of_block[x_block];
        if (!fits[static_cast<size_t>(b) * H + hx] ||
            (bx >= 0 && !fits[static_cast<size_t>(bx) * H + hy]))
          continue;
        int64_t extra = cost[static_cast<size_t>(b) * H + hx] -
                        cost[static_cast<size_t>(b) * H + hy];
        if (bx >= 0) {
          extra += cost[static_cast<size_t>(bx) * H + hy] -
                   cost[static_cast<size_t>(bx) * H + hx];
        }
        if (extra >= least) continue;
        if (bx >= 0 && bx != b && confined(bx).empty()) {
          exchange(y_block, x);
          const bool breaks = !confined(bx).empty();
          exchange(y_block, y);  // back
          if (breaks) continue;
        }
        least = extra;
        best_y = y_block;
        best_x = x;
      }
    }
    if (best_y >= 0) exchange(best_y, best_x);
  }
}

int64_t Bytes(const ModelSpec& spec, const Regions& regions) {
  int64_t n = 0;
  for (uint64_t k : regions.keys)
    n += regions.region(k).volume() *
         ElementSize(spec.tensors[Regions::Tensor(k)].dtype);
  return n;
}

// Bytes of the union of `needs` that `holds` lacks (tensor by tensor, on
// the grid of both sides' boundaries).
int64_t Missing(const ModelSpec& spec, const Regions& needs,
                const Regions& holds) {
  int64_t bytes = 0;
  Grid grid;
  std::vector<char> need, held;
  const std::vector<uint64_t>& nk = needs.keys;
  const std::vector<uint64_t>& hk = holds.keys;
  size_t i = 0, j = 0;
  while (i < nk.size()) {
    const int32_t t = Regions::Tensor(nk[i]);
    size_t i_end = i;
    while (i_end < nk.size() && Regions::Tensor(nk[i_end]) == t) ++i_end;
    j = std::lower_bound(hk.begin() + j, hk.end(), static_cast<uint64_t>(t) << 32) -
        hk.begin();
    size_t j_end = j;
    while (j_end < hk.size() && Regions::Tensor(hk[j_end]) == t) ++j_end;
    const int64_t elem = ElementSize(spec.tensors[t].dtype);
    if (i_end - i == 1 && j_end == j) {
      bytes += needs.region(nk[i]).volume() * elem;
    } else if (i_end - i == 1 && j_end - j == 1 &&
               holds.region(hk[j]).Contains(needs.region(nk[i]))) {
      // The common case: a host that keeps its region.
    } else {
      grid.Reset(needs.region(nk[i]).rank());
      for (size_t k = i; k < i_end; ++k) grid.AddCuts(needs.region(nk[k]));
      for (size_t k = j; k < j_end; ++k) grid.AddCuts(holds.region(hk[k]));
      grid.Finalize();
      need.assign(grid.num_cells(), 0);
      held.assign(grid.num_cells(), 0);
      for (size_t k = i; k < i_end; ++k)
        grid.ForEachCell(needs.region(nk[k]), [&](int64_t c) { need[c] = 1; });
      for (size_t k = j; k < j_end; ++k)
        grid.ForEachCell(holds.region(hk[k]), [&](int64_t c) { held[c] = 1; });
      for (int64_t c = 0; c < grid.num_cells(); ++c) {
        if (need[c] && !held[c]) bytes += grid.CellRegion(c).volume() * elem;
      }
    }
    i = i_end;
    j = j_end;
  }
  return bytes;
}

std::string GiB(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30))
    return absl::StrFormat("%.2f GiB", bytes / 1073741824.0);
  if (bytes >= (int64_t{1} << 20))
    return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  return absl::StrCat(bytes, " bytes");
}

absl::Status CheckRequest(const PlacementRequest& req) {
  if (req.spec == nullptr || req.cluster == nullptr || req.target == nullptr)
    return absl::InvalidArgumentError("placement: spec, cluster and target are required");
  if (!req.target->config().has_value()) {
    return absl::InvalidArgumentError(
        "placement: the target layout was given rank by rank (no parallel "
        "config); give its placement explicitly");
  }
  const int n = static_cast<int>(req.cluster->hosts.size());
  if (req.hosts.empty())
    return absl::InvalidArgumentError("placement: no candidate hosts given");
  std::vector<char> seen(n, 0);
  for (int h : req.hosts) {
    if (h < 0 || h >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement: host id ", h, " is outside the cluster's ", n, " hosts"));
    }
    if (seen[h]++) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement: host '", req.cluster->hosts[h].name, "' is named twice"));
    }
  }
  if ((!req.taken.empty() && static_cast<int>(req.taken.size()) != n) ||
      (!req.memory.empty() && static_cast<int>(req.memory.size()) != n) ||
      (!req.alive.empty() && static_cast<int>(req.alive.size()) != n)) {
    return absl::InvalidArgumentError(
        "placement: taken, memory and alive must list every cluster host");
  }
  if ((req.source == nullptr) != (req.source_placement == nullptr)) {
    return absl::InvalidArgumentError(
        "placement: a source layout needs its placement");
  }
  if (req.source != nullptr &&
      req.source_placement->world_size() != req.source->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: the source placement has ", req.source_placement->world_size(),
        " ranks but its layout ", req.source->world_size()));
  }
  return absl::OkStatus();
}

bool HoldsSource(const PlacementRequest& req, int host) {
  if (!req.alive.empty() && !req.alive[host]) return false;
  return std::find(req.source_lost.begin(), req.source_lost.end(), host) ==
         req.source_lost.end();
}

// What each cluster host holds of the committed version (empty without a
// source).
std::vector<Regions> HostHoldings(const PlacementRequest& req) {
  const int n = static_cast<int>(req.cluster->hosts.size());
  if (req.source == nullptr) {
    std::vector<Regions> none(n);
    for (Regions& r : none) r.layout = req.target;  // empty either way
    return none;
  }
  std::vector<char> holds(n);
  for (int h = 0; h < n; ++h) holds[h] = HoldsSource(req, h);
  return GroupRegions(*req.source, n, [&](int rank) {
    const int h = req.source_placement->host[rank];
    return h >= 0 && h < n && holds[h] ? h : -1;
  });
}

double Bandwidth(const Host& h) { return h.bandwidth > 0 ? h.bandwidth : 25e9; }

// Jobs this small are searched by SmallSearch: a round of its moves costs
// units x hosts evaluations.
constexpr int kSearchUnits = 32;
constexpr int kSearchHosts = 32;
// ... and where hosts^units is at most this, every assignment is tried.
constexpr int64_t kSearchEvery = 4096;
// The most regions a search looks at (tens of milliseconds here).
constexpr int64_t kSearchWork = 1'500'000;
// Placements equal by the search's rule whose plans are made to compare
// their busiest senders (each a small job's plan: milliseconds), counting
// as one those where every host needs the same regions (their host-level
// plans are the same).
constexpr int kTiesPlanned = 64;

// A small placement problem (each unit's needs; per candidate host its
// room, holdings, link and memory), searched by local moves.
//
// Rank-order blocks never put a job's first and last stages on one host,
// nor leave the smallest stages for the host that holds nothing; the best
// placement of a small job sometimes does. From a grouping's placement,
// scored like the groupings (recoverability when surviving, then time and
// bytes),
// Descend moves a unit to a host with room, or exchanges two units of
// different hosts, while that scores strictly better by one order: first
// by the largest receive time, then (second descent) by the bytes across
// hosts among placements within the time limit; a host's units that need
// the same (a stage's replicas) also move as one. Each order is strict, so
// no move sequence cycles. Only the two hosts a move touches are
// recomputed.
class SmallSearch {
 public:
  struct Room {
    int slots;
    const Regions* holds;
    double bandwidth;
    int64_t memory;  // < 0: unlimited
    int64_t old_bytes;
    std::string domain;  // the host's failure domain ("": its own)
  };
  struct Score {
    bool fits = false;
    // When surviving: of its hosts, and then of their failure domains.
    Recoverability recoverable;
    Recoverability domains;
    double seconds = 0;          // the largest receive time
    int64_t bytes = 0;           // across hosts
    // Each host's receive time, longest first (guides moves off a
    // plateau where the longest stays).
    std::vector<double> spread;
  };
  enum class Order { kTime, kBytes };

  SmallSearch(const ModelSpec& spec, const Layout& target, bool survive,
              std::vector<Regions> unit_needs, std::vector<Room> hosts)
      : spec_(spec),
        target_(target),
        survive_(survive),
        unit_needs_(std::move(unit_needs)),
        hosts_(std::move(hosts)),
        any_domain_(
            std::any_of(hosts_.begin(), hosts_.end(),
                        [](const Room& r) { return !r.domain.empty(); })) {}

  bool any_domain() const { return any_domain_; }

  // 1: `a` survives more (hosts first, then domains); -1: `b`; 0: as much.
  static int MoreRecoverable(const Score& a, const Score& b) {
    if (!(a.recoverable == b.recoverable))
      return a.recoverable.Beats(b.recoverable) ? 1 : -1;
    if (!(a.domains == b.domains)) return a.domains.Beats(b.domains) ? 1 : -1;
    return 0;
  }

  Score Evaluate(const std::vector<int>& host_of) {
    Load(host_of);
    return ScoreOf();
  }

  // Moves from `host_of` while one improves by `order` (kBytes: within
  // `limit` seconds); the result and its score.
  std::vector<int> Descend(std::vector<int> host_of, Order order, double limit,
                           Score* score) {
    Load(host_of);
    Score current = ScoreOf();
    const int units = static_cast<int>(host_of.size());
    const int nh = static_cast<int>(hosts_.size());
    auto attempt = [&](int a, std::vector<int> on_a, int b,
                       std::vector<int> on_b) {
      HostState old_a = state_[a], old_b = state_[b];
      state_[a] = Compute(a, std::move(on_a));
      state_[b] = Compute(b, std::move(on_b));
      Score s = ScoreOf();
      if (Beats(s, current, order, limit)) {
        current = std::move(s);
        return true;
      }
      state_[a] = std::move(old_a);
      state_[b] = std::move(old_b);
      return false;
    };
    auto without = [](std::vector<int> v, int u) {
      v.erase(std::find(v.begin(), v.end(), u));
      return v;
    };
    auto with = [](std::vector<int> v, int u) {
      v.insert(std::lower_bound(v.begin(), v.end(), u), u);
      return v;
    };
    for (int round = 0; round < 4 * units && work_ < kSearchWork; ++round) {
      bool moved = false;
      // Stacks first: the units of a host that need the same (a stage's
      // dp replicas) move, or trade places with another host's stack, as
      // one; alone each would leave its stage's bytes needed twice.
      for (int u = 0; u < units && !moved; ++u) {
        const int a = host_of[u];
        const std::vector<int> stack = StackOf(a, u);
        if (stack.size() < 2 || stack[0] != u) continue;
        for (int b = 0; b < nh && !moved; ++b) {
          if (b == a) continue;
          std::vector<int> on_a = state_[a].units, on_b = state_[b].units;
          for (int s : stack) {
            on_a = without(std::move(on_a), s);
            on_b = with(std::move(on_b), s);
          }
          if (static_cast<int>(on_b.size()) <= hosts_[b].slots &&
              attempt(a, on_a, b, on_b)) {
            for (int s : stack) host_of[s] = b;
            moved = true;
            break;
          }
          // A copy: attempt replaces the host's state.
          const std::vector<int> on_b_now = state_[b].units;
          for (int v : on_b_now) {
            const std::vector<int> other = StackOf(b, v);
            if (other[0] != v || unit_needs_[v].keys == unit_needs_[u].keys)
              continue;
            std::vector<int> to_a = on_a, to_b = on_b;
            for (int s : other) {
              to_b = without(std::move(to_b), s);
              to_a = with(std::move(to_a), s);
            }
            if (static_cast<int>(to_a.size()) <= hosts_[a].slots &&
                static_cast<int>(to_b.size()) <= hosts_[b].slots &&
                attempt(a, to_a, b, to_b)) {
              for (int s : stack) host_of[s] = b;
              for (int s : other) host_of[s] = a;
              moved = true;
              break;
            }
          }
        }
      }
      for (int u = 0; u < units && !moved; ++u) {
        const int a = host_of[u];
        for (int b = 0; b < nh && !moved; ++b) {
          if (b == a ||
              static_cast<int>(state_[b].units.size()) >= hosts_[b].slots)
            continue;
          if (attempt(a, without(state_[a].units, u), b,
                      with(state_[b].units, u))) {
            host_of[u] = b;
            moved = true;
          }
        }
        for (int v = u + 1; v < units && !moved; ++v) {
          const int b = host_of[v];
          if (b == a || unit_needs_[u].keys == unit_needs_[v].keys) continue;
          if (attempt(a, with(without(state_[a].units, u), v), b,
                      with(without(state_[b].units, v), u))) {
            std::swap(host_of[u], host_of[v]);
            moved = true;
          }
        }
      }
      if (!moved) break;
    }
    *score = std::move(current);
    return host_of;
  }

  // Every assignment of the units to hosts with room, when there are at
  // most `most` of them (hosts^units): each with its score, appended to
  // `out`. False (nothing appended) when there are more.
  template <typename Out>
  bool Every(int units, int64_t most, Out out) {
    int64_t count = 1;
    for (int u = 0; u < units; ++u) {
      count *= static_cast<int64_t>(hosts_.size());
      if (count > most) return false;
    }
    // Each assignment computes every host.
    int64_t per = 0;
    for (int u = 0; u < units; ++u)
      per += static_cast<int64_t>(unit_needs_[u].keys.size());
    for (const Room& r : hosts_)
      per += static_cast<int64_t>(r.holds->keys.size());
    if (count * per > kSearchWork - work_) return false;
    std::vector<int> host_of(units, 0), used(hosts_.size(), 0);
    std::function<void(int)> next = [&](int u) {
      if (u == units) {
        out(host_of, Evaluate(host_of));
        return;
      }
      for (size_t h = 0; h < hosts_.size(); ++h) {
        if (used[h] == hosts_[h].slots) continue;
        ++used[h];
        host_of[u] = static_cast<int>(h);
        next(u + 1);
        --used[h];
      }
    };
    next(0);
    return true;
  }

 private:
  struct HostState {
    std::vector<int> units;
    Regions needs;
    bool fits = true;
    int64_t missing = 0;
    double seconds = 0;
  };

  // The units on host `h` that need what unit `u` (on it) needs, in order.
  std::vector<int> StackOf(int h, int u) const {
    std::vector<int> out;
    for (int v : state_[h].units)
      if (unit_needs_[v].keys == unit_needs_[u].keys) out.push_back(v);
    return out;
  }

  static bool Beats(const Score& a, const Score& b, Order order, double limit) {
    if (!a.fits || !b.fits) return a.fits && !b.fits;
    if (const int r = MoreRecoverable(a, b); r != 0) return r > 0;
    const double eps = 1e-9 * std::max(1e-12, b.seconds);
    if (order == Order::kBytes) {
      const bool a_in = a.seconds <= limit, b_in = b.seconds <= limit;
      if (a_in != b_in) return a_in;
      if (a.bytes != b.bytes) return a.bytes < b.bytes;
    }
    if (a.seconds < b.seconds - eps) return true;
    if (a.seconds > b.seconds + eps) return false;
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    return a.spread < b.spread;
  }

  HostState Compute(int h, std::vector<int> on) const {
    HostState s;
    s.units = std::move(on);
    s.needs.layout = &target_;
    for (int u : s.units) {
      s.needs.keys.insert(s.needs.keys.end(), unit_needs_[u].keys.begin(),
                          unit_needs_[u].keys.end());
    }
    std::sort(s.needs.keys.begin(), s.needs.keys.end());
    s.needs.keys.erase(std::unique(s.needs.keys.begin(), s.needs.keys.end()),
                       s.needs.keys.end());
    const Room& room = hosts_[h];
    work_ +=
        static_cast<int64_t>(s.needs.keys.size() + room.holds->keys.size());
    s.fits = static_cast<int>(s.units.size()) <= room.slots &&
             (room.memory < 0 ||
              room.old_bytes + Bytes(spec_, s.needs) <= room.memory);
    s.missing = s.units.empty() ? 0 : Missing(spec_, s.needs, *room.holds);
    s.seconds = s.missing / room.bandwidth;
    return s;
  }

  void Load(const std::vector<int>& host_of) {
    std::vector<std::vector<int>> on(hosts_.size());
    for (size_t u = 0; u < host_of.size(); ++u)
      on[host_of[u]].push_back(static_cast<int>(u));
    state_.resize(hosts_.size());
    for (size_t h = 0; h < hosts_.size(); ++h)
      state_[h] = Compute(static_cast<int>(h), std::move(on[h]));
  }

  Score ScoreOf() const {
    Score s;
    s.fits = true;
    std::vector<Regions> used;
    // The used hosts' needs by failure domain (a host without one is a
    // domain of its own).
    std::map<std::string, Regions> by_domain;
    for (size_t i = 0; i < state_.size(); ++i) {
      const HostState& h = state_[i];
      s.fits &= h.fits;
      s.seconds = std::max(s.seconds, h.seconds);
      s.bytes += h.missing;
      s.spread.push_back(h.seconds);
      if (h.units.empty()) continue;
      used.push_back(h.needs);
      if (any_domain_) {
        const std::string& d = hosts_[i].domain;
        Regions& r = by_domain[d.empty() ? absl::StrCat("\n", i) : d];
        r.layout = &target_;
        r.keys.insert(r.keys.end(), h.needs.keys.begin(), h.needs.keys.end());
      }
    }
    std::sort(s.spread.begin(), s.spread.end(), std::greater<double>());
    if (!survive_) return s;
    s.recoverable = Recoverability::Of(target_, used);
    if (any_domain_) {
      std::vector<Regions> domains;
      for (auto& [name, r] : by_domain) {
        std::sort(r.keys.begin(), r.keys.end());
        r.keys.erase(std::unique(r.keys.begin(), r.keys.end()), r.keys.end());
        domains.push_back(std::move(r));
      }
      s.domains = Recoverability::Of(target_, domains);
    }
    return s;
  }

  const ModelSpec& spec_;
  const Layout& target_;
  const bool survive_;
  const std::vector<Regions> unit_needs_;
  const std::vector<Room> hosts_;
  const bool any_domain_;
  std::vector<HostState> state_;
  // Regions looked at so far (each host's needs and holdings, per host
  // computed): the search stops when it passes kSearchWork, so that its
  // time is bounded and its result does not depend on the machine's speed.
  mutable int64_t work_ = 0;
};

}  // namespace

absl::StatusOr<PlacementResult> EvaluatePlacement(const PlacementRequest& req,
                                                  const Placement& placement) {
  PTC_RETURN_IF_ERROR(CheckRequest(req));
  const int n = static_cast<int>(req.cluster->hosts.size());
  if (placement.world_size() != req.target->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement: ", placement.world_size(), " ranks placed but the layout has ",
        req.target->world_size()));
  }
  PTC_RETURN_IF_ERROR(ValidatePlacement(*req.cluster, placement));
  const std::vector<Regions> holds = HostHoldings(req);
  const std::vector<Regions> needs = GroupRegions(
      *req.target, n, [&](int rank) { return placement.host[rank]; });
  PlacementResult out;
  out.placement = placement;
  out.host_bytes.assign(n, 0);
  out.host_old_bytes.assign(n, 0);
  std::vector<char> used(n, 0);
  for (int h : placement.host) used[h] = 1;
  for (int h = 0; h < n; ++h) {
    out.host_old_bytes[h] = Bytes(*req.spec, holds[h]);
    if (!used[h]) continue;
    const int64_t missing = Missing(*req.spec, needs[h], holds[h]);
    out.cross_host_bytes += missing;
    out.max_receive_seconds = std::max(
        out.max_receive_seconds, missing / Bandwidth(req.cluster->hosts[h]));
    out.host_bytes[h] = Bytes(*req.spec, needs[h]);
  }
  for (int h : req.hosts) {
    if (!used[h]) out.released.push_back(h);
  }
  out.survival = CheckSurvival(*req.spec, *req.target, placement, *req.cluster,
                               req.small_objects_kept);
  return out;
}

absl::Status CheckPlacementFits(const PlacementRequest& req,
                                const PlacementResult& result) {
  const Cluster& cluster = *req.cluster;
  const Placement& p = result.placement;
  for (int r = 0; r < p.world_size(); ++r) {
    const int h = p.host[r];
    if (req.taken.empty()) break;
    const auto& taken = req.taken[h];
    if (std::find(taken.begin(), taken.end(), p.device[r]) != taken.end()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", r, " is placed on GPU ", p.device[r], " of ",
          cluster.hosts[h].name, ", which another job uses"));
    }
  }
  for (size_t h = 0; h < result.host_bytes.size() && !req.memory.empty(); ++h) {
    const int64_t need = result.host_bytes[h] +
                         (h < result.host_old_bytes.size() ? result.host_old_bytes[h] : 0);
    if (result.host_bytes[h] > 0 && req.memory[h] >= 0 && need > req.memory[h]) {
      return absl::ResourceExhaustedError(absl::StrCat(
          cluster.hosts[h].name, " would hold ", GiB(result.host_bytes[h]),
          " of the job's new version",
          result.host_old_bytes[h] > 0
              ? absl::StrCat(" beside ", GiB(result.host_old_bytes[h]),
                             " of the committed one")
              : "",
          " but its store has ", GiB(req.memory[h]),
          " for the job; add hosts, or start its ptcd with more --memory"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Losses that Describe names with an example (the rest it counts).
constexpr size_t kLossesShown = 3;

// The example a loss names: a region of `held[g]` no other group holds.
// `count` (holders per region) is filled on first use.
std::string OnlyThere(const ModelSpec& spec, const Layout& layout,
                      const std::vector<Regions>& held, size_t g,
                      std::vector<std::vector<int32_t>>* count_cache) {
  std::vector<std::vector<int32_t>>& count = *count_cache;
  if (count.empty()) {
    count.resize(layout.num_tensors());
    for (int t = 0; t < layout.num_tensors(); ++t)
      count[t].assign(layout.regions(t).size(), 0);
    for (const Regions& r : held)
      for (uint64_t k : r.keys)
        ++count[Regions::Tensor(k)][static_cast<int32_t>(k & 0xffffffffu)];
  }
  for (uint64_t k : held[g].keys) {
    if (count[Regions::Tensor(k)][static_cast<int32_t>(k & 0xffffffffu)] < 2) {
      return absl::StrCat("tensor '", spec.tensors[Regions::Tensor(k)].key, "' ",
                          held[g].region(k).ToString());
    }
  }
  return "";
}

// Per group of ranks (group_of(rank); -1: none), the first small object
// the group's loss takes ("" where none): a class of SmallObjectClasses
// whose ranks are all in the group holds its only copies ("small object
// 'cursor' of rank 3"), unless the coordinator keeps them
// (`small_objects_kept`).
std::vector<std::string> SmallObjectsOnlyIn(
    const ModelSpec& spec, const Layout& layout, int groups,
    const std::function<int(int)>& group_of, bool small_objects_kept) {
  std::vector<std::string> out(groups);
  if (!layout.config().has_value() || small_objects_kept) return out;
  for (const SmallObjectClass& c :
       SmallObjectClasses(spec, *layout.config(), group_of)) {
    if (c.group >= 0 && c.group < groups && out[c.group].empty()) {
      out[c.group] =
          absl::StrCat("small object '", spec.small_objects[c.object].name,
                       "' of rank ", c.first_rank);
    }
  }
  return out;
}

SurvivalReport SurvivalLevels(const ModelSpec& spec, const Layout& layout,
                              const Placement& placement,
                              const Cluster& cluster, bool host_level,
                              bool small_objects_kept) {
  SurvivalReport out;
  // The groups of one level: each used host's name (depth -1), or its
  // domain's prefix of `depth + 1` components; a host whose path is
  // shorter is a group of its own there (its copies count, it is not a
  // domain of that level). `domain[g]`: group g is a domain.
  auto level = [&](int depth, std::vector<std::string>* names,
                   std::vector<bool>* domain) {
    std::map<std::pair<bool, std::string>, int> id;
    std::vector<int> group_of_host(cluster.hosts.size(), -1);
    for (int h : placement.host) {
      if (h < 0 || h >= static_cast<int>(cluster.hosts.size()) ||
          group_of_host[h] >= 0)
        continue;
      std::string name = cluster.hosts[h].name;
      bool is_domain = depth < 0;
      if (depth >= 0) {
        const std::vector<std::string> parts =
            absl::StrSplit(cluster.hosts[h].domain, '/', absl::SkipEmpty());
        if (static_cast<int>(parts.size()) > depth) {
          name = absl::StrJoin(parts.begin(), parts.begin() + depth + 1, "/");
          is_domain = true;
        }
      }
      auto [it, fresh] = id.emplace(std::make_pair(is_domain, name),
                                    static_cast<int>(names->size()));
      if (fresh) {
        names->push_back(name);
        domain->push_back(is_domain);
      }
      group_of_host[h] = it->second;
    }
    return group_of_host;
  };
  auto losses = [&](const std::vector<int>& group_of_host,
                    const std::vector<std::string>& names,
                    const std::vector<bool>& domain) {
    auto group_of = [&](int rank) {
      const int h = placement.host[rank];
      return h < 0 || h >= static_cast<int>(group_of_host.size())
                 ? -1
                 : group_of_host[h];
    };
    const int groups = static_cast<int>(names.size());
    const std::vector<Regions> held = GroupRegions(layout, groups, group_of);
    const std::vector<bool> survives = SurvivingGroups(layout, held);
    const std::vector<std::string> small =
        SmallObjectsOnlyIn(spec, layout, groups, group_of, small_objects_kept);
    std::vector<SurvivalReport::Loss> lost;
    std::vector<std::vector<int32_t>> count;
    for (int g = 0; g < groups; ++g) {
      if ((survives[g] && small[g].empty()) || !domain[g]) continue;
      lost.push_back({names[g], lost.size() >= kLossesShown ? ""
                                : !survives[g]
                                    ? OnlyThere(spec, layout, held, g, &count)
                                    : small[g]});
    }
    return lost;
  };
  if (host_level) {
    std::vector<std::string> hosts;
    std::vector<bool> all_hosts;
    const std::vector<int> by_host = level(-1, &hosts, &all_hosts);
    out.hosts_lost = losses(by_host, hosts, all_hosts);
    out.hosts = static_cast<int>(hosts.size());
  }
  const bool any_domain = std::any_of(
      placement.host.begin(), placement.host.end(), [&](int32_t h) {
        return h >= 0 && h < static_cast<int>(cluster.hosts.size()) &&
               !cluster.hosts[h].domain.empty();
      });
  for (int depth = 0; any_domain; ++depth) {
    std::vector<std::string> names;
    std::vector<bool> domain;
    const std::vector<int> groups = level(depth, &names, &domain);
    if (std::find(domain.begin(), domain.end(), true) == domain.end()) break;
    for (size_t g = 0; g < names.size(); ++g)
      if (domain[g]) out.domains.push_back(names[g]);
    for (SurvivalReport::Loss& l : losses(groups, names, domain))
      out.domains_lost.push_back(std::move(l));
  }
  return out;
}

}  // namespace

std::vector<SmallObjectClass> SmallObjectClasses(
    const ModelSpec& spec, const ParallelConfig& config,
    const std::function<int(int)>& group_of) {
  std::vector<SmallObjectClass> out;
  for (size_t o = 0; o < spec.small_objects.size(); ++o) {
    const SmallObjectSpec& object = spec.small_objects[o];
    if (object.new_ranks != NewRankRule::kCopy) continue;
    std::vector<int> axes;
    for (const std::string& a : object.scope) {
      if (const int i = config.AxisIndex(a); i >= 0) axes.push_back(i);
    }
    // A class's group (-2: it spans groups) and its first rank.
    std::map<std::vector<int>, std::pair<int, int>> classes;
    std::vector<int> key(axes.size());
    for (int r = 0; r < config.world_size(); ++r) {
      const MeshCoord c = config.CoordOf(r);
      for (size_t i = 0; i < axes.size(); ++i) key[i] = c.index[axes[i]];
      const int g = group_of(r);
      auto [it, fresh] = classes.try_emplace(key, g, r);
      if (!fresh && it->second.first != g) it->second.first = -2;
    }
    for (const auto& [k, where] : classes)
      out.push_back({static_cast<int>(o), where.second, where.first});
  }
  return out;
}

SurvivalReport CheckSurvival(const ModelSpec& spec, const Layout& layout,
                             const Placement& placement, const Cluster& cluster,
                             bool small_objects_kept) {
  return SurvivalLevels(spec, layout, placement, cluster, true,
                        small_objects_kept);
}

std::string SurvivalReport::Describe() const {
  auto list = [](const std::vector<Loss>& lost) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < lost.size() && i < kLossesShown; ++i) {
      shown.push_back(absl::StrCat(lost[i].domain, " (", lost[i].example,
                                   " is only there)"));
    }
    if (lost.size() > kLossesShown)
      shown.push_back(absl::StrCat(lost.size() - kLossesShown, " more"));
    return absl::StrJoin(shown, ", ");
  };
  std::string out =
      hosts_lost.empty()
          ? (hosts > 1 ? "survives the loss of any one host"
                       : "on one host: its loss loses the state")
          : absl::StrCat("does not survive the loss of host ", list(hosts_lost));
  if (hosts <= 1 && hosts_lost.empty()) return out;
  if (!domains.empty()) {
    absl::StrAppend(&out, domains_lost.empty()
                              ? absl::StrCat("; survives the loss of any one domain (",
                                             absl::StrJoin(domains, ", "), ")")
                              : absl::StrCat("; of domain ", list(domains_lost), ": no"));
  }
  return out;
}

std::vector<int64_t> HostStateBytes(const ModelSpec& spec, const Layout& layout,
                                    const Placement& placement, int num_hosts) {
  const std::vector<Regions> held = GroupRegions(
      layout, num_hosts, [&](int rank) {
        const int h = placement.host[rank];
        return h >= 0 && h < num_hosts ? h : -1;
      });
  std::vector<int64_t> out(num_hosts);
  for (int h = 0; h < num_hosts; ++h) out[h] = Bytes(spec, held[h]);
  return out;
}

absl::StatusOr<PlacementResult> ContiguousPlacementResult(
    const PlacementRequest& req) {
  PTC_RETURN_IF_ERROR(CheckRequest(req));
  PTC_ASSIGN_OR_RETURN(Placement p,
                       ContiguousPlacement(*req.cluster, req.hosts,
                                           req.target->world_size()));
  return EvaluatePlacement(req, p);
}

absl::StatusOr<PlacementResult> ChoosePlacement(const PlacementRequest& req) {
  PTC_RETURN_IF_ERROR(CheckRequest(req));
  const ModelSpec& spec = *req.spec;
  const Cluster& cluster = *req.cluster;
  const ParallelConfig& config = *req.target->config();
  const int world = req.target->world_size();

  // Units: ranks equal on every axis but the colocated ones.
  std::vector<int> axes;
  int64_t unit_size = 1;
  for (const std::string& a : req.colocate) {
    const int i = config.AxisIndex(a);
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement: colocate axis '", a, "' is not an axis of ",
          config.ToString()));
    }
    if (std::find(axes.begin(), axes.end(), i) != axes.end()) continue;
    axes.push_back(i);
    unit_size *= config.size(a);
  }
  std::map<std::vector<int>, int> unit_id;
  std::vector<int> unit_of(world);
  std::vector<std::vector<int>> unit_ranks;
  for (int r = 0; r < world; ++r) {
    MeshCoord c = config.CoordOf(r);
    for (int i : axes) c.index[i] = 0;
    auto [it, fresh] = unit_id.emplace(c.index, static_cast<int>(unit_ranks.size()));
    if (fresh) unit_ranks.emplace_back();
    unit_of[r] = it->second;
    unit_ranks[it->second].push_back(r);
  }
  const int units = static_cast<int>(unit_ranks.size());
  const std::string unit_words =
      axes.empty() ? std::string("ranks")
                   : absl::StrCat("groups of ", unit_size, " ranks (",
                                  absl::StrJoin(req.colocate, ","),
                                  ") that share a host");

  // Candidates: free GPUs and the units they fit.
  struct Candidate {
    int host;
    std::vector<int32_t> free;
    int slots;
  };
  std::vector<Candidate> cands;
  int64_t total_slots = 0, max_free = 0;
  for (int h : req.hosts) {
    Candidate c{h, {}, 0};
    const std::vector<int32_t>* taken = req.taken.empty() ? nullptr : &req.taken[h];
    for (int32_t g = 0; g < cluster.hosts[h].gpus; ++g) {
      if (taken == nullptr || std::find(taken->begin(), taken->end(), g) == taken->end())
        c.free.push_back(g);
    }
    c.slots = static_cast<int>(static_cast<int64_t>(c.free.size()) / unit_size);
    total_slots += c.slots;
    max_free = std::max<int64_t>(max_free, c.free.size());
    cands.push_back(std::move(c));
  }
  if (unit_size > max_free) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's ", unit_words, " need ", unit_size,
        " GPUs on one host, but the most free GPUs on a candidate host is ",
        max_free, "; use hosts with more GPUs or colocate fewer axes"));
  }
  if (total_slots < units) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs ", world, " GPUs as ", units, " ", unit_words,
        ", but the ", req.hosts.size(), " candidate hosts fit only ",
        total_slots, " of them (GPUs other jobs use are taken); add hosts"));
  }

  // Blocks: consecutive units of an order, sized by the hosts with the
  // most room first. Two orders: rank order (the dp replicas of one stage
  // side by side, as Megatron places them), and replica by replica (the
  // stages of one dp replica side by side), which keeps a stage's
  // replicas on different hosts where a host holds fewer units than the
  // job has.
  std::vector<int> by_room(cands.size());
  std::iota(by_room.begin(), by_room.end(), 0);
  std::stable_sort(by_room.begin(), by_room.end(), [&](int a, int b) {
    return cands[a].slots > cands[b].slots;
  });
  struct Grouping {
    std::vector<std::vector<int>> blocks;  // units
    std::vector<int> block_of_unit;
    std::vector<Regions> needs;  // per block
    Recoverability recoverable;  // of its blocks, each on a host
  };
  // The blocks of an order, of at most `most` units each (nullopt: the
  // hosts cannot take them so); group() adds what they need.
  auto blocks_of = [&](const std::vector<int>& order,
                       int most) -> std::optional<Grouping> {
    Grouping g;
    size_t next = 0;
    for (int c : by_room) {
      if (next >= order.size()) break;
      const size_t take =
          std::min<size_t>(std::min(cands[c].slots, most), order.size() - next);
      if (take == 0) continue;
      g.blocks.emplace_back(order.begin() + next, order.begin() + next + take);
      next += take;
    }
    if (next < order.size()) return std::nullopt;
    g.block_of_unit.assign(units, -1);
    for (size_t b = 0; b < g.blocks.size(); ++b)
      for (int u : g.blocks[b]) g.block_of_unit[u] = static_cast<int>(b);
    return g;
  };
  auto group = [&](Grouping g) {
    g.needs = GroupRegions(*req.target, static_cast<int>(g.blocks.size()),
                           [&](int rank) { return g.block_of_unit[unit_of[rank]]; });
    g.recoverable = Recoverability::Of(*req.target, g.needs);
    return g;
  };
  std::vector<int> rank_order(units);
  std::iota(rank_order.begin(), rank_order.end(), 0);
  std::vector<int> replica_order = rank_order;
  const int dp_axis = config.AxisIndex("dp");
  if (dp_axis >= 0 && req.survive) {
    std::vector<int> replica(units);
    for (int u = 0; u < units; ++u)
      replica[u] = config.CoordOf(unit_ranks[u][0]).index[dp_axis];
    std::stable_sort(replica_order.begin(), replica_order.end(),
                     [&](int a, int b) { return replica[a] < replica[b]; });
  }
  // What each block needs and each host holds: passes over every shard
  // of the two layouts, run side by side.
  std::vector<Regions> holdings;
  std::thread holdings_pass([&] { holdings = HostHoldings(req); });
  // Each order in blocks as large as the hosts take, then smaller ones
  // down to the fewest units that spread the job over every candidate:
  // spread, a job moves less where its state already lies on more hosts
  // than it needs (a stage on each of two hosts, each kept where it is).
  // The same blocks in another order place the same way (a unit that
  // fills a host): only different blocks are worth a pass.
  std::vector<Grouping> groupings;
  std::set<std::vector<std::vector<int>>> seen_blocks;
  int most_slots = 0;
  for (const Candidate& c : cands) most_slots = std::max(most_slots, c.slots);
  const int fewest =
      static_cast<int>((units + static_cast<int64_t>(cands.size()) - 1) /
                       static_cast<int64_t>(cands.size()));
  for (int most = most_slots; most >= std::max(fewest, 1); --most) {
    for (const std::vector<int>* order : {&rank_order, &replica_order}) {
      if (order == &replica_order &&
          (!req.survive || replica_order == rank_order))
        continue;
      std::optional<Grouping> g = blocks_of(*order, most);
      if (!g.has_value()) continue;
      std::vector<std::vector<int>> sorted = g->blocks;
      for (auto& b : sorted) std::sort(b.begin(), b.end());
      std::sort(sorted.begin(), sorted.end());
      if (seen_blocks.insert(std::move(sorted)).second)
        groupings.push_back(group(*std::move(g)));
    }
  }
  // Assigns the blocks of a grouping to the candidate hosts.
  auto assign = [&](const std::vector<std::vector<int>>& blocks,
                    const std::vector<Regions>& needs)
      -> absl::StatusOr<PlacementResult> {
    const int nblocks = static_cast<int>(blocks.size());
    // Classes of equal blocks and of equal hosts.
    struct BlockClass {
      int units;
      int64_t bytes;
      std::vector<int> members;
    };
    std::vector<BlockClass> bclass;
    {
      std::map<std::pair<int, uint64_t>, int> key_to;
      for (int b = 0; b < nblocks; ++b) {
        const auto key = std::make_pair(static_cast<int>(blocks[b].size()),
                                        Signature(needs[b]));
        auto [it, fresh] = key_to.emplace(key, static_cast<int>(bclass.size()));
        if (fresh) bclass.push_back({key.first, Bytes(spec, needs[b]), {}});
        bclass[it->second].members.push_back(b);
      }
    }
    if (nblocks < static_cast<int>(cands.size())) {  // hosts left without ranks
      bclass.push_back({0, 0, {}});
      bclass.back().members.assign(cands.size() - nblocks, -1);
    }
    struct HostClass {
      int slots;
      int64_t memory, old_bytes;
      double bandwidth;
      std::vector<int> members;  // candidate indices, in preference order
    };
    std::vector<HostClass> hclass;
    {
      std::map<std::tuple<int, int64_t, double, uint64_t>, int> key_to;
      for (size_t c = 0; c < cands.size(); ++c) {
        const int h = cands[c].host;
        const int64_t mem = req.memory.empty() ? -1 : req.memory[h];
        const auto key = std::make_tuple(cands[c].slots, mem,
                                         Bandwidth(cluster.hosts[h]),
                                         Signature(holdings[h]));
        auto [it, fresh] = key_to.emplace(key, static_cast<int>(hclass.size()));
        if (fresh) {
          hclass.push_back({cands[c].slots, mem, Bytes(spec, holdings[h]),
                            Bandwidth(cluster.hosts[h]), {}});
        }
        hclass[it->second].members.push_back(static_cast<int>(c));
      }
    }
    // Hosts of a class are interchangeable for the assignment, and the
    // blocks of a class (a stage's replicas) go to consecutive members:
    // with failure domains, the members take turns by domain (in
    // preference order within each), so that a class's blocks land in
    // different domains where there are hosts for it.
    for (HostClass& hc : hclass) {
      hc.members = InterleaveByDomain(hc.members, [&](int c) -> const std::string& {
        return cluster.hosts[cands[c].host].domain;
      });
    }
    const int B = static_cast<int>(bclass.size()), H = static_cast<int>(hclass.size());
    // Cost and feasibility of each class pair.
    std::vector<int64_t> cost(static_cast<size_t>(B) * H, 0);
    std::vector<double> seconds(static_cast<size_t>(B) * H, 0);
    std::vector<char> fits(static_cast<size_t>(B) * H, 0);
    // A block and a host that share no tensor (other pipeline stages: most
    // pairs) cost the block's whole state, computed once per block class.
    const size_t words = (spec.tensors.size() + 63) / 64;
    auto tensor_bits = [&](const Regions& r) {
      std::vector<uint64_t> bits(words, 0);
      for (uint64_t k : r.keys) {
        const int32_t t = Regions::Tensor(k);
        bits[t / 64] |= uint64_t{1} << (t % 64);
      }
      return bits;
    };
    std::vector<std::vector<uint64_t>> block_bits(B), host_bits(H);
    for (int b = 0; b < B; ++b)
      if (bclass[b].units > 0) block_bits[b] = tensor_bits(needs[bclass[b].members[0]]);
    for (int h = 0; h < H; ++h)
      host_bits[h] = tensor_bits(holdings[cands[hclass[h].members[0]].host]);
    auto share_a_tensor = [&](int b, int h) {
      for (size_t w = 0; w < words; ++w)
        if (block_bits[b][w] & host_bits[h][w]) return true;
      return false;
    };
    std::vector<int64_t> alone(B, 0);
    for (int b = 0; b < B; ++b) {
      if (bclass[b].units > 0)
        alone[b] = Missing(spec, needs[bclass[b].members[0]], Regions{});
    }
    for (int b = 0; b < B; ++b) {
      const BlockClass& bc = bclass[b];
      for (int h = 0; h < H; ++h) {
        const HostClass& hc = hclass[h];
        const size_t k = static_cast<size_t>(b) * H + h;
        if (bc.units == 0) {
          fits[k] = 1;
          continue;
        }
        fits[k] = hc.slots >= bc.units &&
                  (hc.memory < 0 || hc.old_bytes + bc.bytes <= hc.memory);
        if (!fits[k]) continue;
        if (!share_a_tensor(b, h)) {
          cost[k] = alone[b];
          seconds[k] = cost[k] / hc.bandwidth;
          continue;
        }
        cost[k] = Missing(spec, needs[bc.members[0]],
                          holdings[cands[hc.members[0]].host]);
        seconds[k] = cost[k] / hc.bandwidth;
      }
    }

    // The network: source -> block class -> host class -> sink; every
    // candidate host takes exactly one block (an empty one: released).
    const int S = B + H, T = B + H + 1;
    const int64_t n_cands = static_cast<int64_t>(cands.size());
    auto feasible_within = [&](double limit) {
      MaxFlow f(B + H + 2);
      for (int b = 0; b < B; ++b)
        f.AddEdge(S, b, static_cast<int64_t>(bclass[b].members.size()));
      for (int h = 0; h < H; ++h)
        f.AddEdge(B + h, T, static_cast<int64_t>(hclass[h].members.size()));
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
          const size_t k = static_cast<size_t>(b) * H + h;
          if (fits[k] && seconds[k] <= limit) f.AddEdge(b, B + h, n_cands);
        }
      return f.Solve(S, T) == n_cands;
    };
    if (!feasible_within(std::numeric_limits<double>::infinity())) {
      int64_t biggest = 0;
      for (const BlockClass& bc : bclass) biggest = std::max(biggest, bc.bytes);
      std::vector<std::string> room;
      for (const Candidate& c : cands) {
        const int h = c.host;
        if (req.memory.empty() || req.memory[h] < 0) continue;
        room.push_back(absl::StrCat(cluster.hosts[h].name, " has ", GiB(req.memory[h]),
                                    " for the job, ", GiB(Bytes(spec, holdings[h])),
                                    " of it held by the committed version"));
        if (room.size() == 4) break;
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "the job's state does not fit the candidate hosts' store memory: a "
          "host's share of the new version is up to ", GiB(biggest),
          " and must fit beside what it holds of the committed version (",
          absl::StrJoin(room, "; "),
          "); add hosts, or start the ptcds with more --memory"));
    }
    // The smallest largest receive time that still places every block.
    std::vector<double> times;
    for (size_t k = 0; k < seconds.size(); ++k)
      if (fits[k]) times.push_back(seconds[k]);
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    size_t lo = 0, hi = times.size() - 1;
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (feasible_within(times[mid])) hi = mid; else lo = mid + 1;
    }
    const double limit = times[lo] * (1 + std::max(0.0, req.duration_slack));
    // Then the fewest bytes; ties go to the earlier host classes.
    int64_t max_cost = 0;
    for (int64_t c : cost) max_cost = std::max(max_cost, c);
    const int64_t scale =
        max_cost < std::numeric_limits<int64_t>::max() / (4 * (H + 1)) / std::max<int64_t>(n_cands, 1)
            ? H + 1
            : 1;
    MinCostFlow mcf(B + H + 2);
    std::vector<int> pair_edge(static_cast<size_t>(B) * H, -1);
    for (int b = 0; b < B; ++b)
      mcf.AddEdge(S, b, static_cast<int64_t>(bclass[b].members.size()), 0);
    for (int h = 0; h < H; ++h)
      mcf.AddEdge(B + h, T, static_cast<int64_t>(hclass[h].members.size()), 0);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const size_t k = static_cast<size_t>(b) * H + h;
        if (!fits[k] || seconds[k] > limit) continue;
        const int64_t tie = (scale > 1 && bclass[b].units > 0) ? h : 0;
        pair_edge[k] = mcf.AddEdge(b, B + h, n_cands, cost[k] * scale + tie);
      }
    const auto [sent, total] = mcf.Solve(S, T, n_cands);
    if (sent != n_cands) {
      return absl::InternalError("placement: the assignment lost a block");
    }

    // Blocks of each class to hosts of each class, in order.
    PlacementResult out;
    out.placement.host.assign(world, -1);
    out.placement.device.assign(world, -1);
    out.host_bytes.assign(cluster.hosts.size(), 0);
    out.host_old_bytes.assign(cluster.hosts.size(), 0);
    for (const HostClass& hc : hclass)
      for (int c : hc.members) out.host_old_bytes[cands[c].host] = hc.old_bytes;
    // Which member of a host class takes which block is free (they cost
    // the same): each block goes to the member whose failure domains hold
    // the fewest blocks of its class so far (a stage's new replica to the
    // rack that lacks one), the domain's first member in preference order;
    // the members left are released. With failure domains, host classes
    // that take one kind of block and release none go first: their
    // domains' counts are what they are whatever the order.
    const bool any_domain =
        std::any_of(cands.begin(), cands.end(), [&](const Candidate& c) {
          return !cluster.hosts[c.host].domain.empty();
        });
    DomainSpread spread(B);
    std::vector<int> host_order(H), kinds(H, 0);
    for (int h = 0; h < H; ++h) {
      host_order[h] = h;
      for (int b = 0; b < B; ++b) {
        const int e = pair_edge[static_cast<size_t>(b) * H + h];
        if (e >= 0 && mcf.Flow(e) > 0) kinds[h] += bclass[b].units > 0 ? 1 : 2;
      }
    }
    if (any_domain) {
      std::stable_sort(host_order.begin(), host_order.end(),
                       [&](int a, int b) { return kinds[a] < kinds[b]; });
    }
    std::vector<int> cand_of_block(nblocks, -1), class_of_block(nblocks, -1);
    std::vector<int> class_of_cand(cands.size(), -1);
    std::vector<size_t> next_block(B, 0);
    for (int h : host_order) {
      for (int c : hclass[h].members) class_of_cand[c] = h;
      DomainSpread::Hosts members =
          spread.Of(hclass[h].members, [&](int c) -> const std::string& {
            return cluster.hosts[cands[c].host].domain;
          });
      // Blocks first, then the hosts they leave (the empty class's flow).
      std::vector<int> order;
      for (int b = 0; b < B; ++b)
        if (bclass[b].units > 0) order.push_back(b);
      for (int b = 0; b < B; ++b)
        if (bclass[b].units == 0) order.push_back(b);
      for (int b : order) {
        const int e = pair_edge[static_cast<size_t>(b) * H + h];
        if (e < 0) continue;
        for (int64_t f = mcf.Flow(e); f > 0; --f) {
          const int block = bclass[b].members[next_block[b]++];
          if (block < 0) {
            members.TakeFirst();  // released
            continue;
          }
          cand_of_block[block] = spread.Take(b, &members);
          class_of_block[block] = b;
        }
      }
    }
    // Recoverability first: a class of blocks (a stage's replicas) whose
    // every block is in one domain while candidates lie outside it gets
    // one moved out, by the exchange that adds the fewest bytes.
    if (any_domain && req.survive) {
      SpreadOverDomains(
          B, H, cost, fits, static_cast<int>(cands.size()),
          [&](int c) { return class_of_cand[c]; },
          [&](int c) -> const std::string& {
            return cluster.hosts[cands[c].host].domain;
          },
          class_of_block, &cand_of_block);
    }
    std::vector<char> used(cands.size(), 0);
    for (int block = 0; block < nblocks; ++block) {
      const int c = cand_of_block[block];
      used[c] = 1;
      const Candidate& cand = cands[c];
      const size_t k =
          static_cast<size_t>(class_of_block[block]) * H + class_of_cand[c];
      out.cross_host_bytes += cost[k];
      out.max_receive_seconds = std::max(out.max_receive_seconds, seconds[k]);
      out.host_bytes[cand.host] = bclass[class_of_block[block]].bytes;
      std::vector<int> ranks;
      for (int u : blocks[block])
        ranks.insert(ranks.end(), unit_ranks[u].begin(), unit_ranks[u].end());
      std::sort(ranks.begin(), ranks.end());
      for (size_t i = 0; i < ranks.size(); ++i) {
        out.placement.host[ranks[i]] = cand.host;
        out.placement.device[ranks[i]] = cand.free[i];
      }
    }
    for (size_t c = 0; c < cands.size(); ++c)
      if (!used[c]) out.released.push_back(cands[c].host);
    std::sort(out.released.begin(), out.released.end(), [&](int a, int b) {
      return std::find(req.hosts.begin(), req.hosts.end(), a) <
             std::find(req.hosts.begin(), req.hosts.end(), b);
    });
    return out;
  };
  holdings_pass.join();

  absl::StatusOr<PlacementResult> best = absl::InternalError("no grouping");
  Recoverability best_recoverable;
  size_t best_grouping = 0;
  std::vector<Placement> placed_groupings;  // each that placed: SmallSearch starts
  for (size_t gi = 0; gi < groupings.size(); ++gi) {
    const Grouping& g = groupings[gi];
    absl::StatusOr<PlacementResult> placed = assign(g.blocks, g.needs);
    if (!placed.ok()) {
      if (!best.ok() && placed_groupings.empty()) best = placed;
      continue;
    }
    placed_groupings.push_back(placed->placement);
    // Recoverability first (req.survive): more of its hosts whose loss
    // leaves a copy of everything; then the shorter change, then fewer
    // bytes across hosts; then the larger blocks (fewer hosts; the earlier
    // grouping). Without a committed version (a registration) nothing
    // moves: the fewer hosts, after recoverability.
    const Recoverability recoverable =
        req.survive ? g.recoverable : Recoverability();
    const bool better =
        !best.ok() || recoverable.Beats(best_recoverable) ||
        (recoverable == best_recoverable && req.source != nullptr &&
         (placed->max_receive_seconds *
                  (1 + std::max(0.0, req.duration_slack)) <
              best->max_receive_seconds ||
          (placed->max_receive_seconds <=
               best->max_receive_seconds *
                   (1 + std::max(0.0, req.duration_slack)) &&
           placed->cross_host_bytes < best->cross_host_bytes)));
    if (better) {
      best = std::move(placed);
      best_recoverable = recoverable;
      best_grouping = gi;
    }
  }
  if (best.ok() && req.source != nullptr && units <= kSearchUnits &&
      static_cast<int>(cands.size()) <= kSearchHosts) {
    std::vector<SmallSearch::Room> rooms;
    std::map<int, int> cand_of_host;
    for (size_t c = 0; c < cands.size(); ++c) {
      const int h = cands[c].host;
      cand_of_host[h] = static_cast<int>(c);
      rooms.push_back({cands[c].slots, &holdings[h],
                       Bandwidth(cluster.hosts[h]),
                       req.memory.empty() ? -1 : req.memory[h],
                       Bytes(spec, holdings[h]), cluster.hosts[h].domain});
    }
    std::vector<Regions> unit_needs = GroupRegions(
        *req.target, units, [&](int rank) { return unit_of[rank]; });
    // A unit that alone holds a region can be on no host whose loss is
    // survived: where every unit does (dp=1), no placement is more
    // recoverable than another.
    const std::vector<bool> alone_ok = SurvivingGroups(*req.target, unit_needs);
    // Units that need the same regions (a stage's data-parallel replicas
    // without ZeRO) are interchangeable: each host's plan depends only on
    // which kinds of unit it holds.
    std::vector<int> unit_kind(units);
    {
      std::map<uint64_t, int> kinds;
      for (int u = 0; u < units; ++u) {
        unit_kind[u] = kinds.try_emplace(Signature(unit_needs[u]), kinds.size())
                           .first->second;
      }
    }
    const bool can_survive =
        req.survive &&
        std::find(alone_ok.begin(), alone_ok.end(), true) != alone_ok.end();
    SmallSearch search(spec, *req.target, req.survive, std::move(unit_needs),
                       std::move(rooms));
    auto units_of = [&](const Placement& p) {
      std::vector<int> host_of(units);
      for (int u = 0; u < units; ++u)
        host_of[u] = cand_of_host.at(p.host[unit_ranks[u][0]]);
      return host_of;
    };
    // Every assignment where there are few; else every grouping's
    // placement, where a descent to the shortest largest receive leads
    // from each, and where a descent to the fewest bytes within the slack
    // of the shortest of all leads from each of those. The choice as by
    // brute force: the most recoverable (hosts, then failure domains),
    // then within the slack of the shortest receive, the fewest bytes.
    struct Option {
      std::vector<int> host_of;
      SmallSearch::Score score;
    };
    // The chosen grouping's placement first: it stays on a tie. Nothing
    // beats one that moves nothing and survives every host's and
    // domain's loss (or cannot survive any).
    const std::vector<int> host_of = units_of(best->placement);
    std::vector<Option> options = {{host_of, search.Evaluate(host_of)}};
    auto full = [](const Recoverability& r) {
      return r.used > 1 && r.survivable == r.used;
    };
    const SmallSearch::Score& now = options[0].score;
    const bool unbeatable =
        best->cross_host_bytes == 0 &&
        (!can_survive || (full(now.recoverable) &&
                          (!search.any_domain() || full(now.domains))));
    const double slack = 1 + std::max(0.0, req.duration_slack);
    // A problem this small is searched whole; a larger one by descents.
    const bool whole =
        unbeatable ||
        search.Every(units, kSearchEvery,
                     [&](const std::vector<int>& h, SmallSearch::Score s) {
                       options.push_back({h, std::move(s)});
                     });
    if (!whole) {
      for (const Placement& start : placed_groupings) {
        std::vector<int> from = units_of(start);
        options.push_back({from, search.Evaluate(from)});
        SmallSearch::Score fast;
        std::vector<int> quick =
            search.Descend(from, SmallSearch::Order::kTime, 0, &fast);
        options.push_back({std::move(quick), std::move(fast)});
      }
      double quickest = std::numeric_limits<double>::infinity();
      for (const Option& o : options)
        if (o.score.fits) quickest = std::min(quickest, o.score.seconds);
      for (size_t i = 0, n = options.size(); i < n; ++i) {
        SmallSearch::Score lean;
        std::vector<int> fewer =
            search.Descend(options[i].host_of, SmallSearch::Order::kBytes,
                           quickest * slack, &lean);
        options.push_back({std::move(fewer), std::move(lean)});
      }
    }
    const SmallSearch::Score* most = nullptr;
    for (const Option& o : options) {
      if (o.score.fits &&
          (most == nullptr || SmallSearch::MoreRecoverable(o.score, *most) > 0))
        most = &o.score;
    }
    auto as_recoverable = [&](const Option& o) {
      return o.score.fits && most != nullptr &&
             SmallSearch::MoreRecoverable(o.score, *most) == 0;
    };
    double shortest = std::numeric_limits<double>::infinity();
    for (const Option& o : options) {
      if (as_recoverable(o)) shortest = std::min(shortest, o.score.seconds);
    }
    const Option* chosen = nullptr;
    auto tied = [&](const Option& o) {
      return as_recoverable(o) && o.score.seconds <= shortest * slack;
    };
    for (const Option& o : options) {
      if (!tied(o)) continue;
      if (chosen == nullptr || o.score.bytes < chosen->score.bytes) chosen = &o;
    }
    auto placement_of = [&](const std::vector<int>& unit_host) {
      Placement p;
      p.host.assign(world, -1);
      p.device.assign(world, -1);
      std::vector<int> next(cands.size(), 0);
      for (int u = 0; u < units; ++u) {
        const Candidate& c = cands[unit_host[u]];
        for (int r : unit_ranks[u]) {
          p.host[r] = c.host;
          p.device[r] = c.free[next[unit_host[u]]++];
        }
      }
      return p;
    };
    // Placements equal by that rule (as recoverable, within the slack, the
    // same bytes) differ in how the plan spreads the sends: of the first
    // kTiesPlanned that differ in what some host needs, the one whose
    // busiest sender sends least (the earliest on a tie).
    if (chosen != nullptr && chosen->score.bytes > 0) {
      std::vector<const Option*> ties;
      std::set<std::vector<int>> seen;  // per host, the kinds of its units
      for (const Option& o : options) {
        if (!tied(o) || o.score.bytes != chosen->score.bytes) continue;
        std::vector<std::vector<int>> kinds(cands.size());
        for (int u = 0; u < units; ++u)
          kinds[o.host_of[u]].push_back(unit_kind[u]);
        std::vector<int> key;
        for (std::vector<int>& k : kinds) {
          std::sort(k.begin(), k.end());
          key.insert(key.end(), k.begin(), k.end());
          key.push_back(-1);
        }
        if (!seen.insert(std::move(key)).second) continue;
        ties.push_back(&o);
        if (static_cast<int>(ties.size()) == kTiesPlanned) break;
      }
      int64_t least = std::numeric_limits<int64_t>::max();
      for (size_t i = 0; ties.size() > 1 && i < ties.size(); ++i) {
        const Placement p = placement_of(ties[i]->host_of);
        PlanInput in;
        in.spec = &spec;
        in.cluster = &cluster;
        in.source = req.source;
        in.source_placement = req.source_placement;
        in.target = req.target;
        in.target_placement = &p;
        in.alive = req.alive;
        in.source_lost = req.source_lost;
        const absl::StatusOr<Plan> plan = PlanReconfiguration(in);
        if (plan.ok() && plan->summary.max_host_send_bytes < least) {
          least = plan->summary.max_host_send_bytes;
          chosen = ties[i];
        }
      }
    }
    if (chosen != nullptr && chosen->host_of != host_of) {
      absl::StatusOr<PlacementResult> result =
          EvaluatePlacement(req, placement_of(chosen->host_of));
      if (result.ok()) result->proven_best = whole;
      return result;
    }
    best->proven_best = whole;
  }
  if (best.ok()) {
    // The hosts' part from the blocks (each used host holds what its
    // block needs), not another pass over every shard; then the domains.
    const Grouping& g = groupings[best_grouping];
    SurvivalReport& report = best->survival;
    report = SurvivalLevels(spec, *req.target, best->placement, cluster, false,
                            req.small_objects_kept);
    const std::vector<bool> survives = SurvivingGroups(*req.target, g.needs);
    const std::vector<std::string> small = SmallObjectsOnlyIn(
        spec, *req.target, static_cast<int>(cluster.hosts.size()),
        [&](int rank) { return best->placement.host[rank]; },
        req.small_objects_kept);
    std::vector<std::vector<int32_t>> count;
    std::vector<char> seen(cluster.hosts.size(), 0);
    for (int r = 0; r < world; ++r) {
      const int h = best->placement.host[r];
      if (seen[h]) continue;
      seen[h] = 1;
      ++report.hosts;
      const int block = g.block_of_unit[unit_of[r]];
      if (!survives[block] || !small[h].empty()) {
        report.hosts_lost.push_back(
            {cluster.hosts[h].name,
             report.hosts_lost.size() >= kLossesShown ? ""
             : !survives[block]
                 ? OnlyThere(spec, *req.target, g.needs, block, &count)
                 : small[h]});
      }
    }
  }
  return best;
}

}  // namespace ptc
