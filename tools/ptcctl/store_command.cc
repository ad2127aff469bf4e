#include "tools/ptcctl/store_command.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/args.h"
#include "common/json_writer.h"
#include "common/status_macros.h"
#include "tensor_store/store_client.h"
#include "tools/internal/cli.h"
#include "tools/internal/format.h"

namespace ptc::tools {

const char kStoreUsage[] =
    R"(usage: ptcctl store ls    --host ADDR [--job JOB] [--regions] [--json]
       ptcctl store stat  --host ADDR --job JOB --version V --tensor KEY [--json]
       ptcctl store stats --host ADDR [--json]
       (all take --tls-ca, --tls-cert, --tls-key, default $PTC_TLS_CA,
       $PTC_TLS_CERT, $PTC_TLS_KEY; or --insecure)

Shows what a ptcd holds: jobs, versions and tensors (ls), one tensor's
stored regions with their checksums (stat), memory and counters (stats).
ADDR is the daemon's gRPC address, e.g. localhost:7070.
)";

namespace {

std::string RegionText(const proto::Region& r) {
  std::vector<std::string> dims;
  for (const auto& d : r.dims())
    dims.push_back(absl::StrCat(d.begin(), ":", d.end()));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

void WriteRegion(const proto::Region& r, JsonWriter* w) {
  w->BeginArray();
  for (const auto& d : r.dims())
    w->BeginArray().Int(d.begin()).Int(d.end()).EndArray();
  w->EndArray();
}

void WriteTensor(const proto::TensorInfo& t, bool regions, JsonWriter* w) {
  w->BeginObject()
      .Key("key")
      .String(t.decl().key())
      .Key("dtype")
      .String(t.decl().dtype());
  w->Key("shape").BeginArray();
  for (int64_t e : t.decl().shape()) w->Int(e);
  w->EndArray();
  int64_t bytes = 0;
  for (const auto& r : t.regions()) bytes += r.bytes();
  w->Key("bytes").Int(bytes).Key("region_count").Int(t.regions_size());
  if (regions) {
    w->Key("regions").BeginArray();
    for (const auto& r : t.regions()) {
      w->BeginObject().Key("region");
      WriteRegion(r.region(), w);
      w->Key("bytes")
          .Int(r.bytes())
          .Key("checksum")
          .String(absl::StrFormat("%016x", r.checksum()));
      w->EndObject();
    }
    w->EndArray();
  }
  w->EndObject();
}

void PrintTensorText(const proto::TensorInfo& t, bool regions,
                     const char* indent) {
  int64_t bytes = 0;
  for (const auto& r : t.regions()) bytes += r.bytes();
  std::vector<std::string> shape;
  for (int64_t e : t.decl().shape()) shape.push_back(absl::StrCat(e));
  std::cout << absl::StrFormat("%s%-44s %-8s [%s]  %d regions, %s\n", indent,
                               t.decl().key(), t.decl().dtype(),
                               absl::StrJoin(shape, ", "), t.regions_size(),
                               HumanBytes(bytes));
  if (!regions) return;
  for (const auto& r : t.regions()) {
    std::cout << absl::StrFormat("%s    %-40s %12s  xxh3 %016x\n", indent,
                                 RegionText(r.region()), HumanBytes(r.bytes()),
                                 r.checksum());
  }
}

absl::Status Ls(StoreClient& c, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(proto::ListResponse list, c.List(args.Get("job")));
  const bool regions = args.Flag("regions");
  if (json) {
    JsonWriter w(2);
    w.BeginObject().Key("jobs").BeginArray();
    for (const auto& j : list.jobs()) {
      w.BeginObject()
          .Key("job")
          .String(j.job())
          .Key("declared_tensors")
          .Int(j.declared_tensors());
      w.Key("versions").BeginArray();
      for (const auto& v : j.versions()) {
        w.BeginObject()
            .Key("version")
            .Int(v.version())
            .Key("committed")
            .Bool(v.committed());
        w.Key("bytes").Int(v.bytes()).Key("tensors").BeginArray();
        for (const auto& t : v.tensors()) WriteTensor(t, regions, &w);
        w.EndArray().EndObject();
      }
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
    std::cout << w.str() << "\n";
    return absl::OkStatus();
  }
  if (list.jobs().empty()) std::cout << "no jobs\n";
  for (const auto& j : list.jobs()) {
    std::cout << absl::StrFormat("job %s: %d tensors declared, %d versions\n",
                                 j.job(), j.declared_tensors(),
                                 j.versions_size());
    for (const auto& v : j.versions()) {
      std::cout << absl::StrFormat("  version %d (%s): %d tensors, %s\n",
                                   v.version(),
                                   v.committed() ? "committed" : "open",
                                   v.tensors_size(), HumanBytes(v.bytes()));
      for (const auto& t : v.tensors()) PrintTensorText(t, regions, "    ");
    }
  }
  return absl::OkStatus();
}

absl::Status Stat(StoreClient& c, const Args& args, bool json) {
  PTC_ASSIGN_OR_RETURN(std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(std::string version_text, args.Required("version"));
  PTC_ASSIGN_OR_RETURN(std::string tensor, args.Required("tensor"));
  int64_t version;
  if (!absl::SimpleAtoi(version_text, &version)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--version '", version_text, "' is not a number"));
  }
  PTC_ASSIGN_OR_RETURN(proto::StatResponse stat, c.Stat(job, version, tensor));
  if (json) {
    JsonWriter w(2);
    w.BeginObject().Key("job").String(job).Key("version").Int(version);
    w.Key("committed").Bool(stat.committed()).Key("tensor");
    WriteTensor(stat.tensor(), true, &w);
    w.EndObject();
    std::cout << w.str() << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat("job %s version %d (%s)\n", job, version,
                               stat.committed() ? "committed" : "open");
  PrintTensorText(stat.tensor(), true, "  ");
  return absl::OkStatus();
}

absl::Status Stats(StoreClient& c, bool json) {
  PTC_ASSIGN_OR_RETURN(proto::StatsResponse s, c.Stats());
  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("memory_used_bytes").Int(s.memory_used_bytes());
    w.Key("memory_limit_bytes").Int(s.memory_limit_bytes());
    w.Key("metadata_bytes").Int(s.metadata_bytes());
    w.Key("spare_bytes").Int(s.spare_bytes());
    w.Key("spare_queued_bytes").Int(s.spare_queued_bytes());
    w.Key("spare_capacity_bytes").Int(s.spare_capacity_bytes());
    w.Key("local_clients")
        .Int(s.local_clients())
        .Key("active_calls")
        .Int(s.active_calls());
    w.Key("uptime_seconds").Double(s.uptime_seconds());
    w.Key("versions").BeginArray();
    for (const auto& v : s.versions()) {
      w.BeginObject().Key("job").String(v.job()).Key("version").Int(
          v.version());
      w.Key("bytes")
          .Int(v.bytes())
          .Key("committed")
          .Bool(v.committed())
          .EndObject();
    }
    w.EndArray().Key("counters").BeginObject();
    for (const auto& c : s.counters()) w.Key(c.name()).Int(c.value());
    w.EndObject().EndObject();
    std::cout << w.str() << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat(
      "memory: %s of %s used (%.1f%%)\n", HumanBytes(s.memory_used_bytes()),
      HumanBytes(s.memory_limit_bytes()),
      100.0 * s.memory_used_bytes() /
          std::max<int64_t>(1, s.memory_limit_bytes()));
  if (s.metadata_bytes() > 0) {
    std::cout << absl::StrFormat("        of which %s tensor declarations\n",
                                 HumanBytes(s.metadata_bytes()));
  }
  if (s.spare_bytes() > 0) {
    std::cout << absl::StrFormat(
        "        of which %s kept ready for the next local saves\n",
        HumanBytes(s.spare_bytes()));
  }
  if (s.spare_queued_bytes() > 0) {
    std::cout << absl::StrFormat(
        "        and %s being prepared for them (the pool holds at most %s)\n",
        HumanBytes(s.spare_queued_bytes()),
        HumanBytes(s.spare_capacity_bytes()));
  }
  std::cout << absl::StrFormat(
      "clients: %d local, %d calls in progress; up %s\n", s.local_clients(),
      s.active_calls(), HumanSeconds(s.uptime_seconds()));
  for (const auto& v : s.versions()) {
    std::cout << absl::StrFormat(
        "  %s version %d (%s): %s\n", v.job(), v.version(),
        v.committed() ? "committed" : "open", HumanBytes(v.bytes()));
  }
  std::cout << "counters:\n";
  for (const auto& c : s.counters())
    std::cout << absl::StrFormat("  %-40s %d\n", c.name(), c.value());
  return absl::OkStatus();
}

}  // namespace

int RunStoreCommand(int argc, const char* const* argv) {
  const std::string sub = argc > 2 ? argv[2] : "";
  if (sub != "ls" && sub != "stat" && sub != "stats") {
    std::cerr << (sub.empty() || sub == "--help"
                      ? ""
                      : "ptcctl store: unknown subcommand '" + sub + "'\n\n")
              << kStoreUsage;
    return sub == "--help" ? 0 : 2;
  }
  auto args = Args::Parse(
      argc, argv, 3, WithSecurityOptions({"host", "job", "version", "tensor"}),
      {"json", "regions", "help", kSecurityFlag});
  const bool json = args.ok() && args->Flag("json");
  auto fail = [&](const absl::Status& s, int code) {
    return Fail("ptcctl store " + sub, s, code, json);
  };

  if (!args.ok()) return fail(args.status(), 2);
  if (args->Flag("help")) {
    std::cout << kStoreUsage;
    return 0;
  }
  auto host = args->Required("host");
  if (!host.ok()) return fail(host.status(), 2);
  if (absl::Status s = ConfigureCommandSecurity(*args); !s.ok())
    return fail(s, 2);
  auto client = StoreClient::Connect(*host);
  absl::Status s = sub == "ls"     ? Ls(*client, *args, json)
                   : sub == "stat" ? Stat(*client, *args, json)
                                   : Stats(*client, json);
  if (s.code() == absl::StatusCode::kUnavailable) {
    s = absl::UnavailableError(
        absl::StrCat("cannot reach ptcd at ", *host, ": ", s.message()));
  }
  if (!s.ok()) {
    return fail(
        s, absl::StartsWith(s.message(), "missing required option") ? 2 : 1);
  }
  return 0;
}

}  // namespace ptc::tools
