#include "plan/plan_flows.h"

#include <map>
#include <utility>

namespace ptc {
namespace {

int64_t Bytes(const PlanInput& input, const Transfer& t) {
  return t.region.volume() * ElementSize(input.spec->tensors[t.tensor].dtype);
}

}  // namespace

std::vector<HostFlow> HostFlows(const PlanInput& input, const Plan& plan) {
  std::map<std::pair<int32_t, int32_t>, int64_t> bytes;
  for (const HostFragment& f : plan.fragments) {
    for (const Transfer& t : f.transfers)
      bytes[{t.source_host, t.target_host}] += Bytes(input, t);
  }
  std::vector<HostFlow> out;
  out.reserve(bytes.size());
  for (const auto& [pair, b] : bytes) out.push_back({pair.first, pair.second, b});
  return out;
}

std::vector<int64_t> FragmentBytes(const PlanInput& input, const Plan& plan) {
  std::vector<int64_t> out;
  out.reserve(plan.fragments.size());
  for (const HostFragment& f : plan.fragments) {
    int64_t total = 0;
    ForEachPiece(f, [&](const Transfer& t) { total += Bytes(input, t); });
    out.push_back(total);
  }
  return out;
}

}  // namespace ptc
