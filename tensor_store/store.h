// The versioned in-memory store of one host: for every job, its declared
// tensors (key, dtype, shape) and its versions; in every version, the
// stored regions of each tensor, each a sealed RegionBuffer with the xxh3
// checksum taken when it entered the store.
//
// Writes are atomic: BeginPut reserves memory and allocates the buffer,
// the caller fills it, FinishPut seals, checks and publishes it in one step;
// a PendingPut that is dropped leaves nothing behind. Committed versions
// are immutable. Reads collect references to the buffers they need under
// the job's lock and copy outside it.
//
// Thread-safe. Lock order: Store::mu_ (the job map) before Job::mu; data is
// never copied while a lock is held.
//
//   Store store({.memory_limit_bytes = 8LL << 30});
//   store.DeclareTensors("run7", {{"w", DType::kFloat16, {1024, 1024}}});
//   PTC_ASSIGN_OR_RETURN(auto put, store.BeginPut("run7", 1, "w", region));
//   std::memcpy(put->buffer->mutable_data(), bytes, put->bytes);
//   PTC_RETURN_IF_ERROR(store.FinishPut(std::move(put)).status());
#ifndef PTC_TENSOR_STORE_STORE_H_
#define PTC_TENSOR_STORE_STORE_H_

#include <cstdint>
#include <deque>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/tensor_store.pb.h"
#include "ptc/dtype.h"
#include "ptc/region.h"
#include "ptc/small_object.h"
#include "ptc/tensor_decl.h"
#include "tensor_store/memory_budget.h"
#include "tensor_store/region_buffer.h"
#include "tensor_store/spare_pool.h"

namespace ptc {

// What one declaration is charged against the store's memory limit: its
// key and shape and the bookkeeping around them (a job that declares a
// million tensors pays for them like for data).
inline int64_t TensorDeclMetadataBytes(const TensorDecl& d) {
  return 256 + static_cast<int64_t>(d.key.size()) +
         16 * static_cast<int64_t>(d.shape.size());
}

// What a stored small object costs against the memory limit: its bytes,
// its name and the entry that holds them (map node, strings, counts).
inline int64_t SmallObjectMemoryBytes(const std::string& name,
                                      const std::string& bytes) {
  return 160 + static_cast<int64_t>(name.size() + bytes.size());
}

// A small object's bytes, immutable once stored, and their xxh3-64.
struct SmallObjectRef {
  std::shared_ptr<const std::string> bytes;
  uint64_t checksum = 0;
};

// A declaration from the wire; INVALID_ARGUMENT naming the tensor for an
// unknown dtype (shapes are checked by Store::DeclareTensors).
absl::StatusOr<TensorDecl> TensorDeclFromProto(const proto::TensorDecl& d);

struct StoredRegionRef {
  Region region;
  std::shared_ptr<RegionBuffer> buffer;
  uint64_t checksum = 0;
};

// A region being written; invisible until FinishPut.
struct PendingPut {
  std::string job;
  int64_t version = 0;
  TensorDecl decl;
  Region region;
  int64_t bytes = 0;
  std::shared_ptr<RegionBuffer> buffer;
  // The version's incarnation when the put began (0: it did not exist),
  // and the job's; detect a delete while the put runs.
  uint64_t version_id = 0;
  uint64_t job_id = 0;
  // The plan epoch of the staging that writes (0: a save).
  int64_t stage_epoch = 0;
  // The whole region's fingerprint, where the writer added it up while it
  // wrote (StagedSums): FinishPut remembers it with the buffer, so that
  // proving the version reads none of its bytes again.
  std::optional<uint64_t> fingerprint;
};

// What a version must hold before it may commit (a save's: the regions and
// small objects of the ranks placed on this host).
struct VersionExpectation {
  std::vector<std::pair<std::string, Region>> regions;   // (tensor, region)
  std::vector<std::pair<std::string, int32_t>> small_objects;  // (name, rank)
  bool empty() const { return regions.empty() && small_objects.empty(); }
};

struct CommitResult {
  int64_t bytes = 0;
  // xxh3-64 of each expected region, in order.
  std::vector<uint64_t> checksums;
};

// What a read of `region` needs: the tensor and the stored regions that
// intersect it (which together cover it).
struct ReadView {
  TensorDecl decl;
  Region region;
  std::vector<StoredRegionRef> sources;
  // True if `region` is exactly sources[0]'s region.
  bool exact = false;
};

struct StoreOptions {
  int64_t memory_limit_bytes = int64_t{8} << 30;
  // Bytes of pre-allocated memory kept ready for local saves (SparePool);
  // counted in the memory limit, evicted first when a put needs room.
  int64_t spare_pool_bytes = 0;
  // Fingerprint every committed version's stored regions in the background
  // (one thread, idle priority), so that a reconfiguration from a version
  // clients saved finds them ready instead of computing them while the job
  // waits.
  bool fingerprint_committed = true;
  // Keep every region's metadata but none of its bytes (RegionBuffer::
  // CreateHollow): the scale harness's hosts, hundreds in one process.
  // Memory is charged as if the bytes were there; a region's checksum and
  // fingerprint are functions of its bounds (HollowFingerprint), so
  // replicas agree and changes are proven as in a real store.
  bool hollow = false;
};

class Store {
 public:
  explicit Store(StoreOptions options);
  // Frees every deleted version's memory first.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Declares tensors of `job` (creating the job); returns how many were new.
  absl::StatusOr<int> DeclareTensors(const std::string& job,
                                     const std::vector<TensorDecl>& tensors);

  // Who may write a version: a version is either a save's (written by
  // puts with stage_epoch 0, created by the first) or staged by a
  // reconfiguration (created by CreateStaged under its plan epoch, written
  // only by writers of that epoch). Each kind of writer is refused the
  // other's versions, so a save can never land inside a staged version nor
  // a stale plan inside a save; a staged writer never re-creates a version
  // that was aborted or fenced under it.

  // Creates `version` of `job` as a staged version of plan epoch `epoch`
  // (> 0). ALREADY_EXISTS if the version exists.
  absl::Status CreateStaged(const std::string& job, int64_t version,
                            int64_t epoch);

  // Starts a put of `region` of `tensor` into `version` (created if new
  // and `stage_epoch` is 0). `dtype`, if given, must match the declaration.
  // With `map` false the buffer is not mapped here (a local client fills it
  // through its fd), except fresh memory from kHugePageBytes up to
  // kCopyThroughDescriptorBelow, mapped in huge pages and populated.
  absl::StatusOr<std::unique_ptr<PendingPut>> BeginPut(
      const std::string& job, int64_t version, const std::string& tensor,
      const Region& region, std::optional<DType> dtype = std::nullopt,
      bool map = true, int64_t stage_epoch = 0);

  // BeginPut of several regions of a save's `version` into one pack
  // (RegionBuffer::Slice): one memfd, each region from a kPackAlignment
  // boundary, unmapped here (fresh memory of a huge page or more is mapped
  // in huge pages and populated, as BeginPut's). Every item is checked
  // first: an error names the item, and nothing is allocated. The first
  // FinishPut(s) of any of the puts seals the whole pack. At most
  // kMaxPackRegions items and kMaxPackBytes bytes.
  absl::StatusOr<std::vector<std::unique_ptr<PendingPut>>> BeginPuts(
      const std::string& job, int64_t version,
      const std::vector<std::pair<std::string, Region>>& items);
  // Seals the buffer, checksums it (or takes `computed`, the checksum the
  // caller took while writing), compares with `expected` (0: no check) and
  // publishes the region. Returns the checksum.
  absl::StatusOr<uint64_t> FinishPut(
      std::unique_ptr<PendingPut> put,
      std::optional<uint64_t> computed = std::nullopt, uint64_t expected = 0);

  // FinishPut of several puts at once (a rank's whole save), their
  // checksums taken by up to kMaxChecksumThreads threads, largest first;
  // each put is published as FinishPut would, in order. `expected` is
  // empty or one per put (0: no check). Every put gets an answer, its
  // status and the checksum of its bytes as the store took it (also when
  // the region was refused, e.g. ALREADY_EXISTS: the caller can compare
  // its copy with the one stored; 0 where the buffer could not be sealed).
  struct PutOutcome {
    absl::Status status;
    uint64_t checksum = 0;
  };
  static constexpr int kMaxChecksumThreads = 8;
  std::vector<PutOutcome> FinishPuts(
      std::vector<std::unique_ptr<PendingPut>> puts,
      const std::vector<uint64_t>& expected);

  // Adds `ref` (a region stored in another version of the job, e.g. from
  // OpenRead) to `version` as it is: the two versions share the sealed,
  // immutable buffer, and its memory is counted once. Creates the version
  // if new; refuses committed versions and regions already there.
  absl::Status Link(const std::string& job, int64_t version,
                    const std::string& tensor, const StoredRegionRef& ref,
                    int64_t stage_epoch = 0);

  absl::StatusOr<ReadView> OpenRead(const std::string& job, int64_t version,
                                    const std::string& tensor,
                                    const Region& region);

  // Fingerprint (ptc/fingerprint.h) and element count of `regions`, or of
  // the union of the stored regions if `regions` is empty.
  absl::StatusOr<std::pair<uint64_t, int64_t>> Fingerprint(
      const std::string& job, int64_t version, const std::string& tensor,
      const std::vector<Region>& regions);

  // Stores small object `name` of `rank` in `version` (created if new);
  // refuses committed versions, an object already there, and objects
  // larger than kMaxSmallObjectBytes. If `expected` is non-zero it must be
  // the bytes' xxh3-64 (DATA_LOSS otherwise). Counted in the memory limit.
  absl::Status PutSmallObject(const std::string& job, int64_t version,
                              const std::string& name, int32_t rank,
                              std::string bytes, uint64_t expected = 0,
                              int64_t stage_epoch = 0);
  absl::StatusOr<SmallObjectRef> GetSmallObject(const std::string& job,
                                                int64_t version,
                                                const std::string& name,
                                                int32_t rank) const;

  // Returns the version's bytes.
  absl::StatusOr<int64_t> Commit(const std::string& job, int64_t version);
  // Checks that `version` stores every region of `expect` exactly (as one
  // stored region) and every small object, else FAILED_PRECONDITION naming
  // the first one missing, and nothing changes; then, unless `check_only`,
  // commits it. Check and commit are one step under the job's lock.
  absl::StatusOr<CommitResult> CommitChecked(const std::string& job,
                                             int64_t version,
                                             const VersionExpectation& expect,
                                             bool check_only);
  // Removes the version at once; its memory is freed in the background
  // (see WaitReleased). Returns the version's bytes.
  absl::StatusOr<int64_t> DeleteVersion(const std::string& job,
                                        int64_t version);
  // Deletes `version` if it is a staged version (not committed) of a plan
  // epoch in (0, max_epoch]: what an abort or a fence may delete. Never a
  // save's version. True if it deleted one.
  bool DeleteStaged(const std::string& job, int64_t version,
                    int64_t max_epoch);
  // Forgets `job`: removes all its versions (their memory is freed in the
  // background, as DeleteVersion's) and its declarations. Returns the
  // number of versions and their bytes.
  absl::StatusOr<std::pair<int, int64_t>> DeleteJob(const std::string& job);
  // Waits until the memory of every deleted version (DeleteVersion frees it
  // in the background) is back in the budget, unless a lease holds it.
  void WaitReleased();
  // Waits until the background fingerprints of the committed versions
  // (StoreOptions::fingerprint_committed) are done.
  void WaitFingerprinted();

  // Empty `job` lists all jobs.
  proto::ListResponse List(const std::string& job) const;
  // Every version of every job, without its regions (cheap).
  std::vector<proto::HeldVersion> Versions() const;
  absl::StatusOr<proto::StatResponse> Stat(const std::string& job,
                                           int64_t version,
                                           const std::string& tensor) const;
  // Queues spare memory for a coming change of `job`'s layout that will
  // stage buffers of `sizes` bytes into a version after `version` (see
  // SparePool::Queue). Returns the bytes ready or being prepared.
  absl::StatusOr<int64_t> PrepareMemory(const std::string& job, int64_t version,
                                        const std::vector<int64_t>& sizes);
  bool hollow() const { return hollow_; }
  int64_t spare_capacity() const { return spares_.capacity(); }
  int64_t memory_used() const { return budget_.used(); }
  // Of memory_used(), the jobs' tensor declarations, and the rest: data.
  int64_t metadata_bytes() const { return metadata_bytes_.load(); }
  int64_t data_bytes_used() const { return memory_used() - metadata_bytes(); }
  int64_t memory_limit() const { return budget_.limit(); }
  int64_t spare_ready() const { return spares_.ready_bytes(); }
  // Fills memory and per-version bytes.
  void FillStats(proto::StatsResponse* out) const;

  const MemoryBudget& budget() const { return budget_; }
  SparePool& spares() { return spares_; }

 private:
  struct Version {
    uint64_t id = 0;
    bool committed = false;
    int64_t stage_epoch = 0;  // see CreateStaged
    int64_t bytes = 0;
    std::map<std::string, std::vector<StoredRegionRef>> tensors;
    // (name, rank) -> bytes; each paid for by its reservation.
    std::map<std::pair<std::string, int32_t>, SmallObjectRef> small_objects;
    std::vector<MemoryBudget::Reservation> small_object_memory;
  };
  struct Job {
    uint64_t id = 0;  // distinct for every job created in this store
    mutable absl::Mutex mu;
    std::map<std::string, TensorDecl> decls ABSL_GUARDED_BY(mu);
    // What `decls` are charged against the memory limit, one reservation
    // per DeclareTensors that added some.
    std::vector<MemoryBudget::Reservation> decl_memory ABSL_GUARDED_BY(mu);
    int64_t decl_bytes ABSL_GUARDED_BY(mu) = 0;
    std::map<int64_t, Version> versions ABSL_GUARDED_BY(mu);
    uint64_t next_version_id ABSL_GUARDED_BY(mu) = 1;
  };

  absl::StatusOr<std::shared_ptr<Job>> FindJob(const std::string& job) const;
  // BeginPut's checks of one region and its PendingPut, without a buffer.
  absl::StatusOr<std::unique_ptr<PendingPut>> PreparePut(
      const Job& j, const std::string& job, int64_t version,
      const std::string& tensor, const Region& region,
      std::optional<DType> dtype, int64_t stage_epoch);
  // Memory for a put of `bytes`: a spare of that size, else reserved (what
  // names it in the error when it does not fit) and created (`name`: the
  // memfd's).
  absl::StatusOr<std::shared_ptr<RegionBuffer>> AllocateBuffer(
      int64_t bytes, const std::string& job, int64_t version,
      const std::string& what, const std::string& name, bool map);
  // Notes in `put` the incarnations of its job and version it writes into.
  static void StampIncarnation(const Job& j, PendingPut* put);
  // Deletes `version` if `pred` holds for it (checked under the job's
  // lock); FAILED_PRECONDITION if not, NOT_FOUND if absent.
  absl::StatusOr<int64_t> DeleteVersionIf(
      const std::string& job, int64_t version,
      const std::function<bool(const Version&)>& pred);
  // The open `version` of `j` for a writer of `stage_epoch` (created if
  // new and a save's); refuses a committed one and another writer's.
  static absl::StatusOr<Version*> OpenVersionLocked(Job& j,
                                                    const std::string& job,
                                                    int64_t version,
                                                    int64_t stage_epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu);
  // OK if a writer of `stage_epoch` may write into `v` (nullptr: absent).
  static absl::Status CheckWriterLocked(const Version* v,
                                        const std::string& job,
                                        int64_t version, int64_t stage_epoch);
  std::vector<std::pair<std::string, std::shared_ptr<Job>>> Jobs() const;
  // Deleted versions are freed by a thread of their own: DeleteVersion
  // returns once the version is gone from the index, without waiting for
  // its memory (freeing a GiB of shared memory takes a third of a second
  // on a VM, and a client's save waits for the previous version's release).
  void ReleaseLoop();
  // Computes the queued regions' fingerprints, at idle priority, until
  // fingerprint_stop_.
  void FingerprintLoop();
  const bool hollow_;
  MemoryBudget budget_;
  std::atomic<int64_t> metadata_bytes_{0};
  SparePool spares_;  // after budget_: returns its memory before budget_ dies
  // A whole stored region to fingerprint; skipped once its buffer is gone.
  struct FingerprintWork {
    TensorDecl decl;
    Region region;
    std::weak_ptr<RegionBuffer> buffer;
  };
  absl::Mutex fingerprint_mu_;
  std::deque<FingerprintWork> fingerprint_queue_
      ABSL_GUARDED_BY(fingerprint_mu_);
  bool fingerprint_busy_ ABSL_GUARDED_BY(fingerprint_mu_) = false;
  bool fingerprint_stop_ ABSL_GUARDED_BY(fingerprint_mu_) = false;
  std::thread fingerprint_thread_;
  absl::Mutex release_mu_;
  std::deque<Version> releasing_ ABSL_GUARDED_BY(release_mu_);
  bool release_busy_ ABSL_GUARDED_BY(release_mu_) = false;
  bool release_stop_ ABSL_GUARDED_BY(release_mu_) = false;
  std::thread release_thread_;  // after what it frees into
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// Splits `region` into disjoint pieces, each inside one of `sources`, and
// calls fn(piece, source) for each. NOT_FOUND naming the first uncovered
// part if the sources do not cover `region`.
absl::Status ForEachCoveringPiece(
    const Region& region, const std::vector<StoredRegionRef>& sources,
    const std::function<void(const Region&, const StoredRegionRef&)>& fn);

}  // namespace ptc

#endif  // PTC_TENSOR_STORE_STORE_H_
