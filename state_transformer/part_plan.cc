#include "state_transformer/part_plan.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace ptc {
namespace {

int64_t PieceBytes(const FragmentJob& job, const FragmentPiece& p) {
  return p.region.volume() * ElementSize(job.tensors[p.tensor].dtype);
}

// Groups `work` (indexes of pieces, in plan order) into parts: a local
// piece alone, pieces of one remote source (or the snapshot) in plan order
// up to kBatchBytes and kMaxBatchPieces; then deals the parts round-robin
// over their sources, starting at a source chosen by the host id.
std::vector<FragmentPart> MakeParts(const FragmentJob& job,
                                    const std::vector<int32_t>& work) {
  std::map<int32_t, std::vector<FragmentPart>> by_source;
  for (const int32_t i : work) {
    const FragmentPiece& p = job.pieces[i];
    std::vector<FragmentPart>& parts = by_source[p.source_host];
    const int64_t bytes = PieceBytes(job, p);
    const bool local = p.source_host == job.host;
    if (local || parts.empty() || parts.back().bytes + bytes > kBatchBytes ||
        parts.back().pieces.size() >= kMaxBatchPieces) {
      FragmentPart part;
      part.source_host = p.source_host;
      part.method = local ? PartMethod::kCopy
                    : p.source_host == kFromSnapshot ? PartMethod::kSnapshot
                                                     : PartMethod::kPull;
      parts.push_back(std::move(part));
    }
    parts.back().pieces.push_back(i);
    parts.back().bytes += bytes;
  }
  std::vector<std::vector<FragmentPart>*> queues;
  size_t total = 0;
  for (auto& [source, parts] : by_source) {
    queues.push_back(&parts);
    total += parts.size();
  }
  std::vector<FragmentPart> out;
  if (queues.empty()) return out;
  out.reserve(total);
  std::vector<size_t> next(queues.size(), 0);
  size_t q = static_cast<size_t>(job.host) % queues.size();
  while (out.size() < total) {
    if (next[q] < queues[q]->size())
      out.push_back(std::move((*queues[q])[next[q]++]));
    q = (q + 1) % queues.size();
  }
  return out;
}

}  // namespace

const char* PartMethodName(PartMethod m) {
  switch (m) {
    case PartMethod::kLink:
      return "link";
    case PartMethod::kCopy:
      return "copy";
    case PartMethod::kPull:
      return "pull";
    case PartMethod::kSnapshot:
      return "snapshot";
  }
  return "unknown";
}

FragmentPartPlan PlanFragmentParts(const FragmentJob& job,
                                   const std::vector<bool>& stored_exactly) {
  FragmentPartPlan plan;
  std::set<std::pair<int32_t, Region>> kept;  // pieces this host keeps
  for (const FragmentPiece& p : job.pieces) {
    if (p.source_host == job.host) kept.insert({p.tensor, p.region});
  }
  std::set<std::pair<int32_t, Region>> linked;
  std::vector<std::vector<int32_t>> staged_of(job.tensors.size());
  for (size_t h = 0; h < job.holds.size(); ++h) {
    const auto& [t, region] = job.holds[h];
    if (h < stored_exactly.size() && stored_exactly[h] &&
        kept.count({t, region})) {
      plan.linked.push_back(static_cast<int32_t>(h));
      linked.insert({t, region});
    } else {
      staged_of[t].push_back(static_cast<int32_t>(plan.staged.size()));
      plan.staged.push_back(static_cast<int32_t>(h));
    }
  }
  plan.lands_in.resize(job.pieces.size());
  std::vector<int32_t> work;
  for (size_t i = 0; i < job.pieces.size(); ++i) {
    const FragmentPiece& p = job.pieces[i];
    const int64_t bytes = PieceBytes(job, p);
    plan.bytes_total += bytes;
    for (const int32_t s : staged_of[p.tensor]) {
      if (job.holds[plan.staged[s]].second.Intersects(p.region))
        plan.lands_in[i].push_back(s);
    }
    // A piece kept in place needs no bytes moved, unless a staged region
    // of its tensor overlaps it (a host's regions may overlap): then it is
    // copied into those.
    if (p.source_host == job.host && linked.count({p.tensor, p.region}) &&
        plan.lands_in[i].empty()) {
      plan.in_place.push_back(static_cast<int32_t>(i));
      plan.bytes_in_place += bytes;
    } else {
      work.push_back(static_cast<int32_t>(i));
    }
  }
  plan.parts = MakeParts(job, work);
  return plan;
}

}  // namespace ptc
