#include "state_transformer/fragment_executor.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/small_object.h"

namespace ptc {
namespace {

Counter& pieces_total = GetCounter("ptc_transformer_pieces_total");
Counter& replica_fetches_total =
    GetCounter("ptc_transformer_pieces_from_other_replicas_total");

// A source host that failed (died, stalled, went away) rather than a piece
// that is wrong: its pieces may come from another holder.
bool IsPeerFailure(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}
Counter& bytes_received_total =
    GetCounter("ptc_transformer_bytes_received_total");
Counter& bytes_copied_local_total =
    GetCounter("ptc_transformer_bytes_copied_local_total");

// A staged region and its pending put.
struct Staged {
  Region region;
  PendingPut* put;
};

// Copies `box` (whose bytes are `src`, dense) into every staged region of
// the tensor that it intersects.
void Scatter(const char* src, const Region& box,
             const std::vector<Staged>& staged, int64_t elem) {
  for (const Staged& s : staged) {
    const Region part = box.Intersect(s.region);
    if (!part.empty())
      CopyRegion(src, box, s.put->buffer->mutable_data(), s.region, part, elem);
  }
}

using Batch = std::vector<const FragmentPiece*>;

// At most this many pieces per batch (each is a few parts of a control
// call; kMaxPartsPerCall bounds those).
constexpr size_t kMaxBatchPieces = 256;

// Groups the pieces to copy into batches: a local piece alone, remote
// pieces of one source in plan order up to kBatchBytes. Orders the batches
// round-robin over their source hosts, starting at a source chosen by
// `host`, so that the pulls in flight keep every sender busy (the plan
// balances bytes per sender; pulling one sender's pieces after another's
// would leave the others idle) and target hosts start on different
// senders.
std::vector<Batch> MakeBatches(const std::vector<const FragmentPiece*>& work,
                               const FragmentJob& job) {
  std::map<int32_t, std::vector<Batch>> by_source;
  std::map<int32_t, int64_t> open_bytes;  // of each source's last batch
  for (const FragmentPiece* p : work) {
    std::vector<Batch>& batches = by_source[p->source_host];
    const int64_t bytes =
        p->region.volume() * ElementSize(job.tensors[p->tensor].dtype);
    int64_t& open = open_bytes[p->source_host];
    if (p->source_host == job.host || batches.empty() ||
        open + bytes > kBatchBytes ||
        batches.back().size() >= kMaxBatchPieces) {
      batches.push_back({});
      open = 0;
    }
    batches.back().push_back(p);
    open += bytes;
  }
  std::vector<std::vector<Batch>*> queues;
  size_t total = 0;
  for (auto& [source, batches] : by_source) {
    queues.push_back(&batches);
    total += batches.size();
  }
  std::vector<Batch> out;
  if (queues.empty()) return out;
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

absl::Status ValidateFragment(const FragmentJob& job) {
  if (job.parallel_pulls < 1 || job.parallel_pulls > kMaxParallelPulls) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel pulls ", job.parallel_pulls,
                     " is out of range; use 1 to ", kMaxParallelPulls));
  }
  const int num_tensors = static_cast<int>(job.tensors.size());
  auto check = [&](int32_t t, const Region& region,
                   const char* what) -> absl::Status {
    if (t < 0 || t >= num_tensors) {
      return absl::InvalidArgumentError(
          absl::StrCat("the fragment ", what, " unknown tensor id ", t,
                       " (it declares ", num_tensors, " tensors)"));
    }
    return Annotate(ValidateRegion(region, job.tensors[t].shape),
                    absl::StrCat("the fragment ", what, " tensor '",
                                 job.tensors[t].key, "'"));
  };
  std::vector<std::vector<const Region*>> pieces(num_tensors);
  for (const FragmentPiece& p : job.pieces) {
    PTC_RETURN_IF_ERROR(check(p.tensor, p.region, "moves a piece of"));
    if (p.region.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the fragment moves an empty piece ", p.region.ToString(),
          " of tensor '", job.tensors[p.tensor].key, "'"));
    }
    pieces[p.tensor].push_back(&p.region);
  }
  for (const auto& [t, region] : job.holds) {
    PTC_RETURN_IF_ERROR(check(t, region, "holds"));
    std::vector<Region> missing = {region};
    for (const Region* piece : pieces[t]) {
      std::vector<Region> still;
      for (const Region& m : missing) {
        if (!m.Intersects(*piece)) {
          still.push_back(m);
          continue;
        }
        for (Region& rest : m.Difference(*piece))
          still.push_back(std::move(rest));
      }
      missing.swap(still);
      if (missing.empty()) break;
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the fragment holds ", region.ToString(), " of tensor '",
                       job.tensors[t].key, "' but no piece fills ",
                       missing[0].ToString(), "; the plan is incomplete"));
    }
  }
  return absl::OkStatus();
}

GrpcPieceTransport::GrpcPieceTransport(
    const std::map<int32_t, std::string>& peers,
    std::map<int32_t, std::string> names)
    : addresses_(peers), names_(std::move(names)) {
  for (const auto& [host, address] : peers) {
    auto name = names_.find(host);
    clients_[host] =
        StoreClient::Connect(address, name != names_.end() ? name->second : "");
  }
}

absl::StatusOr<StoreClient*> GrpcPieceTransport::ClientFor(int32_t host) {
  auto it = clients_.find(host);
  if (it == clients_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan names source host ", host,
                     " but no address was given for it"));
  }
  return it->second.get();
}

absl::Status GrpcPieceTransport::Fetch(int32_t host, const std::string& job,
                                       int64_t version,
                                       const std::string& tensor,
                                       const Region& region,
                                       int64_t /*element_size*/,
                                       const StoreClient::Consumer& consume) {
  PTC_ASSIGN_OR_RETURN(StoreClient * client, ClientFor(host));
  auto got = client->ReadWith(job, version, tensor, region, consume);
  if (!got.ok()) {
    const auto name = names_.find(host);
    return Annotate(
        got.status(),
        absl::StrCat(
            "pulling ", region.ToString(), " of '", tensor, "' from ",
            name != names_.end() ? name->second : absl::StrCat("host ", host),
            " (", addresses_[host], ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcPieceTransport::FetchSmallObject(
    int32_t host, const std::string& job, int64_t version,
    const std::string& name, int32_t rank) {
  PTC_ASSIGN_OR_RETURN(StoreClient * client, ClientFor(host));
  auto got = client->GetSmallObject(job, version, name, rank);
  if (!got.ok()) {
    const auto n = names_.find(host);
    return Annotate(
        got.status(),
        absl::StrCat(
            "pulling small object '", name, "' of rank ", rank, " from ",
            n != names_.end() ? n->second : absl::StrCat("host ", host), " (",
            addresses_[host], ")"));
  }
  return got;
}

absl::Status ExecuteFragment(
    Store* store, const FragmentJob& job, PieceTransport* transport,
    const std::function<void(const FragmentProgress&)>& progress) {
  PTC_RETURN_IF_ERROR(ValidateFragment(job));
  PTC_RETURN_IF_ERROR(store->DeclareTensors(job.job, job.tensors).status());
  const int num_tensors = static_cast<int>(job.tensors.size());
  // A held region that this host already stores unchanged in the source
  // version is linked, not copied: versions share immutable buffers.
  std::set<std::pair<int32_t, Region>> in_place;
  for (const FragmentPiece& p : job.pieces) {
    if (p.source_host == job.host) in_place.insert({p.tensor, p.region});
  }
  std::vector<std::pair<int32_t, StoredRegionRef>> links;
  // Stage every other held region: invisible until all are published.
  std::vector<std::unique_ptr<PendingPut>> pending;
  std::vector<std::vector<Staged>> staged(num_tensors);
  for (const auto& [t, region] : job.holds) {
    if (in_place.count({t, region})) {
      auto view = store->OpenRead(job.job, job.source_version,
                                  job.tensors[t].key, region);
      if (view.ok() && view->exact) {
        links.push_back({t, view->sources[0]});
        continue;
      }
    }
    PTC_ASSIGN_OR_RETURN(
        std::unique_ptr<PendingPut> put,
        store->BeginPut(job.job, job.target_version, job.tensors[t].key, region,
                        std::nullopt, true, job.plan_epoch));
    staged[t].push_back({region, put.get()});
    pending.push_back(std::move(put));
  }
  FragmentProgress totals;
  std::set<std::pair<int32_t, Region>> linked;
  for (const auto& [t, ref] : links) linked.insert({t, ref.region});
  std::vector<const FragmentPiece*> work;  // pieces that need copying
  for (const FragmentPiece& p : job.pieces) {
    const int64_t bytes =
        p.region.volume() * ElementSize(job.tensors[p.tensor].dtype);
    totals.bytes_total += bytes;
    // A piece kept in place needs no copy, unless a staged region of the
    // tensor overlaps it (distinct regions of a host may overlap): then it
    // is copied into those (Scatter skips the linked region itself).
    const bool feeds_staged = std::any_of(
        staged[p.tensor].begin(), staged[p.tensor].end(),
        [&](const Staged& s) { return s.region.Intersects(p.region); });
    if (p.source_host == job.host && linked.count({p.tensor, p.region}) &&
        !feeds_staged) {
      totals.bytes_done += bytes;  // kept in place: nothing to move
      ++totals.pieces_done;
    } else {
      work.push_back(&p);
    }
  }
  totals.pieces_total = static_cast<int64_t>(job.pieces.size());
  if (progress) progress(totals);
  const std::vector<Batch> batches = MakeBatches(work, job);

  absl::Mutex mu;
  absl::Status failure;
  std::atomic<size_t> next{0};
  auto copy_local = [&](const FragmentPiece& p) -> absl::Status {
    const TensorDecl& decl = job.tensors[p.tensor];
    const int64_t elem = ElementSize(decl.dtype);
    PTC_ASSIGN_OR_RETURN(
        ReadView view,
        store->OpenRead(job.job, job.source_version, decl.key, p.region));
    return ForEachCoveringPiece(
        p.region, view.sources,
        [&](const Region& sub, const StoredRegionRef& s) {
          for (const Staged& st : staged[p.tensor]) {
            const Region part = sub.Intersect(st.region);
            if (!part.empty()) {
              CopyRegion(s.buffer->data(), s.region,
                         st.put->buffer->mutable_data(), st.region, part, elem);
            }
          }
        });
  };
  auto fetch_remote = [&](const Batch& batch, int32_t source) -> absl::Status {
    const size_t n = batch.size();
    std::vector<std::vector<PieceTarget>> targets(n);
    std::vector<StoreClient::Consumer> consumers(n);
    std::vector<absl::Status> bad_chunks(n);
    std::vector<PieceTransport::BatchPiece> pieces(n);
    for (size_t i = 0; i < n; ++i) {
      const FragmentPiece& p = *batch[i];
      const int64_t elem = ElementSize(job.tensors[p.tensor].dtype);
      for (const Staged& st : staged[p.tensor]) {
        if (st.region.Intersects(p.region))
          targets[i].push_back({st.region, st.put->buffer->mutable_data()});
      }
      // For what a transport streams rather than places itself.
      consumers[i] = [&, i, elem](int64_t offset, const char* data,
                                  int64_t bytes) {
        const FragmentPiece& p = *batch[i];
        if (offset % elem != 0 || bytes % elem != 0) {
          bad_chunks[i] =
              absl::DataLossError("a peer sent a chunk that splits an element");
          return;
        }
        const int64_t first = offset / elem;
        int64_t at = 0;
        for (const Region& box :
             FlatRangeOfRegion(p.region, first, first + bytes / elem)) {
          Scatter(data + at, box, staged[p.tensor], elem);
          at += box.volume() * elem;
        }
      };
      pieces[i] = {&job.tensors[p.tensor].key, p.region, elem, targets[i],
                   &consumers[i]};
    }
    PTC_RETURN_IF_ERROR(
        transport->FetchBatch(source, job.job, job.source_version, pieces));
    for (absl::Status& s : bad_chunks) PTC_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  };
  // Sources that failed in this fragment: their later batches go straight
  // to the pieces' other holders.
  std::set<int32_t> failed_sources;
  auto source_failed = [&](int32_t host) {
    absl::MutexLock lock(&mu);
    return failed_sources.count(host) > 0;
  };
  // A batch whose source failed: each piece from its other holders in
  // turn; an error names the piece and every source tried.
  auto fetch_from_alternates = [&](const Batch& batch,
                                   const absl::Status& first) -> absl::Status {
    for (const FragmentPiece* p : batch) {
      std::vector<std::string> tried = {
          absl::StrCat("host ", p->source_host, ": ", first.message())};
      bool done = false;
      for (int32_t alt : p->alternates) {
        if (alt == job.host || alt == p->source_host || source_failed(alt))
          continue;
        const absl::Status s = fetch_remote({p}, alt);
        if (s.ok()) {
          done = true;
          replica_fetches_total.Add();
          Log("transformer")
              ->warn(
                  "job {}: piece {} of '{}' taken from host {} instead of "
                  "host {}",
                  job.job, p->region.ToString(), job.tensors[p->tensor].key,
                  alt, p->source_host);
          break;
        }
        tried.push_back(absl::StrCat("host ", alt, ": ", s.message()));
        if (IsPeerFailure(s)) {
          absl::MutexLock lock(&mu);
          failed_sources.insert(alt);
        }
      }
      if (!done) {
        return absl::UnavailableError(
            absl::StrCat("no live source left for piece ", p->region.ToString(),
                         " of tensor '", job.tensors[p->tensor].key, "' (",
                         absl::StrJoin(tried, "; "), ")"));
      }
    }
    return absl::OkStatus();
  };
  auto worker = [&] {
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (!failure.ok()) return;
      }
      const size_t i = next.fetch_add(1);
      if (i >= batches.size()) return;
      const Batch& batch = batches[i];
      const FragmentPiece& first = *batch.front();
      const bool local = first.source_host == job.host;
      absl::Status s;
      if (local) {
        s = copy_local(first);
      } else if (source_failed(first.source_host)) {
        s = fetch_from_alternates(
            batch, absl::UnavailableError("failed earlier in this change"));
      } else {
        s = fetch_remote(batch, first.source_host);
        if (!s.ok() && IsPeerFailure(s)) {
          {
            absl::MutexLock lock(&mu);
            failed_sources.insert(first.source_host);
          }
          s = fetch_from_alternates(batch, s);
        }
      }
      int64_t bytes = 0;
      for (const FragmentPiece* p : batch)
        bytes += p->region.volume() * ElementSize(job.tensors[p->tensor].dtype);
      absl::MutexLock lock(&mu);
      if (!s.ok()) {
        if (failure.ok() && absl::StartsWith(s.message(), "no live source")) {
          failure = s;
        } else if (failure.ok()) {
          failure = Annotate(
              s, batch.size() == 1
                     ? absl::StrCat("piece ", first.region.ToString(),
                                    " of tensor '",
                                    job.tensors[first.tensor].key, "'")
                     : absl::StrCat("a batch of ", batch.size(),
                                    " pieces from ",
                                    first.source_host < 0
                                        ? std::string("the snapshot")
                                        : absl::StrCat("host ",
                                                       first.source_host)));
        }
        return;
      }
      pieces_total.Add(batch.size());
      (local ? bytes_copied_local_total : bytes_received_total).Add(bytes);
      totals.bytes_done += bytes;
      // From a peer (a negative source host is the job's snapshot).
      if (!local && first.source_host >= 0) totals.remote_bytes_done += bytes;
      totals.pieces_done += batch.size();
      if (progress) progress(totals);
    }
  };
  const int threads =
      std::min<int>(job.parallel_pulls, std::max<size_t>(1, batches.size()));
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  if (!failure.ok()) return failure;  // pending puts are dropped: nothing stays

  for (size_t i = 0; i < pending.size(); ++i) {
    auto sum = store->FinishPut(std::move(pending[i]));
    if (!sum.ok()) {
      store->DeleteStaged(job.job, job.target_version, job.plan_epoch);
      return sum.status();
    }
  }
  for (const auto& [t, ref] : links) {
    if (absl::Status s = store->Link(job.job, job.target_version,
                                     job.tensors[t].key, ref, job.plan_epoch);
        !s.ok()) {
      store->DeleteStaged(job.job, job.target_version, job.plan_epoch);
      return s;
    }
  }
  for (const FragmentSmallObject& o : job.small_objects) {
    absl::StatusOr<std::string> bytes;
    if (!o.derive_from.empty()) {
      bytes = DerivedSmallObject(o.name, o.derive_from, job.target_version);
    } else if (o.source_host == job.host) {
      auto ref = store->GetSmallObject(job.job, job.source_version, o.name,
                                       o.source_rank);
      if (ref.ok())
        bytes = *ref->bytes;
      else
        bytes = ref.status();
    } else {
      bytes = transport->FetchSmallObject(
          o.source_host, job.job, job.source_version, o.name, o.source_rank);
    }
    absl::Status s = bytes.status();
    if (s.ok()) {
      s = store->PutSmallObject(job.job, job.target_version, o.name,
                                o.target_rank, *std::move(bytes), 0,
                                job.plan_epoch);
    }
    if (!s.ok()) {
      store->DeleteStaged(job.job, job.target_version, job.plan_epoch);
      return Annotate(s, absl::StrCat("small object '", o.name,
                                      "' for target rank ", o.target_rank));
    }
  }
  Log("transformer")
      ->info(
          "job {}: version {} staged on host {} ({} pieces, {} bytes, {} from "
          "peers, {} regions kept in place, {} small objects)",
          job.job, job.target_version, job.host, totals.pieces_done,
          totals.bytes_done, totals.remote_bytes_done, links.size(),
          job.small_objects.size());
  return absl::OkStatus();
}

}  // namespace ptc
