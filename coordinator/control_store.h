// The coordinator's durable control state: records (a key, its bytes)
// that must outlive the coordinator's process, and with etcd its machine.
// The coordinator keeps one record per host ("hosts/NAME": its
// registration), two per job ("jobs/NAME": its registration, versions and
// the change in flight; "layouts/NAME": its placements, host lists and
// layout spec, which saves do not change), the copies it keeps of jobs'
// small objects ("kept/JOB.VERSION.PART") and one for the rest
// ("cluster": retired plan epochs), and writes every decision that must survive
// as one transaction of the records it changed.
//
//   std::unique_ptr<ControlStore> store = OpenLocalControlStore(dir).value();
//   PTC_RETURN_IF_ERROR(store->Commit({{"jobs/j", bytes}, {"cluster", c}}));
//   auto records = store->ReadAll();  // at start, or on taking the lead
//
// Two implementations: the local state directory (one coordinator, the
// embedded default) and etcd (coordinator/etcd_control_store.h: several
// coordinators, one leads, every write fenced by its leadership).
#ifndef PTC_COORDINATOR_CONTROL_STORE_H_
#define PTC_COORDINATOR_CONTROL_STORE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ptc {

// Keys of the coordinator's records.
inline constexpr char kClusterRecord[] = "cluster";
std::string JobRecord(const std::string& job);    // "jobs/" + job
std::string HostRecord(const std::string& host);  // "hosts/" + host
// "layouts/" + job: the part of a job's record that grows with its ranks
// and hosts (placements, host lists, layout spec, pending change), which
// saves do not change.
std::string LayoutRecord(const std::string& job);
// "kept/JOB.VERSION.PART": a part of the small objects the coordinator
// keeps of a job's committed version.
std::string KeptRecord(const std::string& job, int64_t version, int32_t part);

// The most records one Commit may hold: etcd's default --max-txn-ops
// (operations in one transaction). Both stores refuse more
// (INVALID_ARGUMENT), so that a write etcd would refuse fails the same way
// against the state directory, where most tests run; the coordinator
// writes a larger change as several transactions (PersistLocked).
inline constexpr size_t kMaxRecordsPerCommit = 128;

class ControlStore {
 public:
  // A transaction: each key set to its bytes, or deleted (nullopt).
  using Writes = std::map<std::string, std::optional<std::string>>;

  virtual ~ControlStore() = default;

  // Every record, by key.
  virtual absl::StatusOr<std::map<std::string, std::string>> ReadAll() = 0;

  // Applies `writes` all or none. FAILED_PRECONDITION when this process
  // may no longer write (etcd: another coordinator leads now), UNAVAILABLE
  // when the store cannot be reached (whether it was written is unknown),
  // INVALID_ARGUMENT when the transaction is larger than the store takes
  // (bytes, or more than kMaxRecordsPerCommit records), another code when
  // the store refused it (etcd: RESOURCE_EXHAUSTED when its space quota is
  // used up); nothing is written then.
  virtual absl::Status Commit(const Writes& writes) = 0;

  // Where the records live, for logs ("state directory /var/lib/ptc",
  // "etcd 10.0.0.1:2379,... under /ptc").
  virtual std::string Describe() const = 0;
};

// The refusal of a transaction of `records` records, more than
// kMaxRecordsPerCommit.
absl::Status TooManyRecords(size_t records);

// What CommitRecords did: `status` is the first transaction's failure (OK
// when every record but a trailing delete was written); `written` holds
// every record of the transactions that committed, as they now stand in
// the store (before a failure too: a change too large for one transaction
// is written as several, and a later one can be refused after earlier ones
// committed); `undeleted` names the deletes of kept copies that were left
// for last and failed with `undeleted_status` (`status` is OK then: a
// later write deletes them).
struct CommittedRecords {
  absl::Status status;
  ControlStore::Writes written;
  std::vector<std::string> undeleted;
  absl::Status undeleted_status;
};

// Commits the coordinator's `writes` through `store`: one transaction where
// it fits (kMaxRecordsPerCommit records and `batch_bytes`). Else the records
// that are facts of their own go first, in transactions of at most
// `batch_bytes` and kMaxRecordsPerCommit records: the kept copies of jobs'
// new versions (useless until their job's record names the version), each
// host's registration (a rack declared dead, a coordinator's first write
// after an older one's state file), then where there are still too many,
// each job's new or changed records (its "jobs/" and "layouts/" together:
// they hold its decisions whole). The last transaction holds the rest (the
// deletes and the cluster record: a forgotten job's removal and its retired
// epoch together); the deletes of kept copies are left after it where they
// do not fit. Stops at the first transaction that fails.
CommittedRecords CommitRecords(ControlStore& store, ControlStore::Writes writes,
                               size_t batch_bytes = 512 << 10);

// The records as files of `dir` (created if missing; it must be
// writable): "cluster" is state.pb, and "FOLDER/NAME" (jobs, layouts,
// hosts, kept) is FOLDER/NAME.pb (a name that is not a safe file name is
// hex-encoded). A transaction of several
// records is journaled first (commit.pb, written atomically, applied,
// removed; a journal left by a crash is applied by the next ReadAll).
absl::StatusOr<std::unique_ptr<ControlStore>> OpenLocalControlStore(
    const std::string& dir);

}  // namespace ptc

#endif  // PTC_COORDINATOR_CONTROL_STORE_H_
