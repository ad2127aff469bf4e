#include "tensor_store/store.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "ptc/fingerprint.h"
#include "tensor_store/region_buffer.h"

namespace ptc {
namespace {

// Bytes of stored regions fingerprinted (each whole sealed region once).
Counter& fingerprinted_bytes_total =
    GetCounter("ptc_store_fingerprinted_bytes_total");

// A sealed region's bytes to read whole (RegionBuffer::ReadableBytes),
// in this thread's scratch where they are copied. Valid until this
// thread's next call.
const uint8_t* SealedBytes(const RegionBuffer& buffer) {
  thread_local std::vector<uint8_t> scratch;
  return buffer.ReadableBytes(&scratch);
}

// What a buffer remembers its whole region's fingerprint under.
std::string WholeFingerprintKey(const TensorDecl& decl, const Region& region) {
  return absl::StrCat("fingerprint ", absl::StrJoin(decl.shape, "x"), " ",
                      region.ToString(), " ", ElementSize(decl.dtype));
}

// A whole sealed region's fingerprint, computed once and kept with its
// buffer: a version built by a reconfiguration has it from its staging
// (PendingPut::fingerprint) or computes it to commit, and uses it again as
// the source of the next change; a version clients saved is fingerprinted
// in the background after its commit.
uint64_t WholeFingerprint(const TensorDecl& decl, const Region& region,
                          RegionBuffer& buffer) {
  const int64_t elem = ElementSize(decl.dtype);
  if (buffer.hollow()) return HollowFingerprint(region, decl.shape, elem);
  return buffer.Memoize(WholeFingerprintKey(decl, region), [&] {
    fingerprinted_bytes_total.Add(region.volume() * elem);
    return FingerprintRegion(SealedBytes(buffer), region, region, decl.shape,
                             elem);
  });
}

// Extents and totals beyond these are certainly mistakes (and would
// overflow byte counts).
constexpr int64_t kMaxExtent = int64_t{1} << 40;
constexpr int64_t kMaxTensorBytes = int64_t{1} << 50;

std::string Where(const std::string& job, int64_t version,
                  const std::string& tensor) {
  return absl::StrCat("tensor '", tensor, "' of job '", job, "' version ",
                      version);
}

absl::Status CheckDecl(const TensorDecl& d) {
  if (d.key.empty())
    return absl::InvalidArgumentError("a tensor key must not be empty");
  int64_t elements = 1;
  for (int64_t e : d.shape) {
    if (e < 0 || e > kMaxExtent) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", d.key, "' has extent ", e, " in shape [",
          absl::StrJoin(d.shape, ", "), "]; extents must be in [0, 2^40]"));
    }
    // Capped before it can overflow: past the cap the tensor is refused.
    if (e == 0 || elements == 0) {
      elements = 0;
    } else if (elements > (kMaxTensorBytes + 1) / e) {
      elements = kMaxTensorBytes + 1;
    } else {
      elements *= e;
    }
  }
  if (elements > kMaxTensorBytes / ElementSize(d.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", d.key, "' would be larger than 2^50 bytes"));
  }
  return absl::OkStatus();
}

std::string DeclString(const TensorDecl& d) {
  return absl::StrCat(DTypeName(d.dtype), " [", absl::StrJoin(d.shape, ", "),
                      "]");
}

}  // namespace

absl::Status ForEachCoveringPiece(
    const Region& region, const std::vector<StoredRegionRef>& sources,
    const std::function<void(const Region&, const StoredRegionRef&)>& fn) {
  std::vector<Region> missing = {region};
  for (const StoredRegionRef& s : sources) {
    std::vector<Region> still;
    for (const Region& m : missing) {
      const Region got = m.Intersect(s.region);
      if (got.empty()) {
        still.push_back(m);
        continue;
      }
      fn(got, s);
      for (Region& rest : m.Difference(s.region))
        still.push_back(std::move(rest));
    }
    missing.swap(still);
    if (missing.empty()) break;
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat("region ", missing[0].ToString(),
                                            " is not stored on this host"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Store::Job>> Store::FindJob(
    const std::string& job) const {
  if (job.empty())
    return absl::InvalidArgumentError("the job name must not be empty");
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "job '", job, "' is unknown to this ptcd; declare its tensors first"));
  }
  return it->second;
}

std::vector<std::pair<std::string, std::shared_ptr<Store::Job>>> Store::Jobs()
    const {
  absl::MutexLock lock(&mu_);
  return {jobs_.begin(), jobs_.end()};
}

absl::StatusOr<TensorDecl> TensorDeclFromProto(const proto::TensorDecl& d) {
  TensorDecl decl;
  decl.key = d.key();
  auto dtype = ParseDType(d.dtype());
  if (!dtype.ok())
    return Annotate(dtype.status(), absl::StrCat("tensor '", d.key(), "'"));
  decl.dtype = *dtype;
  decl.shape.assign(d.shape().begin(), d.shape().end());
  return decl;
}

absl::StatusOr<int> Store::DeclareTensors(
    const std::string& job, const std::vector<TensorDecl>& tensors) {
  if (job.empty())
    return absl::InvalidArgumentError("the job name must not be empty");
  std::map<std::string, const TensorDecl*> in_request;
  for (const TensorDecl& d : tensors) {
    PTC_RETURN_IF_ERROR(CheckDecl(d));
    auto [it, fresh] = in_request.emplace(d.key, &d);
    if (!fresh && (it->second->dtype != d.dtype || it->second->shape != d.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", d.key, "' is declared twice, as ",
          DeclString(*it->second), " and as ", DeclString(d)));
    }
  }
  std::shared_ptr<Job> j;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Job>& slot = jobs_[job];
    if (!slot) {
      slot = std::make_shared<Job>();
      slot->id = next_job_id_++;
    }
    j = slot;
  }
  absl::MutexLock lock(&j->mu);
  int64_t new_bytes = 0;
  int fresh = 0;
  for (const auto& [key, d] : in_request) {
    auto it = j->decls.find(key);
    if (it == j->decls.end()) {
      new_bytes += TensorDeclMetadataBytes(*d);
      ++fresh;
    } else if (it->second.dtype != d->dtype || it->second.shape != d->shape) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", key, "' of job '", job,
                       "' is declared as ", DeclString(it->second),
                       "; it cannot be re-declared as ", DeclString(*d)));
    }
  }
  if (fresh == 0) return 0;
  PTC_ASSIGN_OR_RETURN(
      MemoryBudget::Reservation memory,
      budget_.Reserve(new_bytes, absl::StrCat("declaring ", fresh,
                                              " tensors of job '", job, "'")));
  j->decl_memory.push_back(std::move(memory));
  j->decl_bytes += new_bytes;
  metadata_bytes_ += new_bytes;
  for (const auto& [key, d] : in_request) j->decls.emplace(key, *d);
  return fresh;
}

absl::StatusOr<std::unique_ptr<PendingPut>> Store::PreparePut(
    const Job& j, const std::string& job, int64_t version,
    const std::string& tensor, const Region& region, std::optional<DType> dtype,
    int64_t stage_epoch) {
  auto put = std::make_unique<PendingPut>();
  put->job = job;
  put->version = version;
  put->region = region;
  put->stage_epoch = stage_epoch;
  {
    absl::MutexLock lock(&j.mu);
    auto d = j.decls.find(tensor);
    if (d == j.decls.end()) {
      return absl::NotFoundError(absl::StrCat(
          "tensor '", tensor, "' is not declared for job '", job, "'"));
    }
    put->decl = d->second;
    auto v = j.versions.find(version);
    PTC_RETURN_IF_ERROR(
        CheckWriterLocked(v == j.versions.end() ? nullptr : &v->second, job,
                          version, stage_epoch));
  }
  const std::string where = Where(job, version, tensor);
  PTC_RETURN_IF_ERROR(Annotate(ValidateRegion(region, put->decl.shape), where));
  if (region.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": region ", region.ToString(), " is empty"));
  }
  if (dtype && *dtype != put->decl.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is declared ", DTypeName(put->decl.dtype),
                     " but the put sends ", DTypeName(*dtype)));
  }
  put->bytes = region.volume() * ElementSize(put->decl.dtype);
  return put;
}

absl::StatusOr<std::shared_ptr<RegionBuffer>> Store::AllocateBuffer(
    int64_t bytes, const std::string& job, int64_t version,
    const std::string& what, const std::string& name, bool map) {
  // Take ready memory if there is some (saves repeat their sizes; a
  // hollow store has no spare pool).
  std::optional<SparePool::Spare> spare = spares_.Take(bytes, {job, version});
  if (spare) {
    return RegionBuffer::Adopt(spare->fd, bytes, std::move(spare->reservation),
                               map);
  }
  auto r = budget_.Reserve(bytes, what);
  if (!r.ok()) {
    // Deleted versions being freed, then spares, give way to real data.
    WaitReleased();
    if (spares_.ready_bytes() > 0) spares_.EvictAll();
    r = budget_.Reserve(bytes, what);
  }
  if (!r.ok()) return r.status();
  if (hollow_) return RegionBuffer::CreateHollow(bytes, std::move(*r));
  // Fresh memory that a local client will fill through the descriptor is
  // mapped in huge pages and populated here when it is a huge page or more
  // (a client maps a region of kCopyThroughDescriptorBelow or more itself,
  // in huge pages). Written through the descriptor, shared memory takes 4
  // KiB pages, each allocated and charged on its own; and a version held
  // in 4 KiB pages, once deleted, frees memory that no huge page can take,
  // so the spare pool's refill and a change's staged buffers after it
  // fault in memory the hypervisor must back again (0.8 GB/s on the CI VM,
  // against 10 GB/s just after huge pages were freed).
  const bool huge =
      bytes >= kHugePageBytes && bytes < kCopyThroughDescriptorBelow;
  return RegionBuffer::Create(bytes, std::move(*r), name, map || huge);
}

absl::StatusOr<std::unique_ptr<PendingPut>> Store::BeginPut(
    const std::string& job, int64_t version, const std::string& tensor,
    const Region& region, std::optional<DType> dtype, bool map,
    int64_t stage_epoch) {
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version ", version, " is negative"));
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  PTC_ASSIGN_OR_RETURN(
      std::unique_ptr<PendingPut> put,
      PreparePut(*j, job, version, tensor, region, dtype, stage_epoch));
  PTC_ASSIGN_OR_RETURN(
      put->buffer,
      AllocateBuffer(put->bytes, job, version,
                     absl::StrCat("a put of ", region.ToString(), " of ",
                                  Where(job, version, tensor)),
                     absl::StrCat(job, "/", version, "/", tensor), map));
  StampIncarnation(*j, put.get());
  return put;
}

absl::StatusOr<std::vector<std::unique_ptr<PendingPut>>> Store::BeginPuts(
    const std::string& job, int64_t version,
    const std::vector<std::pair<std::string, Region>>& items) {
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version ", version, " is negative"));
  }
  if (items.empty() || static_cast<int64_t>(items.size()) > kMaxPackRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pack holds 1 to ", kMaxPackRegions, " regions, not ", items.size()));
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  std::vector<std::unique_ptr<PendingPut>> puts;
  std::vector<std::pair<int64_t, int64_t>> parts;
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& [tensor, region] = items[i];
    auto put = PreparePut(*j, job, version, tensor, region, std::nullopt,
                          /*stage_epoch=*/0);
    if (!put.ok()) {
      return Annotate(put.status(), absl::StrCat("item ", i, " of the pack"));
    }
    // Each region from a page boundary. A region's bytes are within the
    // store's limit (its tensor was accepted); their sum is checked so that
    // it cannot overflow.
    const int64_t bytes = (*put)->bytes;
    if (bytes > kMaxPackBytes || total > kMaxPackBytes - bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a pack holds at most ", kMaxPackBytes, " bytes; item ",
                       i, " brings it past that (save larger regions alone)"));
    }
    parts.emplace_back(total, bytes);
    total += PackAligned(bytes);
    puts.push_back(std::move(*put));
  }
  if (hollow_) {
    // A hollow store keeps each region's size and reservation alone.
    for (auto& put : puts) {
      PTC_ASSIGN_OR_RETURN(
          put->buffer, AllocateBuffer(put->bytes, job, version,
                                      "a hollow region", "", /*map=*/false));
    }
  } else {
    PTC_ASSIGN_OR_RETURN(
        std::shared_ptr<RegionBuffer> pack,
        AllocateBuffer(total, job, version,
                       absl::StrCat("a pack of ", items.size(), " regions of ",
                                    Where(job, version, items[0].first)),
                       absl::StrCat(job, "/", version, "/pack"),
                       /*map=*/false));
    PTC_ASSIGN_OR_RETURN(auto views, RegionBuffer::Slice(pack, parts));
    for (size_t i = 0; i < puts.size(); ++i) puts[i]->buffer = views[i];
  }
  for (auto& put : puts) StampIncarnation(*j, put.get());
  return puts;
}

void Store::StampIncarnation(const Job& j, PendingPut* put) {
  // Remember which incarnation of the version the put writes into, so that
  // a delete (and re-creation) while it runs is detected. A version is
  // created by its first successful put, never by one that fails.
  put->job_id = j.id;
  absl::MutexLock lock(&j.mu);
  auto v = j.versions.find(put->version);
  put->version_id = v == j.versions.end() ? 0 : v->second.id;
}

absl::StatusOr<uint64_t> Store::FinishPut(std::unique_ptr<PendingPut> put,
                                          std::optional<uint64_t> computed,
                                          uint64_t expected) {
  const std::string where = Where(put->job, put->version, put->decl.key);
  PTC_RETURN_IF_ERROR(Annotate(put->buffer->Seal(), where));
  // A hollow region's checksum is a function of its bounds (its bytes, had
  // they been kept, a function of their indexes); there is nothing a
  // writer's checksum could be compared with.
  const uint64_t checksum =
      put->buffer->hollow() ? HollowFingerprint(put->region, put->decl.shape,
                                                ElementSize(put->decl.dtype))
      : computed            ? *computed
                 : Checksum(SealedBytes(*put->buffer), put->buffer->size());
  if (!put->buffer->hollow() && expected != 0 && expected != checksum) {
    return absl::DataLossError(absl::StrCat(
        where, ": the bytes of ", put->region.ToString(), " have checksum ",
        checksum, " but the writer sent ", expected, "; nothing was stored"));
  }
  if (put->fingerprint && !put->buffer->hollow()) {
    put->buffer->Memoize(WholeFingerprintKey(put->decl, put->region),
                         [&] { return *put->fingerprint; });
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(put->job));
  if (j->id != put->job_id) {
    return absl::AbortedError(absl::StrCat(
        "job '", put->job, "' was deleted while the put was in progress"));
  }
  absl::MutexLock lock(&j->mu);
  auto v = j->versions.find(put->version);
  if (put->version_id != 0 &&
      (v == j->versions.end() || v->second.id != put->version_id)) {
    return absl::AbortedError(
        absl::StrCat("version ", put->version, " of job '", put->job,
                     "' was deleted while the put was in progress"));
  }
  PTC_RETURN_IF_ERROR(Annotate(
      CheckWriterLocked(v == j->versions.end() ? nullptr : &v->second,
                        put->job, put->version, put->stage_epoch),
      "while the put was in progress"));
  if (v == j->versions.end()) {
    v = j->versions.emplace(put->version, Version()).first;
    v->second.id = j->next_version_id++;
  }
  std::vector<StoredRegionRef>& regions = v->second.tensors[put->decl.key];
  for (const StoredRegionRef& s : regions) {
    if (s.region == put->region) {
      return absl::AlreadyExistsError(
          absl::StrCat(where, " already holds region ", put->region.ToString(),
                       "; delete the version to write it again"));
    }
  }
  regions.push_back({put->region, put->buffer, checksum});
  v->second.bytes += put->bytes;
  Log("tensor_store")
      ->debug("stored {} of {} ({} bytes, xxh3 {:016x})",
              put->region.ToString(), where, put->bytes, checksum);
  return checksum;
}

std::vector<Store::PutOutcome> Store::FinishPuts(
    std::vector<std::unique_ptr<PendingPut>> puts,
    const std::vector<uint64_t>& expected) {
  std::vector<PutOutcome> out(puts.size());
  std::vector<std::optional<uint64_t>> sums(puts.size());
  // Sealed first: nothing can write the bytes while they are checksummed.
  std::vector<size_t> todo;
  for (size_t i = 0; i < puts.size(); ++i) {
    out[i].status =
        Annotate(puts[i]->buffer->Seal(),
                 Where(puts[i]->job, puts[i]->version, puts[i]->decl.key));
    if (!out[i].status.ok()) continue;
    const PendingPut& p = *puts[i];
    if (p.buffer->hollow()) {
      sums[i] =
          HollowFingerprint(p.region, p.decl.shape, ElementSize(p.decl.dtype));
    } else {
      todo.push_back(i);
    }
  }
  std::sort(todo.begin(), todo.end(), [&](size_t a, size_t b) {
    return puts[a]->buffer->size() > puts[b]->buffer->size();
  });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < todo.size();) {
      const RegionBuffer& b = *puts[todo[k]]->buffer;
      sums[todo[k]] = Checksum(SealedBytes(b), b.size());
    }
  };
  const size_t workers =
      std::min<size_t>({todo.size(), static_cast<size_t>(kMaxChecksumThreads),
                        std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no thread to be had: fewer do the work
    }
  }
  work();
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < puts.size(); ++i) {
    if (!out[i].status.ok()) continue;
    out[i].checksum = sums[i].value_or(0);
    auto sum = FinishPut(std::move(puts[i]), sums[i],
                         expected.empty() ? 0 : expected[i]);
    out[i].status = sum.status();
    if (sum.ok()) out[i].checksum = *sum;
  }
  return out;
}

absl::Status Store::CheckWriterLocked(const Version* v,
                                      const std::string& job, int64_t version,
                                      int64_t stage_epoch) {
  if (v == nullptr) {
    if (stage_epoch == 0) return absl::OkStatus();  // a save creates it
    return absl::AbortedError(
        absl::StrCat("staged version ", version, " of job '", job,
                     "' (plan epoch ", stage_epoch,
                     ") is gone: its reconfiguration was aborted or fenced"));
  }
  if (v->committed) {
    return absl::FailedPreconditionError(
        absl::StrCat("version ", version, " of job '", job,
                     "' is committed and cannot change; write into a new "
                     "version"));
  }
  if (v->stage_epoch == stage_epoch) return absl::OkStatus();
  if (v->stage_epoch != 0 && stage_epoch == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " of job '", job,
        "' is being staged by a reconfiguration (plan epoch ", v->stage_epoch,
        "); a save writes only into the version the coordinator's BeginSave "
        "gave it"));
  }
  return absl::AbortedError(absl::StrCat(
      "version ", version, " of job '", job, "' belongs to ",
      v->stage_epoch == 0 ? std::string("a save")
                          : absl::StrCat("plan epoch ", v->stage_epoch),
      ", not to plan epoch ", stage_epoch));
}

absl::StatusOr<Store::Version*> Store::OpenVersionLocked(Job& j,
                                                         const std::string& job,
                                                         int64_t version,
                                                         int64_t stage_epoch) {
  auto v = j.versions.find(version);
  PTC_RETURN_IF_ERROR(CheckWriterLocked(
      v == j.versions.end() ? nullptr : &v->second, job, version,
      stage_epoch));
  if (v == j.versions.end()) {
    v = j.versions.emplace(version, Version()).first;
    v->second.id = j.next_version_id++;
  }
  return &v->second;
}

absl::Status Store::CreateStaged(const std::string& job, int64_t version,
                                 int64_t epoch) {
  if (epoch <= 0 || version <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a staged version needs a positive version and plan "
                     "epoch, not ",
                     version, " and ", epoch));
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  {
    absl::MutexLock lock(&j->mu);
    auto [v, added] = j->versions.try_emplace(version);
    if (!added) {
      return absl::AlreadyExistsError(absl::StrCat(
          "version ", version, " of job '", job,
          "' already exists on this host",
          v->second.stage_epoch > 0
              ? absl::StrCat(" (staged by plan epoch ", v->second.stage_epoch,
                             ")")
              : std::string(" (a save's)")));
    }
    v->second.id = j->next_version_id++;
    v->second.stage_epoch = epoch;
  }
  // The job's layout changes: what its saves had ready is memory for the
  // change's buffers now (and the next saves have the new layout's sizes).
  if (const int64_t freed = spares_.ForgetSaves(job); freed > 0) {
    Log("tensor_store")
        ->debug("job {}: a change stages version {}; gave back {} bytes of "
                "spare save buffers for it",
                job, version, freed);
  }
  return absl::OkStatus();
}

absl::Status Store::Link(const std::string& job, int64_t version,
                         const std::string& tensor, const StoredRegionRef& ref,
                         int64_t stage_epoch) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  absl::MutexLock lock(&j->mu);
  if (!j->decls.count(tensor)) {
    return absl::NotFoundError(absl::StrCat(
        "tensor '", tensor, "' is not declared for job '", job, "'"));
  }
  PTC_ASSIGN_OR_RETURN(Version * v,
                       OpenVersionLocked(*j, job, version, stage_epoch));
  std::vector<StoredRegionRef>& regions = v->tensors[tensor];
  for (const StoredRegionRef& s : regions) {
    if (s.region == ref.region) {
      return absl::AlreadyExistsError(absl::StrCat(Where(job, version, tensor),
                                                   " already holds region ",
                                                   ref.region.ToString()));
    }
  }
  regions.push_back(ref);
  v->bytes += ref.buffer->size();
  return absl::OkStatus();
}

absl::StatusOr<ReadView> Store::OpenRead(const std::string& job,
                                         int64_t version,
                                         const std::string& tensor,
                                         const Region& region) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  ReadView view;
  view.region = region;
  const std::string where = Where(job, version, tensor);
  {
    absl::MutexLock lock(&j->mu);
    auto d = j->decls.find(tensor);
    if (d == j->decls.end()) {
      return absl::NotFoundError(absl::StrCat(
          "tensor '", tensor, "' is not declared for job '", job, "'"));
    }
    view.decl = d->second;
    auto v = j->versions.find(version);
    if (v == j->versions.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                              version, " on this host"));
    }
    PTC_RETURN_IF_ERROR(
        Annotate(ValidateRegion(region, view.decl.shape), where));
    auto t = v->second.tensors.find(tensor);
    if (t != v->second.tensors.end()) {
      for (const StoredRegionRef& s : t->second) {
        if (s.region.Intersects(region) ||
            (region.empty() && s.region == region)) {
          view.sources.push_back(s);
        }
      }
    }
  }
  // Exact match first, so that a whole-region read uses one source.
  auto exact = std::find_if(
      view.sources.begin(), view.sources.end(),
      [&](const StoredRegionRef& s) { return s.region == region; });
  if (exact != view.sources.end()) {
    std::iter_swap(view.sources.begin(), exact);
    view.exact = true;
  }
  PTC_RETURN_IF_ERROR(Annotate(
      ForEachCoveringPiece(region, view.sources,
                           [](const Region&, const StoredRegionRef&) {}),
      where));
  return view;
}

absl::StatusOr<std::pair<uint64_t, int64_t>> Store::Fingerprint(
    const std::string& job, int64_t version, const std::string& tensor,
    const std::vector<Region>& regions) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  TensorDecl decl;
  std::vector<StoredRegionRef> stored;
  {
    absl::MutexLock lock(&j->mu);
    auto d = j->decls.find(tensor);
    if (d == j->decls.end()) {
      return absl::NotFoundError(absl::StrCat(
          "tensor '", tensor, "' is not declared for job '", job, "'"));
    }
    decl = d->second;
    auto v = j->versions.find(version);
    if (v == j->versions.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                              version, " on this host"));
    }
    auto t = v->second.tensors.find(tensor);
    if (t != v->second.tensors.end()) stored = t->second;
  }
  const int64_t elem = ElementSize(decl.dtype);
  uint64_t sum = 0;
  int64_t elements = 0;
  auto add = [&](const Region& piece, const StoredRegionRef& s) {
    if (piece == s.region && s.buffer->sealed()) {
      sum += WholeFingerprint(decl, s.region, *s.buffer);
    } else {
      fingerprinted_bytes_total.Add(piece.volume() * elem);
      sum += s.buffer->hollow()
                 ? HollowFingerprint(piece, decl.shape, elem)
                 : FingerprintRegion(SealedBytes(*s.buffer), s.region, piece,
                                     decl.shape, elem);
    }
    elements += piece.volume();
  };
  const std::string where = Where(job, version, tensor);
  if (regions.empty()) {
    // The union of the stored regions, each element once.
    for (size_t i = 0; i < stored.size(); ++i) {
      std::vector<Region> fresh = {stored[i].region};
      for (size_t k = 0; k < i; ++k) {
        std::vector<Region> next;
        for (const Region& f : fresh) {
          for (Region& r : f.Difference(stored[k].region))
            next.push_back(std::move(r));
        }
        fresh.swap(next);
      }
      for (const Region& f : fresh) add(f, stored[i]);
    }
  }
  for (const Region& r : regions) {
    PTC_RETURN_IF_ERROR(Annotate(ValidateRegion(r, decl.shape), where));
    PTC_RETURN_IF_ERROR(Annotate(ForEachCoveringPiece(r, stored, add), where));
  }
  return std::make_pair(sum, elements);
}

absl::Status Store::PutSmallObject(const std::string& job, int64_t version,
                                   const std::string& name, int32_t rank,
                                   std::string bytes, uint64_t expected,
                                   int64_t stage_epoch) {
  const std::string what =
      absl::StrCat("small object '", name, "' of rank ", rank, " (job '", job,
                   "' version ", version, ")");
  if (name.empty())
    return absl::InvalidArgumentError("a small object needs a name");
  if (static_cast<int64_t>(name.size()) > kMaxSmallObjectNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a small object's name has ", name.size(), " bytes; at most ",
        kMaxSmallObjectNameBytes));
  }
  if (rank < 0)
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative rank"));
  if (version < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": versions start at 1"));
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxSmallObjectBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", bytes.size(), " bytes; small objects may have at most ",
        kMaxSmallObjectBytes, " (store larger state as a tensor)"));
  }
  SmallObjectRef ref;
  ref.checksum = Checksum(bytes.data(), bytes.size());
  if (expected != 0 && expected != ref.checksum) {
    return absl::DataLossError(
        absl::StrCat(what, ": checksum mismatch, the bytes were damaged"));
  }
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  const int64_t cost = SmallObjectMemoryBytes(name, bytes);
  auto reserved = budget_.Reserve(cost, what);
  if (!reserved.ok()) {
    // A version deleted just before may still be freeing; spares give way
    // to real data, as for a region's put.
    WaitReleased();
    if (spares_.ready_bytes() > 0) spares_.EvictAll();
    reserved = budget_.Reserve(cost, what);
  }
  PTC_ASSIGN_OR_RETURN(MemoryBudget::Reservation memory, std::move(reserved));
  ref.bytes = std::make_shared<const std::string>(std::move(bytes));
  absl::MutexLock lock(&j->mu);
  PTC_ASSIGN_OR_RETURN(Version * v,
                       OpenVersionLocked(*j, job, version, stage_epoch));
  if (!v->small_objects.emplace(std::make_pair(name, rank), ref).second) {
    return absl::AlreadyExistsError(absl::StrCat(what, " is already stored"));
  }
  v->bytes += memory.bytes();
  v->small_object_memory.push_back(std::move(memory));
  return absl::OkStatus();
}

absl::StatusOr<SmallObjectRef> Store::GetSmallObject(const std::string& job,
                                                     int64_t version,
                                                     const std::string& name,
                                                     int32_t rank) const {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  absl::MutexLock lock(&j->mu);
  auto v = j->versions.find(version);
  if (v == j->versions.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                            version, " on this host"));
  }
  auto it = v->second.small_objects.find({name, rank});
  if (it == v->second.small_objects.end()) {
    return absl::NotFoundError(
        absl::StrCat("version ", version, " of job '", job,
                     "' on this host has no small "
                     "object '",
                     name, "' of rank ", rank,
                     "; every rank saves the small objects of its model spec"));
  }
  return it->second;
}

absl::StatusOr<int64_t> Store::Commit(const std::string& job, int64_t version) {
  PTC_ASSIGN_OR_RETURN(CommitResult r,
                       CommitChecked(job, version, {}, /*check_only=*/false));
  return r.bytes;
}

absl::StatusOr<CommitResult> Store::CommitChecked(
    const std::string& job, int64_t version, const VersionExpectation& expect,
    bool check_only) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  absl::MutexLock lock(&j->mu);
  auto v = j->versions.find(version);
  if (v == j->versions.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                            version, " on this host"));
  }
  CommitResult result;
  result.bytes = v->second.bytes;
  result.checksums.reserve(expect.regions.size());
  for (const auto& [tensor, region] : expect.regions) {
    const uint64_t* found = nullptr;
    auto t = v->second.tensors.find(tensor);
    if (t != v->second.tensors.end()) {
      for (const StoredRegionRef& s : t->second)
        if (s.region == region) found = &s.checksum;
    }
    if (found == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(job, version, tensor), " lacks region ",
                       region.ToString(), " on this host"));
    }
    result.checksums.push_back(*found);
  }
  for (const auto& [name, rank] : expect.small_objects) {
    if (!v->second.small_objects.count({name, rank})) {
      return absl::FailedPreconditionError(absl::StrCat(
          "version ", version, " of job '", job, "' lacks small object '",
          name, "' of rank ", rank, " on this host"));
    }
  }
  if (check_only || v->second.committed) return result;
  v->second.committed = true;
  Log("tensor_store")
      ->info("job {} version {} committed ({} bytes)", job, version,
             v->second.bytes);
  if (fingerprint_thread_.joinable()) {
    absl::MutexLock queue(&fingerprint_mu_);
    for (const auto& [tensor, stored] : v->second.tensors) {
      const TensorDecl& decl = j->decls.at(tensor);
      for (const StoredRegionRef& s : stored) {
        if (s.buffer->sealed())
          fingerprint_queue_.push_back({decl, s.region, s.buffer});
      }
    }
  }
  return result;
}

absl::StatusOr<int64_t> Store::DeleteVersion(const std::string& job,
                                             int64_t version) {
  return DeleteVersionIf(job, version, [](const Version&) { return true; });
}

absl::StatusOr<int64_t> Store::DeleteVersionIf(
    const std::string& job, int64_t version,
    const std::function<bool(const Version&)>& pred) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  Version gone;
  {
    absl::MutexLock lock(&j->mu);
    auto v = j->versions.find(version);
    if (v == j->versions.end()) {
      return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                              version, " on this host"));
    }
    if (!pred(v->second)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "version ", version, " of job '", job, "' is not the one to delete"));
    }
    gone = std::move(v->second);
    j->versions.erase(v);
  }
  const int64_t bytes = gone.bytes;
  Log("tensor_store")
      ->info("job {} version {} deleted ({} bytes)", job, version, bytes);
  absl::MutexLock lock(&release_mu_);
  releasing_.push_back(std::move(gone));  // its memory is freed by ReleaseLoop
  return bytes;
}

bool Store::DeleteStaged(const std::string& job, int64_t version,
                         int64_t max_epoch) {
  return DeleteVersionIf(job, version, [&](const Version& v) {
           return !v.committed && v.stage_epoch > 0 &&
                  v.stage_epoch <= max_epoch;
         }).ok();
}

absl::StatusOr<std::pair<int, int64_t>> Store::DeleteJob(
    const std::string& job) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end() || it->second != j) {
      return absl::NotFoundError(
          absl::StrCat("job '", job, "' was deleted meanwhile"));
    }
    jobs_.erase(it);
  }
  // A put still running for the job fails when it finishes (its job is
  // gone); its memory goes with it.
  std::vector<Version> gone;
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&j->mu);
    for (auto& [version, v] : j->versions) {
      bytes += v.bytes;
      gone.push_back(std::move(v));
    }
    j->versions.clear();
    // The declarations go with the job (a put still holding it sees no
    // version and fails).
    j->decl_memory.clear();
    metadata_bytes_ -= j->decl_bytes;
    j->decl_bytes = 0;
  }
  // Its next save will not come: the spares its saves asked for become
  // anyone's, and give way to the next job's registration (a job of the
  // same name starts from version 1 and could not take them as its own).
  const int64_t spares = spares_.Orphan(job);
  Log("tensor_store")
      ->info(
          "job {} deleted ({} versions, {} bytes; its {} bytes of spare "
          "save buffers are anyone's now)",
          job, gone.size(), bytes, spares);
  absl::MutexLock lock(&release_mu_);
  for (Version& v : gone) releasing_.push_back(std::move(v));
  return std::make_pair(static_cast<int>(gone.size()), bytes);
}

Store::Store(StoreOptions options)
    : hollow_(options.hollow),
      budget_(options.memory_limit_bytes),
      spares_(&budget_, options.hollow ? 0 : options.spare_pool_bytes) {
  release_thread_ = std::thread([this] { ReleaseLoop(); });
  if (options.fingerprint_committed) {
    fingerprint_thread_ = std::thread([this] { FingerprintLoop(); });
  }
}

Store::~Store() {
  {
    absl::MutexLock lock(&fingerprint_mu_);
    fingerprint_stop_ = true;
  }
  if (fingerprint_thread_.joinable()) fingerprint_thread_.join();
  {
    absl::MutexLock lock(&release_mu_);
    release_stop_ = true;
  }
  release_thread_.join();
}

void Store::FingerprintLoop() {
  // Idle priority: a reconfiguration that needs a fingerprint before this
  // thread got to it computes it itself (at most the region this thread is
  // on is computed twice).
  const sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  while (true) {
    FingerprintWork work;
    {
      absl::MutexLock lock(&fingerprint_mu_);
      fingerprint_mu_.Await(absl::Condition(
          +[](Store* s) ABSL_SHARED_LOCKS_REQUIRED(s->fingerprint_mu_) {
            return s->fingerprint_stop_ || !s->fingerprint_queue_.empty();
          },
          this));
      if (fingerprint_stop_) return;
      work = std::move(fingerprint_queue_.front());
      fingerprint_queue_.pop_front();
      fingerprint_busy_ = true;
    }
    // The version may have been deleted meanwhile: then its memory goes.
    if (std::shared_ptr<RegionBuffer> buffer = work.buffer.lock()) {
      WholeFingerprint(work.decl, work.region, *buffer);
    }
    absl::MutexLock lock(&fingerprint_mu_);
    fingerprint_busy_ = false;
  }
}

void Store::WaitFingerprinted() {
  absl::MutexLock lock(&fingerprint_mu_);
  fingerprint_mu_.Await(absl::Condition(
      +[](Store* s) ABSL_SHARED_LOCKS_REQUIRED(s->fingerprint_mu_) {
        return s->fingerprint_queue_.empty() && !s->fingerprint_busy_;
      },
      this));
}

void Store::ReleaseLoop() {
  while (true) {
    Version gone;
    {
      absl::MutexLock lock(&release_mu_);
      release_mu_.Await(absl::Condition(
          +[](Store* s) ABSL_SHARED_LOCKS_REQUIRED(s->release_mu_) {
            return s->release_stop_ || !s->releasing_.empty();
          },
          this));
      if (releasing_.empty()) return;  // stopping, and nothing left
      gone = std::move(releasing_.front());
      releasing_.pop_front();
      release_busy_ = true;
    }
    gone = Version();  // unmaps and closes its buffers (unless leased)
    absl::MutexLock lock(&release_mu_);
    release_busy_ = false;
  }
}

void Store::WaitReleased() {
  absl::MutexLock lock(&release_mu_);
  release_mu_.Await(absl::Condition(
      +[](Store* s) ABSL_SHARED_LOCKS_REQUIRED(s->release_mu_) {
        return s->releasing_.empty() && !s->release_busy_;
      },
      this));
}

namespace {

void FillDecl(const TensorDecl& d, proto::TensorDecl* out) {
  out->set_key(d.key);
  out->set_dtype(std::string(DTypeName(d.dtype)));
  for (int64_t e : d.shape) out->add_shape(e);
}

void FillRegion(const Region& r, proto::Region* out) {
  for (const Interval& i : r.dims()) {
    proto::Interval* d = out->add_dims();
    d->set_begin(i.begin);
    d->set_end(i.end);
  }
}

void FillTensor(const TensorDecl& d,
                const std::vector<StoredRegionRef>& regions,
                proto::TensorInfo* out) {
  FillDecl(d, out->mutable_decl());
  for (const StoredRegionRef& s : regions) {
    proto::StoredRegion* r = out->add_regions();
    FillRegion(s.region, r->mutable_region());
    r->set_bytes(s.buffer->size());
    r->set_checksum(s.checksum);
  }
}

}  // namespace

proto::ListResponse Store::List(const std::string& job) const {
  proto::ListResponse out;
  for (const auto& [name, j] : Jobs()) {
    if (!job.empty() && name != job) continue;
    proto::JobInfo* ji = out.add_jobs();
    ji->set_job(name);
    absl::MutexLock lock(&j->mu);
    ji->set_declared_tensors(static_cast<int32_t>(j->decls.size()));
    for (const auto& [number, v] : j->versions) {
      proto::VersionInfo* vi = ji->add_versions();
      vi->set_version(number);
      vi->set_committed(v.committed);
      vi->set_stage_epoch(v.stage_epoch);
      vi->set_bytes(v.bytes);
      vi->set_small_objects(static_cast<int32_t>(v.small_objects.size()));
      for (const auto& [key, regions] : v.tensors) {
        FillTensor(j->decls.at(key), regions, vi->add_tensors());
      }
    }
  }
  return out;
}

std::vector<proto::HeldVersion> Store::Versions() const {
  std::vector<proto::HeldVersion> out;
  for (const auto& [name, j] : Jobs()) {
    absl::MutexLock lock(&j->mu);
    for (const auto& [number, v] : j->versions) {
      proto::HeldVersion& h = out.emplace_back();
      h.set_job(name);
      h.set_version(number);
      h.set_committed(v.committed);
    }
  }
  return out;
}

absl::StatusOr<proto::StatResponse> Store::Stat(
    const std::string& job, int64_t version, const std::string& tensor) const {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Job> j, FindJob(job));
  absl::MutexLock lock(&j->mu);
  auto d = j->decls.find(tensor);
  if (d == j->decls.end()) {
    return absl::NotFoundError(absl::StrCat(
        "tensor '", tensor, "' is not declared for job '", job, "'"));
  }
  auto v = j->versions.find(version);
  if (v == j->versions.end()) {
    return absl::NotFoundError(absl::StrCat("job '", job, "' has no version ",
                                            version, " on this host"));
  }
  proto::StatResponse out;
  out.set_committed(v->second.committed);
  auto t = v->second.tensors.find(tensor);
  FillTensor(
      d->second,
      t == v->second.tensors.end() ? std::vector<StoredRegionRef>{} : t->second,
      out.mutable_tensor());
  return out;
}

absl::StatusOr<int64_t> Store::PrepareMemory(
    const std::string& job, int64_t version,
    const std::vector<int64_t>& sizes) {
  if (job.empty()) return absl::InvalidArgumentError("the job name is empty");
  if (version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version ", version, " is negative"));
  }
  for (int64_t size : sizes) {
    if (size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a buffer of ", size, " bytes cannot be prepared"));
    }
  }
  return spares_.Queue(sizes, {job, version});
}

void Store::FillStats(proto::StatsResponse* out) const {
  out->set_memory_used_bytes(budget_.used());
  out->set_spare_bytes(spares_.ready_bytes());
  out->set_spare_queued_bytes(spares_.queued_bytes());
  out->set_spare_capacity_bytes(spares_.capacity());
  out->set_memory_limit_bytes(budget_.limit());
  out->set_metadata_bytes(metadata_bytes());
  for (const auto& [name, j] : Jobs()) {
    absl::MutexLock lock(&j->mu);
    for (const auto& [number, v] : j->versions) {
      proto::VersionBytes* vb = out->add_versions();
      vb->set_job(name);
      vb->set_version(number);
      vb->set_bytes(v.bytes);
      vb->set_committed(v.committed);
    }
  }
}

}  // namespace ptc
