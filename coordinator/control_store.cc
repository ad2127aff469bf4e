#include "coordinator/control_store.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "proto/coordinator.pb.h"

namespace ptc {

std::string JobRecord(const std::string& job) {
  return absl::StrCat("jobs/", job);
}

std::string HostRecord(const std::string& host) {
  return absl::StrCat("hosts/", host);
}

absl::Status TooManyRecords(size_t records) {
  return absl::InvalidArgumentError(
      absl::StrCat("a transaction of ", records,
                   " records is more than the store takes at "
                   "once (",
                   kMaxRecordsPerCommit,
                   ", etcd's default --max-txn-ops); nothing was written"));
}

std::string LayoutRecord(const std::string& job) {
  return absl::StrCat("layouts/", job);
}

std::string KeptRecord(const std::string& job, int64_t version, int32_t part) {
  // A safe file name where the job's is (a state directory's file name
  // is the record's name, hex-encoded where it is not safe).
  return absl::StrCat("kept/", job, ".", version, ".", part);
}

namespace {

// The folders of named records (each NAME.pb in a directory of its own).
constexpr const char* kFolders[] = {"jobs", "layouts", "hosts", "kept"};

// Whether `name` can be a file's name as it is: what job and host names
// may hold (letters, digits, '.', '_', '-', not starting with '.' or '-'),
// short enough for NAME.pb.
bool SafeFileName(const std::string& name) {
  if (name.empty() || name.size() > 250 || name[0] == '.' || name[0] == '-')
    return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-')
      return false;
  }
  return true;
}

class LocalControlStore final : public ControlStore {
 public:
  explicit LocalControlStore(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<std::map<std::string, std::string>> ReadAll() override {
    // A transaction a crash interrupted is applied first: all or none.
    PTC_ASSIGN_OR_RETURN(std::optional<std::string> journal,
                         ReadFileIfExists(JournalPath()));
    if (journal) {
      proto::ControlCommit commit;
      if (!commit.ParseFromString(*journal)) {
        return absl::DataLossError(
            absl::StrCat(JournalPath(), " is not a coordinator journal"));
      }
      PTC_RETURN_IF_ERROR(Apply(commit));
    }
    std::map<std::string, std::string> out;
    PTC_ASSIGN_OR_RETURN(std::optional<std::string> cluster,
                         ReadFileIfExists(FileOf(kClusterRecord)));
    if (cluster) out[kClusterRecord] = *std::move(cluster);
    for (const char* folder : kFolders) {
      const std::string path = absl::StrCat(dir_, "/", folder);
      if (!std::filesystem::exists(path)) continue;
      std::error_code error;
      for (const auto& entry :
           std::filesystem::directory_iterator(path, error)) {
        if (entry.path().extension() != ".pb") continue;
        PTC_ASSIGN_OR_RETURN(std::optional<std::string> bytes,
                             ReadFileIfExists(entry.path().string()));
        if (!bytes) continue;  // removed meanwhile
        out[absl::StrCat(folder, "/", NameOfFile(entry.path().stem()))] =
            *std::move(bytes);
      }
      if (error) {
        return absl::InternalError(
            absl::StrCat("listing ", path, ": ", error.message()));
      }
    }
    return out;
  }

  absl::Status Commit(const Writes& writes) override {
    if (writes.size() > kMaxRecordsPerCommit)
      return TooManyRecords(writes.size());
    proto::ControlCommit commit;
    for (const auto& [key, value] : writes) {
      PTC_RETURN_IF_ERROR(CheckKey(key));
      if (value) {
        (*commit.mutable_put())[key] = *value;
      } else {
        commit.add_deleted(key);
      }
    }
    // One record is one atomic file already; several go through the
    // journal, so that a crash leaves all of them or none.
    if (writes.size() > 1) {
      PTC_RETURN_IF_ERROR(
          WriteFileAtomically(JournalPath(), commit.SerializeAsString()));
    }
    return Apply(commit);
  }

  std::string Describe() const override {
    return absl::StrCat("state directory ", dir_);
  }

 private:
  // The folder of a named record's key ("jobs"), or null.
  static const char* FolderOf(const std::string& key) {
    for (const char* folder : kFolders) {
      const std::string prefix = absl::StrCat(folder, "/");
      if (absl::StartsWith(key, prefix) && key.size() > prefix.size())
        return folder;
    }
    return nullptr;
  }

  static absl::Status CheckKey(const std::string& key) {
    if (key == kClusterRecord || FolderOf(key) != nullptr)
      return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is not a coordinator record"));
  }

  std::string JournalPath() const { return dir_ + "/commit.pb"; }

  // A named record's file: FOLDER/NAME.pb where NAME is a safe file name
  // (job and host names are checked when they register, so only state
  // from before those checks has others), else "x-" and the name in hex.
  std::string FileOf(const std::string& key) const {
    if (key == kClusterRecord) return dir_ + "/state.pb";
    const char* folder = FolderOf(key);
    const std::string name = key.substr(std::strlen(folder) + 1);
    return absl::StrCat(dir_, "/", folder, "/",
                        SafeFileName(name)
                            ? name
                            : absl::StrCat("x-", absl::BytesToHexString(name)),
                        ".pb");
  }

  // The name a file is named for: a file name is read as hex only where
  // the name it encodes could not have been written as it is. (The
  // coordinator takes a job's name from the record itself.)
  static std::string NameOfFile(const std::string& stem) {
    if (absl::StartsWith(stem, "x-")) {
      const std::string hex = stem.substr(2);
      if (!hex.empty() && hex.size() % 2 == 0 &&
          hex.find_first_not_of("0123456789abcdef") == std::string::npos) {
        std::string name = absl::HexStringToBytes(hex);
        if (!SafeFileName(name)) return name;
      }
    }
    return stem;
  }

  absl::Status Apply(const proto::ControlCommit& commit) {
    for (const auto& [key, value] : commit.put()) {
      if (const char* folder = FolderOf(key)) {
        std::error_code error;
        std::filesystem::create_directories(
            absl::StrCat(dir_, "/", folder), error);
      }
      PTC_RETURN_IF_ERROR(WriteFileAtomically(FileOf(key), value));
    }
    for (const std::string& key : commit.deleted()) {
      std::error_code error;
      std::filesystem::remove(FileOf(key), error);
      if (error) {
        return absl::InternalError(absl::StrCat(
            "removing ", FileOf(key), ": ", error.message()));
      }
    }
    std::error_code error;
    std::filesystem::remove(JournalPath(), error);
    if (error) {
      return absl::InternalError(absl::StrCat("removing ", JournalPath(),
                                              ": ", error.message()));
    }
    return absl::OkStatus();
  }

  const std::string dir_;
};

size_t BytesOf(const ControlStore::Writes::value_type& write) {
  return write.first.size() + (write.second ? write.second->size() : 0);
}

size_t BytesOf(const ControlStore::Writes& writes) {
  size_t bytes = 0;
  for (const auto& write : writes) bytes += BytesOf(write);
  return bytes;
}

bool IsKept(const std::string& key) { return absl::StartsWith(key, "kept/"); }

// Commits `batch` and adds it to `done->written` once it committed.
absl::Status CommitBatch(ControlStore& store, const ControlStore::Writes& batch,
                         CommittedRecords* done) {
  PTC_RETURN_IF_ERROR(store.Commit(batch));
  for (const auto& [key, bytes] : batch) done->written[key] = bytes;
  return absl::OkStatus();
}

// Takes out of `writes` those `picked` takes and commits them in
// transactions of at most `batch_bytes` and kMaxRecordsPerCommit records;
// the records of one unit (`unit_of` their key: a job's two records) in the
// same one.
template <typename Picked, typename UnitOf>
absl::Status CommitFirst(ControlStore& store, ControlStore::Writes* writes,
                         size_t batch_bytes, Picked picked, UnitOf unit_of,
                         CommittedRecords* done) {
  std::map<std::string, ControlStore::Writes> units;
  std::vector<std::string> order;
  for (auto it = writes->begin(); it != writes->end();) {
    if (!picked(*it)) {
      ++it;
      continue;
    }
    auto [unit, fresh] = units.try_emplace(unit_of(it->first));
    if (fresh) order.push_back(unit->first);
    unit->second.insert(writes->extract(it++));
  }
  ControlStore::Writes batch;
  size_t bytes = 0;
  for (const std::string& u : order) {
    ControlStore::Writes& unit = units[u];
    const size_t unit_bytes = BytesOf(unit);
    if (!batch.empty() && (bytes + unit_bytes > batch_bytes ||
                           batch.size() + unit.size() > kMaxRecordsPerCommit)) {
      PTC_RETURN_IF_ERROR(CommitBatch(store, batch, done));
      batch.clear();
      bytes = 0;
    }
    bytes += unit_bytes;
    batch.merge(unit);
  }
  return batch.empty() ? absl::OkStatus() : CommitBatch(store, batch, done);
}

}  // namespace

CommittedRecords CommitRecords(ControlStore& store, ControlStore::Writes writes,
                               size_t batch_bytes) {
  CommittedRecords done;
  auto fits = [&] {
    return writes.size() <= kMaxRecordsPerCommit &&
           BytesOf(writes) <= batch_bytes;
  };
  auto itself = [](const std::string& key) { return key; };
  if (!fits()) {
    done.status = CommitFirst(
        store, &writes, batch_bytes,
        [](const auto& write) {
          return IsKept(write.first) && write.second.has_value();
        },
        itself, &done);
    if (!done.status.ok()) return done;
    done.status = CommitFirst(
        store, &writes, batch_bytes,
        [](const auto& write) {
          return absl::StartsWith(write.first, "hosts/");
        },
        itself, &done);
    if (!done.status.ok()) return done;
  }
  if (!fits()) {
    done.status = CommitFirst(
        store, &writes, batch_bytes,
        [](const auto& write) {
          return (absl::StartsWith(write.first, "jobs/") ||
                  absl::StartsWith(write.first, "layouts/")) &&
                 write.second.has_value();
        },
        [](const std::string& key) { return key.substr(key.find('/') + 1); },
        &done);
    if (!done.status.ok()) return done;
  }
  ControlStore::Writes after;
  if (writes.size() > kMaxRecordsPerCommit) {
    for (auto it = writes.begin(); it != writes.end();) {
      if (IsKept(it->first)) {
        after.insert(writes.extract(it++));
      } else {
        ++it;
      }
    }
  }
  done.status = CommitBatch(store, writes, &done);
  if (!done.status.ok() || after.empty()) return done;
  // Written: what is left are deletes of copies no version needs.
  for (const auto& write : after) done.undeleted.push_back(write.first);
  done.undeleted_status = CommitFirst(
      store, &after, batch_bytes, [](const auto&) { return true; }, itself,
      &done);
  if (done.undeleted_status.ok()) done.undeleted.clear();
  return done;
}

absl::StatusOr<std::unique_ptr<ControlStore>> OpenLocalControlStore(
    const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "the coordinator needs a state directory");
  }
  // Created if missing (its parent must exist), and it must be writable:
  // a coordinator that cannot persist must not take registrations.
  std::error_code error;
  std::filesystem::create_directories(dir + "/jobs", error);
  if (error || access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the state directory '", dir, "' cannot be created or written",
        error ? absl::StrCat(": ", error.message()) : std::string()));
  }
  return std::make_unique<LocalControlStore>(dir);
}

}  // namespace ptc
