#include "state_transformer/fragment_executor.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/parallel_for.h"
#include "common/status_macros.h"
#include "ptc/fingerprint.h"
#include "ptc/small_object.h"
#include "state_transformer/part_plan.h"

namespace ptc {
namespace {

Counter& pieces_total = GetCounter("ptc_transformer_pieces_total");
Counter& replica_fetches_total =
    GetCounter("ptc_transformer_pieces_from_other_replicas_total");
Counter& slow_source_retries_total =
    GetCounter("ptc_transformer_pieces_from_slow_sources_total");
Counter& bytes_received_total =
    GetCounter("ptc_transformer_bytes_received_total");
Counter& bytes_copied_local_total =
    GetCounter("ptc_transformer_bytes_copied_local_total");
// Staged bytes whose fingerprint was added up while they were written, and
// those that the proof of the version reads again.
Counter& fingerprinted_while_staging_total =
    GetCounter("ptc_transformer_bytes_fingerprinted_while_staging_total");
Counter& fingerprinted_after_staging_total =
    GetCounter("ptc_transformer_bytes_fingerprinted_after_staging_total");

// How much of a local copy is copied and fingerprinted at a time.
constexpr int64_t kBlockBytes = int64_t{512} << 10;

// A source host that failed (died, stalled, went away) rather than a piece
// that is wrong: its pieces may come from another holder.
bool IsPeerFailure(const absl::Status& s) {
  // Still refused for its busy threads once its transfer's time was spent
  // asking again (GrpcPieceTransport): as slow.
  if (IsBusy(s)) return true;
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

// Runs one fragment's parts against the store: the target version's
// staged buffers, the transport, and the record of sources that failed.
// Its life cycle is Stage, then Run for every part (from any number of
// threads), then Publish; anything short of a Publish that returned OK
// deletes the staged version in the destructor (the one rollback).
class FragmentRun {
 public:
  // The payload of an error that ran out of sources for a piece (its
  // message names the piece itself, so callers add no context).
  static constexpr char kNoLiveSourceUrl[] = "ptc/no-live-source";
  static bool NamesNoLiveSource(const absl::Status& s) {
    return s.GetPayload(kNoLiveSourceUrl).has_value();
  }

  FragmentRun(Store* store, const FragmentJob& job,
              const FragmentPartPlan& plan, PieceTransport* transport)
      : store_(store), job_(job), plan_(plan), transport_(transport) {}
  ~FragmentRun() {
    if (!published_) {
      puts_.clear();  // dropped puts leave nothing behind
      store_->DeleteStaged(job_.job, job_.target_version, job_.plan_epoch);
    }
  }

  // Reserves a buffer for every staged hold, invisible until Publish. A
  // small buffer that only local copies fill is not mapped: they write
  // through its memfd (mapping a small buffer page by page costs more than
  // the copy on a VM). One of a huge page or more is mapped in huge pages
  // (shared memory's writes through the memfd take 4 KiB pages, each
  // allocated, charged and put on the page cache's lists by the kernel:
  // most of a local change's CPU), and one that a transport fills is
  // mapped, as transports write into memory.
  absl::Status Stage() {
    std::vector<bool> mapped(plan_.staged.size(), false);
    for (const FragmentPart& part : plan_.parts) {
      if (part.method == PartMethod::kCopy) continue;
      for (const int32_t piece : part.pieces)
        for (const int32_t st : plan_.lands_in[piece]) mapped[st] = true;
    }
    for (size_t st = 0; st < plan_.staged.size(); ++st) {
      const auto& [t, region] = job_.holds[plan_.staged[st]];
      if (region.volume() * ElementSize(job_.tensors[t].dtype) >=
          kHugePageBytes)
        mapped[st] = true;
      PTC_ASSIGN_OR_RETURN(
          std::unique_ptr<PendingPut> put,
          store_->BeginPut(job_.job, job_.target_version, job_.tensors[t].key,
                           region, std::nullopt, mapped[st], job_.plan_epoch));
      puts_.push_back(std::move(put));
      sums_.push_back(std::make_unique<StagedSums>());
    }
    return absl::OkStatus();
  }

  // Moves the bytes of `part` into the staged buffers. Thread-safe.
  absl::Status Run(const FragmentPart& part) {
    switch (part.method) {
      case PartMethod::kCopy:
        return CopyLocal(job_.pieces[part.pieces.front()],
                         plan_.lands_in[part.pieces.front()]);
      case PartMethod::kPull:
      case PartMethod::kSnapshot:
        if (SourceFailed(part.source_host)) {
          return FromAlternates(
              part, absl::UnavailableError("failed earlier in this change"));
        }
        if (absl::Status s = Fetch(part.pieces, part.source_host);
            !s.ok()) {
          if (part.method == PartMethod::kSnapshot || !IsPeerFailure(s))
            return s;
          MarkFailed(part.source_host, s);
          return FromAlternates(part, s);
        }
        return absl::OkStatus();
      case PartMethod::kLink:
        break;
    }
    return absl::InternalError("a part of an unknown method");
  }

  // Seals and publishes the staged buffers, links the regions kept in
  // place and puts the small objects: the target version is complete.
  absl::Status Publish() {
    for (size_t st = 0; st < puts_.size(); ++st) {
      const int64_t volume = StagedRegion(st).volume();
      puts_[st]->fingerprint = sums_[st]->Whole(volume);
      (puts_[st]->fingerprint ? fingerprinted_while_staging_total
                              : fingerprinted_after_staging_total)
          .Add(puts_[st]->bytes);
      PTC_RETURN_IF_ERROR(store_
                              ->FinishPut(std::move(puts_[st]),
                                          sums_[st]->WholeChecksum(volume))
                              .status());
    }
    for (const int32_t h : plan_.linked) {
      const auto& [t, region] = job_.holds[h];
      const std::string& key = job_.tensors[t].key;
      PTC_ASSIGN_OR_RETURN(
          ReadView view,
          store_->OpenRead(job_.job, job_.source_version, key, region));
      PTC_RETURN_IF_ERROR(store_->Link(job_.job, job_.target_version, key,
                                       view.sources[0], job_.plan_epoch));
    }
    std::vector<std::optional<std::string>> fetched = FetchSmallObjectsByHost();
    for (size_t i = 0; i < job_.small_objects.size(); ++i) {
      const SmallObjectMove& o = job_.small_objects[i];
      PTC_RETURN_IF_ERROR(
          Annotate(PutSmallObject(o, std::move(fetched[i])),
                   absl::StrCat("small object '", o.name, "' for target rank ",
                                o.target_rank)));
    }
    published_ = true;
    return absl::OkStatus();
  }

 private:
  uint8_t* Buffer(int32_t staged) const {
    return puts_[staged]->buffer->mutable_data();
  }
  const Region& StagedRegion(int32_t staged) const {
    return job_.holds[plan_.staged[staged]].second;
  }

  absl::Status CopyLocal(const FragmentPiece& p,
                         const std::vector<int32_t>& lands_in) {
    const TensorDecl& decl = job_.tensors[p.tensor];
    const int64_t elem = ElementSize(decl.dtype);
    PTC_ASSIGN_OR_RETURN(
        ReadView view,
        store_->OpenRead(job_.job, job_.source_version, decl.key, p.region));
    // A small source is read through its memfd once, not mapped.
    std::vector<uint8_t> scratch;
    const RegionBuffer* read = nullptr;
    const uint8_t* src = nullptr;
    absl::Status written;
    PTC_RETURN_IF_ERROR(ForEachCoveringPiece(
        p.region, view.sources,
        [&](const Region& sub, const StoredRegionRef& s) {
          if (s.buffer->hollow()) return;  // metadata only: nothing to copy
          if (read != s.buffer.get()) {
            read = s.buffer.get();
            src = read->ReadableBytes(&scratch);
          }
          for (const int32_t st : lands_in) {
            const Region part = sub.Intersect(StagedRegion(st));
            if (part.empty()) continue;
            // A few hundred KiB at a time: each block is fingerprinted
            // right after it is copied, while in cache.
            const int64_t volume = part.volume();
            const int64_t block = std::max<int64_t>(1, kBlockBytes / elem);
            uint64_t fingerprint = 0;
            for (int64_t first = 0; first < volume && written.ok();
                 first += block) {
              for (const Region& box : FlatRangeOfRegion(
                       part, first, std::min(volume, first + block))) {
                // Read back where it lies in the staged buffer (by the
                // buffer's own geometry); one written through its memfd,
                // from the source.
                if (Buffer(st) != nullptr) {
                  CopyRegion(src, s.region, Buffer(st), StagedRegion(st), box,
                             elem);
                  fingerprint += FingerprintRegion(Buffer(st), StagedRegion(st),
                                                   box, decl.shape, elem);
                } else {
                  written = WriteRuns(src, s.region, *puts_[st]->buffer,
                                      StagedRegion(st), box, elem);
                  fingerprint +=
                      FingerprintRegion(src, s.region, box, decl.shape, elem);
                }
              }
            }
            if (written.ok()) sums_[st]->Add(fingerprint, volume);
          }
        }));
    return written;
  }

  // CopyRegion into an unmapped buffer: each contiguous run (runs that
  // continue one another merged) written through its memfd.
  static absl::Status WriteRuns(const uint8_t* src, const Region& src_box,
                                RegionBuffer& dst, const Region& dst_box,
                                const Region& what, int64_t elem) {
    absl::Status status;
    int64_t from = 0, to = 0, len = 0;
    auto flush = [&] {
      if (len > 0 && status.ok()) status = dst.WriteFrom(to, src + from, len);
      len = 0;
    };
    ForEachRun(src_box, dst_box, what, elem,
               [&](int64_t src_off, int64_t dst_off, int64_t n) {
                 if (len > 0 && src_off == from + len && dst_off == to + len) {
                   len += n;
                   return;
                 }
                 flush();
                 from = src_off;
                 to = dst_off;
                 len = n;
               });
    flush();
    return status;
  }

  // Pieces (indexes) from `source` in one batch of the transport: each
  // lands in its staged buffers directly when the transport can place
  // bytes, else through a consumer that scatters streamed chunks.
  absl::Status Fetch(const std::vector<int32_t>& indexes, int32_t source) {
    const size_t n = indexes.size();
    std::vector<std::vector<PieceTarget>> targets(n);
    std::vector<StoreClient::Consumer> consumers(n);
    std::vector<absl::Status> bad_chunks(n);
    std::vector<PieceTransport::BatchPiece> batch(n);
    for (size_t i = 0; i < n; ++i) {
      const FragmentPiece& p = job_.pieces[indexes[i]];
      const std::vector<int32_t>& lands_in = plan_.lands_in[indexes[i]];
      const int64_t elem = ElementSize(job_.tensors[p.tensor].dtype);
      const TensorDecl& decl = job_.tensors[p.tensor];
      for (const int32_t st : lands_in) {
        targets[i].push_back(
            {StagedRegion(st), Buffer(st), sums_[st].get(), decl.shape});
      }
      consumers[i] = [&, i, elem](int64_t offset, const char* data,
                                  int64_t bytes) {
        const FragmentPiece& piece = job_.pieces[indexes[i]];
        if (offset % elem != 0 || bytes % elem != 0) {
          bad_chunks[i] =
              absl::DataLossError("a peer sent a chunk that splits an element");
          return;
        }
        // A hollow store's pieces stand for bytes that are not there.
        if (store_->hollow()) return;
        const int64_t first = offset / elem;
        for (const Region& box :
             FlatRangeOfRegion(piece.region, first, first + bytes / elem)) {
          for (const PieceTarget& t : targets[i]) {
            const Region part = box.Intersect(t.region);
            if (part.empty()) continue;
            CopyRegion(data, box, t.data, t.region, part, elem);
            t.sums->incomplete = true;  // fingerprinted when proven
          }
          data += box.volume() * elem;
        }
      };
      batch[i] = {&job_.tensors[p.tensor].key, p.region, elem, targets[i],
                  &consumers[i]};
    }
    PTC_RETURN_IF_ERROR(
        transport_->FetchBatch(source, job_.job, job_.source_version, batch));
    for (absl::Status& s : bad_chunks) PTC_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  }

  // A part whose source failed: each piece from its other holders in
  // turn, then once more from a holder that was only slow (see Failure);
  // an error names the piece and every source tried.
  absl::Status FromAlternates(const FragmentPart& part,
                              const absl::Status& first) {
    for (const int32_t index : part.pieces) {
      const FragmentPiece& p = job_.pieces[index];
      std::vector<std::string> tried = {
          absl::StrCat("host ", p.source_host, ": ", first.message())};
      bool done = false;
      for (const int32_t alt : p.alternates) {
        if (alt == job_.host || alt == p.source_host || SourceFailed(alt))
          continue;
        const absl::Status s = Fetch({index}, alt);
        if (s.ok()) {
          done = true;
          replica_fetches_total.Add();
          Log("transformer")
              ->warn(
                  "job {}: piece {} of '{}' taken from host {} instead of "
                  "host {}",
                  job_.job, p.region.ToString(), job_.tensors[p.tensor].key,
                  alt, p.source_host);
          break;
        }
        tried.push_back(absl::StrCat("host ", alt, ": ", s.message()));
        if (IsPeerFailure(s)) MarkFailed(alt, s);
      }
      if (!done) done = FromSlowHolder(index, &tried);
      if (!done) {
        absl::Status none = absl::UnavailableError(absl::StrCat(
            "no live source left for piece ", p.region.ToString(),
            " of tensor '", job_.tensors[p.tensor].key, "' (",
            absl::StrJoin(tried, "; "), ")"));
        none.SetPayload(kNoLiveSourceUrl, absl::Cord("1"));
        return none;
      }
    }
    return absl::OkStatus();
  }

  // Piece `index` once more from a holder that only missed a deadline, with
  // a fresh one: true if one gave it. A holder slow again is then taken
  // for dead by this fragment, so a peer that stalls for good costs each
  // of its pieces in flight one more deadline, not one per piece.
  bool FromSlowHolder(int32_t index, std::vector<std::string>* tried) {
    const FragmentPiece& p = job_.pieces[index];
    std::vector<int32_t> holders = {p.source_host};
    holders.insert(holders.end(), p.alternates.begin(), p.alternates.end());
    for (const int32_t h : holders) {
      if (h == job_.host || !SourceOnlySlow(h)) continue;
      const absl::Status s = Fetch({index}, h);
      if (s.ok()) {
        slow_source_retries_total.Add();
        Log("transformer")
            ->warn(
                "job {}: piece {} of '{}' taken from host {} on a second "
                "try: it had missed a transfer's deadline, alive but slow",
                job_.job, p.region.ToString(), job_.tensors[p.tensor].key, h);
        return true;
      }
      tried->push_back(absl::StrCat("host ", h, " again: ", s.message()));
      if (IsPeerFailure(s)) MarkFailed(h, absl::UnavailableError("slow twice"));
    }
    return false;
  }

  // Source rank `rank`'s copy of `o`, from this host's store or its host.
  absl::StatusOr<std::string> FetchSmallObject(const SmallObjectMove& o,
                                               int32_t rank, int32_t host) {
    if (host == job_.host) {
      PTC_ASSIGN_OR_RETURN(SmallObjectRef ref,
                           store_->GetSmallObject(job_.job, job_.source_version,
                                                  o.name, rank));
      return *ref.bytes;
    }
    return transport_->FetchSmallObject(host, job_.job, job_.source_version,
                                        o.name, rank);
  }

  // The small objects to copy from other hosts, fetched from each planned
  // source host in one call (a call per object was most of a change's
  // staging on busy hosts: 40 per host of 8 ranks). Where a host's call
  // fails, its objects are absent here and PutSmallObject fetches each
  // from its copies as before (a source that did not answer is marked,
  // so they go to the other copies at once).
  std::vector<std::optional<std::string>> FetchSmallObjectsByHost() {
    std::vector<std::optional<std::string>> fetched(job_.small_objects.size());
    std::map<int32_t, std::vector<size_t>> by_host;
    for (size_t i = 0; i < job_.small_objects.size(); ++i) {
      const SmallObjectMove& o = job_.small_objects[i];
      if (o.derive_from.empty() && o.source_host >= 0 &&
          o.source_host != job_.host)
        by_host[o.source_host].push_back(i);
    }
    std::vector<std::pair<int32_t, std::vector<size_t>>> hosts;
    for (auto& [host, objects] : by_host)
      if (objects.size() > 1) hosts.emplace_back(host, std::move(objects));
    ParallelFor(hosts.size(), job_.parallel_pulls, [&](size_t h) {
      const auto& [host, objects] = hosts[h];
      if (SourceFailed(host)) return absl::OkStatus();
      PieceTransport::SmallObjectKeys keys;
      for (size_t i : objects) {
        const SmallObjectMove& o = job_.small_objects[i];
        keys.emplace_back(o.name, o.source_rank);
      }
      absl::StatusOr<std::vector<std::string>> got =
          transport_->FetchSmallObjects(host, job_.job, job_.source_version,
                                        keys);
      if (got.ok() && got->size() != objects.size()) {
        got = absl::InternalError(
            absl::StrCat("the transport answered ", got->size(),
                         " small objects for ", objects.size()));
      }
      if (!got.ok()) {
        // As a single object's fetch would (busy past its time: slow).
        if (absl::IsUnavailable(got.status()) ||
            absl::IsDeadlineExceeded(got.status()) || IsBusy(got.status()))
          MarkFailed(host, got.status());
        Log("transformer")
            ->warn(
                "job {}: {} small objects from host {} in one call: {}; "
                "each is fetched from its copies",
                job_.job, objects.size(), host, got.status().ToString());
        return absl::OkStatus();
      }
      for (size_t k = 0; k < objects.size(); ++k)
        fetched[objects[k]] = std::move((*got)[k]);
      return absl::OkStatus();
    }).IgnoreError();
    return fetched;
  }

  // `fetched`: the object from its planned copy, already fetched.
  absl::Status PutSmallObject(const SmallObjectMove& o,
                              std::optional<std::string> fetched) {
    absl::StatusOr<std::string> bytes;
    if (fetched.has_value()) {
      bytes = *std::move(fetched);
    } else if (!o.derive_from.empty()) {
      bytes = DerivedSmallObject(job_.job, o.name, o.derive_from,
                                 job_.target_version);
    } else if (o.source_host == kFromCoordinator) {
      // Every copy died with its host before the change: the copy the
      // coordinator keeps.
      Log("transformer")
          ->warn("job {}: small object '{}' for rank {} taken from the copy "
                 "the coordinator keeps of rank {}'s (no live host holds it)",
                 job_.job, o.name, o.target_rank, o.kept_rank);
      bytes = *o.kept;
    } else {
      // The planned copy, then the others on other hosts, then a fresh
      // value where the object may have one: a source host that failed
      // during the change does not fail it while a copy lives.
      std::vector<SmallObjectMove::Copy> copies = {{o.source_rank, o.source_host}};
      copies.insert(copies.end(), o.alternates.begin(), o.alternates.end());
      std::vector<std::string> tried;
      for (const SmallObjectMove::Copy& c : copies) {
        if (c.host != job_.host && SourceFailed(c.host)) {
          tried.push_back(absl::StrCat("host ", c.host, " failed earlier"));
          continue;
        }
        bytes = FetchSmallObject(o, c.rank, c.host);
        if (bytes.ok()) {
          if (c.host != o.source_host) {
            Log("transformer")
                ->warn("job {}: small object '{}' for rank {} taken from rank "
                       "{} on host {} instead of host {}",
                       job_.job, o.name, o.target_rank, c.rank, c.host,
                       o.source_host);
          }
          break;
        }
        tried.push_back(absl::StrCat("host ", c.host, ": ",
                                     bytes.status().message()));
        if (c.host != job_.host && (absl::IsUnavailable(bytes.status()) ||
                                    absl::IsDeadlineExceeded(bytes.status())))
          MarkFailed(c.host, bytes.status());
      }
      // A copy whose host only missed a deadline, once more (see
      // FromSlowHolder), before a fresh value or giving up; the copy the
      // coordinator keeps holds the same bytes and is not slow.
      for (const SmallObjectMove::Copy& c : copies) {
        if (bytes.ok() || o.kept.has_value()) break;
        if (c.host == job_.host || !SourceOnlySlow(c.host)) continue;
        bytes = FetchSmallObject(o, c.rank, c.host);
        if (bytes.ok()) {
          slow_source_retries_total.Add();
          Log("transformer")
              ->warn(
                  "job {}: small object '{}' for rank {} taken from rank "
                  "{} on host {} on a second try: it had missed a "
                  "deadline, alive but slow",
                  job_.job, o.name, o.target_rank, c.rank, c.host);
          break;
        }
        tried.push_back(absl::StrCat("host ", c.host,
                                     " again: ", bytes.status().message()));
        if (absl::IsUnavailable(bytes.status()) ||
            absl::IsDeadlineExceeded(bytes.status()))
          MarkFailed(c.host, absl::UnavailableError("slow twice"));
      }
      if (!bytes.ok() && o.kept.has_value()) {
        Log("transformer")
            ->warn(
                "job {}: small object '{}' for rank {}: no copy could be "
                "read ({}); it takes the copy the coordinator keeps of "
                "rank {}'s",
                job_.job, o.name, o.target_rank, absl::StrJoin(tried, "; "),
                o.kept_rank);
        bytes = *o.kept;
      } else if (!bytes.ok() && !o.derive_fallback.empty()) {
        Log("transformer")
            ->warn("job {}: small object '{}' for rank {}: no copy could be "
                   "read ({}); it takes a fresh value",
                   job_.job, o.name, o.target_rank, absl::StrJoin(tried, "; "));
        bytes = DerivedSmallObject(job_.job, o.name, o.derive_fallback,
                                   job_.target_version);
      } else if (!bytes.ok()) {
        absl::Status none = absl::UnavailableError(absl::StrCat(
            "no copy could be read (", absl::StrJoin(tried, "; "), ")"));
        none.SetPayload(kNoLiveSourceUrl, absl::Cord("1"));
        return none;
      }
    }
    PTC_RETURN_IF_ERROR(bytes.status());
    return store_->PutSmallObject(job_.job, job_.target_version, o.name,
                                  o.target_rank, *std::move(bytes), 0,
                                  job_.plan_epoch);
  }

  bool SourceFailed(int32_t host) {
    absl::MutexLock lock(&mu_);
    return failed_sources_.count(host) > 0;
  }
  bool SourceOnlySlow(int32_t host) {
    absl::MutexLock lock(&mu_);
    auto it = failed_sources_.find(host);
    return it != failed_sources_.end() && it->second == Failure::kSlow;
  }
  // A deadline missed marks `host` slow, anything else dead; dead stays.
  void MarkFailed(int32_t host, const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    const Failure f = absl::IsDeadlineExceeded(why) || IsBusy(why)
                          ? Failure::kSlow
                          : Failure::kDead;
    auto [it, added] = failed_sources_.emplace(host, f);
    if (!added && f == Failure::kDead) it->second = f;
  }

  Store* const store_;
  const FragmentJob& job_;
  const FragmentPartPlan& plan_;
  PieceTransport* const transport_;
  // One per plan_.staged, until Publish hands them to the store.
  std::vector<std::unique_ptr<PendingPut>> puts_;
  // One per plan_.staged: what the writes into it added up.
  std::vector<std::unique_ptr<StagedSums>> sums_;
  bool published_ = false;
  absl::Mutex mu_;
  // How a source failed in this fragment. kSlow: a transfer from it missed
  // its deadline, which a peer that died seldom reaches first (its
  // connection resets, or its keepalive pings go unanswered for 4 s and the
  // call fails UNAVAILABLE; the deadline is at least the peer timeout,
  // twice the coordinator's host timeout): most likely it is alive and
  // slow, starved of CPU or setting up a connection on a busy host. kDead:
  // anything else.
  enum class Failure { kSlow, kDead };
  // Sources that failed: their later parts go straight to the pieces'
  // other holders; a slow one is asked again where no other holder gave
  // a piece (FromSlowHolder).
  std::map<int32_t, Failure> failed_sources_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

GrpcPieceTransport::GrpcPieceTransport(
    const std::map<int32_t, std::string>& peers,
    std::map<int32_t, std::string> names, absl::Duration peer_timeout,
    bool hollow, std::function<bool()> cancelled)
    : addresses_(peers),
      names_(std::move(names)),
      peer_timeout_(peer_timeout),
      hollow_(hollow),
      cancelled_(std::move(cancelled)) {
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
                                       int64_t element_size,
                                       const StoreClient::Consumer& consume) {
  PTC_ASSIGN_OR_RETURN(StoreClient * client, ClientFor(host));
  // A source whose RPC threads are all taken (thousands of targets pulling
  // at once) refuses the read before running it: asked again, within the
  // transfer's time, unless the change was cancelled meanwhile.
  const absl::Time deadline =
      absl::Now() +
      TransferDeadline(peer_timeout_, region.volume() * element_size);
  const absl::StatusOr<int64_t> got = AskWhileBusy(deadline, [&] {
    return client->ReadWith(job, version, tensor, region, consume, 0,
                            deadline - absl::Now(), hollow_);
  }, cancelled_);
  if (!got.ok()) {
    return Annotate(got.status(),
                    absl::StrCat("pulling ", region.ToString(), " of '", tensor,
                                 "' from ", PeerName(host)));
  }
  return absl::OkStatus();
}

std::string GrpcPieceTransport::PeerName(int32_t host) const {
  const auto n = names_.find(host);
  return absl::StrCat(
      n != names_.end() ? n->second : absl::StrCat("host ", host), " (",
      addresses_.at(host), ")");
}

absl::StatusOr<std::string> GrpcPieceTransport::FetchSmallObject(
    int32_t host, const std::string& job, int64_t version,
    const std::string& name, int32_t rank) {
  PTC_ASSIGN_OR_RETURN(StoreClient * client, ClientFor(host));
  const absl::Time deadline = absl::Now() + TransferDeadline(peer_timeout_, 0);
  absl::StatusOr<std::string> got = AskWhileBusy(deadline, [&] {
    return client->GetSmallObject(job, version, name, rank);
  }, cancelled_);
  if (!got.ok()) {
    return Annotate(got.status(),
                    absl::StrCat("pulling small object '", name, "' of rank ",
                                 rank, " from ", PeerName(host)));
  }
  return got;
}

absl::StatusOr<std::vector<std::string>> GrpcPieceTransport::FetchSmallObjects(
    int32_t host, const std::string& job, int64_t version,
    const SmallObjectKeys& keys) {
  PTC_ASSIGN_OR_RETURN(StoreClient * client, ClientFor(host));
  const absl::Time deadline =
      absl::Now() +
      TransferDeadline(peer_timeout_, static_cast<int64_t>(keys.size()) *
                                          kMaxSmallObjectBytes);
  absl::StatusOr<std::vector<std::string>> got = AskWhileBusy(
      deadline,
      [&] { return client->GetSmallObjects(job, version, keys, deadline); },
      cancelled_);
  if (!got.ok()) {
    return Annotate(got.status(),
                    absl::StrCat("pulling ", keys.size(),
                                 " small objects from ", PeerName(host)));
  }
  return got;
}

absl::Status ExecuteFragment(
    Store* store, const FragmentJob& job, PieceTransport* transport,
    const std::function<void(const FragmentProgress&)>& progress,
    const std::atomic<bool>* cancel) {
  const absl::Time started = absl::Now();
  PTC_RETURN_IF_ERROR(ValidateFragment(job));
  // No spare is prepared while this stages (SparePool::RefillHold).
  const SparePool::RefillHold no_refill = store->spares().HoldRefill();
  PTC_RETURN_IF_ERROR(store->DeclareTensors(job.job, job.tensors).status());
  // Which held regions the source version here stores as they are (the
  // plan links those it keeps in place instead of copying them).
  std::vector<bool> stored_exactly(job.holds.size(), false);
  for (size_t h = 0; h < job.holds.size(); ++h) {
    const auto& [t, region] = job.holds[h];
    auto view = store->OpenRead(job.job, job.source_version,
                                job.tensors[t].key, region);
    stored_exactly[h] = view.ok() && view->exact;
  }
  const FragmentPartPlan plan = PlanFragmentParts(job, stored_exactly);
  FragmentRun run(store, job, plan, transport);
  PTC_RETURN_IF_ERROR(run.Stage());

  absl::Mutex mu;
  FragmentProgress totals;
  totals.bytes_total = plan.bytes_total;
  totals.bytes_done = plan.bytes_in_place;
  totals.pieces_done = static_cast<int64_t>(plan.in_place.size());
  totals.pieces_total = static_cast<int64_t>(job.pieces.size());
  if (progress) progress(totals);
  const absl::Time prepared = absl::Now();
  absl::Status moved = ParallelFor(
      plan.parts.size(), job.parallel_pulls,
      [&](size_t i) -> absl::Status {
        const FragmentPart& part = plan.parts[i];
        if (absl::Status s = run.Run(part); !s.ok()) {
          if (FragmentRun::NamesNoLiveSource(s)) return s;
          const FragmentPiece& first = job.pieces[part.pieces.front()];
          return Annotate(
              s, part.pieces.size() == 1
                     ? absl::StrCat("piece ", first.region.ToString(),
                                    " of tensor '",
                                    job.tensors[first.tensor].key, "'")
                     : absl::StrCat("a batch of ", part.pieces.size(),
                                    " pieces from ",
                                    part.method == PartMethod::kSnapshot
                                        ? std::string("the snapshot")
                                        : absl::StrCat("host ",
                                                       part.source_host)));
        }
        pieces_total.Add(part.pieces.size());
        (part.method == PartMethod::kCopy ? bytes_copied_local_total
                                          : bytes_received_total)
            .Add(part.bytes);
        absl::MutexLock lock(&mu);
        totals.bytes_done += part.bytes;
        if (part.method == PartMethod::kPull)
          totals.remote_bytes_done += part.bytes;
        totals.pieces_done += part.pieces.size();
        if (progress) progress(totals);
        return absl::OkStatus();
      },
      cancel);
  if (CancelledByParallelFor(moved)) {
    moved = absl::CancelledError(
        "the fragment was cancelled; the staged version was deleted");
  }
  PTC_RETURN_IF_ERROR(moved);
  const absl::Time parts_done = absl::Now();
  PTC_RETURN_IF_ERROR(run.Publish());
  const absl::Time published = absl::Now();
  // Where a fragment's time went: reading what the source holds here and
  // planning its parts; the parts (copies and pulls); the links and the
  // small objects (a call each to their source hosts).
  Log("transformer")
      ->info(
          "job {}: version {} staged on host {} ({} pieces, {} bytes, {} from "
          "peers, {} regions kept in place, {} small objects) in {:.3f} s: "
          "prepared {:.3f} s, parts {:.3f} s, links and small objects "
          "{:.3f} s",
          job.job, job.target_version, job.host, totals.pieces_done,
          totals.bytes_done, totals.remote_bytes_done, plan.linked.size(),
          job.small_objects.size(), absl::ToDoubleSeconds(published - started),
          absl::ToDoubleSeconds(prepared - started),
          absl::ToDoubleSeconds(parts_done - prepared),
          absl::ToDoubleSeconds(published - parts_done));
  return absl::OkStatus();
}

}  // namespace ptc
