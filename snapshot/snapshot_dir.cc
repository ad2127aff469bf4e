#include "snapshot/snapshot_dir.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "ptc/dtype.h"
#include "ptc/region.h"
#include "ptc/region_proto.h"
#include "ptc/tensor_decl.h"

namespace ptc {
namespace fs = std::filesystem;

absl::Status CheckSnapshotRoot(const std::string& root,
                               const std::string& allowed) {
  if (root.empty() || root[0] != '/' || root.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot directory '", root.substr(0, 200),
                     "' must be an absolute path (at most 4096 bytes)"));
  }
  for (absl::string_view part : absl::StrSplit(root, '/')) {
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "snapshot directory '", root, "' has a '.' or '..' component"));
    }
  }
  if (root.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("snapshot directory has a NUL byte");
  }
  if (!allowed.empty()) {
    std::string base = allowed;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    if (root != base && !absl::StartsWith(root, base + "/")) {
      return absl::PermissionDeniedError(absl::StrCat(
          "snapshot directory '", root, "' is outside this ptcd's ",
          "snapshot_root '", base, "'"));
    }
  }
  return absl::OkStatus();
}

std::string SnapshotDirName(int64_t version) {
  return absl::StrFormat("snapshot-%012d", version);
}

absl::Status CheckSnapshotFileName(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 255 && name[0] != '.' &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "snapshot file name '", name.substr(0, 64),
      "' must be letters, digits, '.', '_' or '-' (not starting with '.')"));
}

std::string ManifestToJson(const proto::SnapshotManifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(manifest, &out, options);
  return out;
}

absl::StatusOr<proto::SnapshotManifest> ManifestFromJson(
    const std::string& json, const std::string& where) {
  proto::SnapshotManifest m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // later versions may add fields
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &m, options);
      !s.ok()) {
    return absl::DataLossError(
        absl::StrCat(where, " is not a ptc snapshot manifest: ", s.ToString()));
  }
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(where, ": ", what));
  };
  if (m.format() != kSnapshotFormat) {
    return bad(
        absl::StrCat("format '", m.format(), "' is not ", kSnapshotFormat));
  }
  std::set<std::string> files;
  for (const proto::SnapshotFile& f : m.files()) {
    if (!CheckSnapshotFileName(f.name()).ok() || f.bytes() < 0)
      return bad(absl::StrCat("file entry '", f.name(), "' is malformed"));
    files.insert(f.name());
  }
  std::vector<TensorDecl> decls;
  for (const proto::TensorDecl& d : m.tensors()) {
    auto dtype = ParseDType(d.dtype());
    if (!dtype.ok()) return bad(std::string(dtype.status().message()));
    TensorDecl decl{d.key(), *dtype, Shape(d.shape().begin(), d.shape().end())};
    for (int64_t e : decl.shape)
      if (e < 0)
        return bad(
            absl::StrCat("tensor '", d.key(), "' has a negative extent"));
    decls.push_back(std::move(decl));
  }
  std::map<std::string, int64_t> file_bytes;
  for (const proto::SnapshotFile& f : m.files())
    file_bytes[f.name()] = f.bytes();
  std::vector<int64_t> covered(decls.size(), 0);
  for (const proto::SnapshotRegion& r : m.regions()) {
    if (r.tensor() < 0 || r.tensor() >= static_cast<int>(decls.size()))
      return bad(absl::StrCat("a region names tensor ", r.tensor()));
    const TensorDecl& d = decls[r.tensor()];
    auto region = RegionFromProto(r.region());
    if (!region.ok() || !ValidateRegion(*region, d.shape).ok())
      return bad(absl::StrCat("a region of tensor '", d.key,
                              "' is not inside its shape"));
    const int64_t bytes = region->volume() * ElementSize(d.dtype);
    if (r.bytes() != bytes || !files.count(r.file()) || r.offset() < 0 ||
        r.offset() > file_bytes[r.file()] - bytes) {
      return bad(absl::StrCat("region ", region->ToString(), " of tensor '",
                              d.key, "' does not lie in file '", r.file(),
                              "'"));
    }
    if (bytes > 0 && (r.block_bytes() <= 0 ||
                      r.block_checksums_size() !=
                          (bytes + r.block_bytes() - 1) / r.block_bytes())) {
      return bad(absl::StrCat("region ", region->ToString(), " of tensor '",
                              d.key, "' has the wrong number of checksums"));
    }
    covered[r.tensor()] += region->volume();
  }
  for (size_t t = 0; t < decls.size(); ++t) {
    if (covered[t] != NumElements(decls[t].shape)) {
      return bad(absl::StrCat("the regions of tensor '", decls[t].key,
                              "' hold ", covered[t], " of its ",
                              NumElements(decls[t].shape), " elements"));
    }
  }
  return m;
}

absl::StatusOr<proto::SnapshotManifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory)
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::UnavailableError(
        absl::StrCat("reading ", path, ": ", ec.message()));
  }
  if (size > static_cast<uintmax_t>(kMaxManifestBytes)) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", size, " bytes; at most ", kMaxManifestBytes));
  }
  auto bytes = ReadFileIfExists(path);
  if (!bytes.ok()) return bytes.status();
  if (!bytes->has_value())
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  return ManifestFromJson(**bytes, path);
}

absl::Status WriteManifest(const std::string& dir,
                           const proto::SnapshotManifest& manifest) {
  return WriteFileAtomically(dir + "/" + kManifestName,
                             ManifestToJson(manifest));
}

namespace {

// Snapshot directories under `root`: version -> name.
std::map<int64_t, std::string> SnapshotDirs(const std::string& root) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t v = 0;
    if (!absl::StartsWith(name, "snapshot-") ||
        !absl::SimpleAtoi(name.substr(9), &v) || !e.is_directory())
      continue;
    out[v] = name;
  }
  return out;
}

}  // namespace

absl::StatusOr<LatestSnapshotResult> LatestSnapshot(const std::string& root,
                                                    const std::string& job) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(
        absl::StrCat("snapshot directory ", root, " does not exist"));
  }
  const auto dirs = SnapshotDirs(root);
  absl::Status first_error;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string dir = root + "/" + it->second;
    auto m = ReadManifest(dir);
    if (absl::IsNotFound(m.status())) continue;  // cut short
    if (!m.ok()) {
      // A damaged newest manifest is an error to report, not a reason to
      // silently roll further back.
      return m.status();
    }
    if (m->job() != job) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the newest snapshot in ", root, " is of job '", m->job(), "', not '",
          job, "'; use one directory per job"));
    }
    return LatestSnapshotResult{dir, *std::move(m)};
  }
  return absl::NotFoundError(
      absl::StrCat("no complete snapshot of job '", job, "' in ", root));
}

absl::StatusOr<std::vector<std::string>> RetainSnapshots(
    const std::string& root, const std::string& job, int keep,
    const std::string& keep_dir) {
  std::vector<std::string> removed;
  // The snapshot just completed counts among those kept.
  int complete = !keep_dir.empty() && ReadManifest(keep_dir).ok() ? 1 : 0;
  const auto dirs = SnapshotDirs(root);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string dir = root + "/" + it->second;
    if (dir == keep_dir) continue;
    auto m = ReadManifest(dir);
    bool remove = false;
    if (absl::IsNotFound(m.status())) {
      remove = true;  // cut short
    } else if (m.ok() && m->job() == job) {
      remove = ++complete > keep;
    }
    if (!remove) continue;
    std::error_code ec;
    // The manifest first: a removal cut short leaves an incomplete
    // snapshot, never a manifest pointing at missing files.
    fs::remove(dir + "/" + kManifestName, ec);
    fs::remove_all(dir, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("removing ", dir, ": ", ec.message()));
    }
    removed.push_back(dir);
  }
  return removed;
}

}  // namespace ptc
