// Tensor store benchmark (not a test): save and load throughput for region
// sizes from 1 MiB to 1 GiB, (a) through shared memory (the local socket)
// and (b) through gRPC on loopback, each against memcpy of the same size
// measured in the same run. Reports min/median/max GB/s and the ratio of
// the medians to memcpy's.
//
//   bazel build -c opt //tools:store_benchmark &&
//   bazel-bin/tools/store_benchmark
//
// The daemon runs in this process (same code as ptcd) with its own
// threads; the client side of each measurement runs on the main thread.
// "shm save" is the steady state of a checkpointing job: the daemon's spare
// pool has prepared memory of the region's size in the background since
// the previous save (the benchmark waits for it outside the timed window);
// "shm save cold" is the first save of a size, into freshly allocated pages.
// Both write through the buffer's descriptor (pwrite), as ptc's client
// does; "shm save mapped" fills a mapping of the buffer instead. Loads:
// "shm read" copies the region out through its descriptor (pread), as
// ptc's client loads into a tensor; "shm load+copy" maps it and copies;
// "shm map only" is a zero-copy load.
//
//   bazel-bin/tools/store_benchmark --regions N --region-kib K
//
// instead saves a model's worth of small regions: N regions of K KiB,
// written, then committed in batches (CommitPuts), as ptc's client saves a
// rank's shards; one put per region (through its descriptor) and in packs
// (AllocatePuts), alternated, against memcpy of the same bytes, and per
// region. Each save is then loaded as the client loads: one Map per region
// (the save of one put each) or MapMany (the save in packs), each region
// copied out through its descriptor, the leases released.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/checksum.h"
#include "common/mutex_checks.h"
#include "ptc/packs.h"
#include "tensor_store/internal/testing.h"
#include "tensor_store/local_client.h"
#include "tools/internal/stats.h"

namespace ptc {
namespace {

template <typename Fn>
double Measure(int64_t bytes, Fn&& fn) {
  const absl::Time t = absl::Now();
  fn();
  return bytes / absl::ToDoubleSeconds(absl::Now() - t) / 1e9;
}

void Die(const absl::Status& s) {
  std::cerr << s << "\n";
  std::exit(1);
}

int Run(int max_mib) {
  auto d =
      testing::StartDaemon(int64_t{6} << 30, /*spare_pool=*/int64_t{1} << 30);
  auto local = LocalClient::Connect(d->socket_path());
  if (!local.ok()) Die(local.status());
  std::cout << absl::StrFormat("%-9s %-16s %8s %8s %8s  %s\n", "size", "path",
                               "min", "median", "max",
                               "median vs memcpy (GB/s = 1e9 bytes/s)");
  int64_t version = 0;
  for (int64_t mib = 1; mib <= max_mib; mib *= 4) {
    const int64_t bytes = mib << 20;
    const int runs = 1 + (mib >= 256  ? 3
                          : mib >= 16 ? 5
                                      : 9);  // + the cold one
    const std::string key = absl::StrCat("r", mib);
    if (auto s = d->client->Declare("bench", {{key, DType::kUInt8, {bytes}}});
        !s.ok())
      Die(s);
    const Region r{{0, bytes}};
    std::vector<char> src(bytes), dst(bytes);
    for (int64_t i = 0; i < bytes; i += 4096)
      src[i] = static_cast<char>(i / 4096);
    std::memset(dst.data(), 1, bytes);
    std::vector<double> copy, shm_save, shm_cold, shm_mapped, shm_read,
        shm_load, shm_map, grpc_save, grpc_load;
    for (int run = 0; run < runs; ++run) {
      copy.push_back(
          Measure(bytes, [&] { std::memcpy(dst.data(), src.data(), bytes); }));
      ++version;
      d->server->store()->spares().WaitIdle();
      auto save = [&](bool map) {
        auto buf = (*local)->AllocatePut("bench", version, key, r, map);
        if (!buf.ok()) Die(buf.status());
        if (map) {
          std::memcpy(buf->data(), src.data(), bytes);
        } else if (auto w = buf->Write(0, src.data(), bytes); !w.ok()) {
          Die(w);
        }
        if (auto sum = (*local)->CommitPut(&*buf); !sum.ok()) Die(sum.status());
      };
      if (run > 0) {  // the mapped way, into memory the spare pool prepared
        shm_mapped.push_back(Measure(bytes, [&] { save(/*map=*/true); }));
        if (auto s = d->client->DeleteVersion("bench", version); !s.ok())
          Die(s.status());
        ++version;
        d->server->store()->spares().WaitIdle();
      }
      (run == 0 ? shm_cold : shm_save).push_back(Measure(bytes, [&] {
        save(/*map=*/false);
      }));
      shm_read.push_back(Measure(bytes, [&] {
        auto m = (*local)->Map("bench", version, key, r, /*map=*/false);
        if (!m.ok()) Die(m.status());
        if (auto s = m->Read(0, dst.data(), bytes); !s.ok()) Die(s);
      }));
      shm_map.push_back(Measure(bytes, [&] {
        auto m = (*local)->Map("bench", version, key, r);
        if (!m.ok()) Die(m.status());
      }));
      shm_load.push_back(Measure(bytes, [&] {
        auto m = (*local)->Map("bench", version, key, r);
        if (!m.ok()) Die(m.status());
        std::memcpy(dst.data(), m->data(), bytes);
      }));
      if (auto s = d->client->DeleteVersion("bench", version); !s.ok())
        Die(s.status());
      ++version;
      grpc_save.push_back(Measure(bytes, [&] {
        if (auto s =
                d->client->Put("bench", version, key, r, src.data(), bytes);
            !s.ok()) {
          Die(s.status());
        }
      }));
      grpc_load.push_back(Measure(bytes, [&] {
        if (auto s =
                d->client->Read("bench", version, key, r, dst.data(), bytes);
            !s.ok())
          Die(s);
      }));
      if (auto s = d->client->DeleteVersion("bench", version); !s.ok())
        Die(s.status());
    }
    const Stats base = Summarize(copy);
    auto row = [&](const char* name, const std::vector<double>& v) {
      const Stats s = Summarize(v);
      std::cout << absl::StrFormat(
          "%-9s %-16s %8.2f %8.2f %8.2f  %5.0f%%\n", absl::StrCat(mib, " MiB"),
          name, s.min, s.median, s.max, 100 * s.median / base.median);
    };
    row("memcpy", copy);
    row("shm save", shm_save);
    row("shm save cold", shm_cold);
    row("shm save mapped", shm_mapped);
    row("shm read", shm_read);
    row("shm load+copy", shm_load);
    row("shm map only", shm_map);
    row("grpc save", grpc_save);
    row("grpc load", grpc_load);
    std::cout << "\n";
  }
  return 0;
}

// A save of `count` regions of `kib` KiB each, as the client saves a
// rank's shards: every put allocated and written, then all committed. Two
// ways, alternating (which goes first changes every run): one put per
// region, and packs (AllocatePuts: up to kMaxPackRegions regions of at
// most kMaxPackBytes in one memfd), as ptc's client saves regions under
// kPackRegionsBelow; and its load, by one Map per region (as the client
// did) or by MapMany (as it does).
int RunRegions(int count, int kib) {
  const int64_t bytes = int64_t{kib} << 10;
  const int64_t total = bytes * count;
  auto d = testing::StartDaemon(std::max(int64_t{6} << 30, 4 * total),
                                /*spare_pool=*/2 * total);
  auto local = LocalClient::Connect(d->socket_path());
  if (!local.ok()) Die(local.status());
  std::vector<TensorDecl> decls;
  for (int i = 0; i < count; ++i)
    decls.push_back({absl::StrCat("t", i), DType::kUInt8, {bytes}});
  if (auto s = d->client->Declare("bench", decls); !s.ok()) Die(s);
  const Region r{{0, bytes}};
  std::vector<char> src(total), dst(total);
  for (int64_t i = 0; i < total; i += 4096) src[i] = static_cast<char>(i);
  std::memset(dst.data(), 1, total);
  // Which regions go together: one each, or packs as the client makes
  // them, writing in order (ptc/packs.h).
  std::vector<std::vector<int>> alone, packs;
  std::vector<PackCandidate> candidates;
  for (int i = 0; i < count; ++i) {
    alone.push_back({i});
    candidates.push_back(
        {bytes, PackRequestBytes(absl::StrCat("t", i), /*rank=*/1)});
  }
  std::vector<bool> taken(count);
  for (int i = 0; i < count; ++i) {
    if (taken[i]) continue;
    std::vector<size_t> members = NextPack(candidates, i, taken);
    if (members.empty()) members = {static_cast<size_t>(i)};  // alone
    for (size_t j : members) taken[j] = true;
    packs.emplace_back(members.begin(), members.end());
  }
  struct Way {
    const char* name;
    const std::vector<std::vector<int>>* groups;
    const char* load_name;
    bool map_many;
    std::vector<double> save, per_put_us, load, per_map_us;
  };
  Way ways[2] = {{"one put each", &alone, "one map each", false},
                 {"packs", &packs, "map many", true}};
  std::vector<double> copy;
  int64_t version = 0;
  for (int run = 0; run < 8; ++run) {
    copy.push_back(
        Measure(total, [&] { std::memcpy(dst.data(), src.data(), total); }));
    for (int k = 0; k < 2; ++k) {
      Way& way = ways[(run + k) % 2];
      ++version;
      d->server->store()->spares().WaitIdle();
      const absl::Time t = absl::Now();
      std::vector<LocalClient::PutBuffer> bufs;
      bufs.reserve(count);
      for (const std::vector<int>& group : *way.groups) {
        std::vector<std::pair<std::string, Region>> items;
        for (int i : group) items.emplace_back(absl::StrCat("t", i), r);
        absl::StatusOr<std::vector<LocalClient::PutBuffer>> got;
        if (group.size() == 1) {
          auto one = (*local)->AllocatePut("bench", version, items[0].first, r,
                                           /*map=*/false);
          if (!one.ok()) Die(one.status());
          got.emplace().push_back(std::move(*one));
        } else {
          got = (*local)->AllocatePuts("bench", version, items);
        }
        if (!got.ok()) Die(got.status());
        for (size_t g = 0; g < group.size(); ++g) {
          LocalClient::PutBuffer& buf = (*got)[g];
          if (auto w = buf.Write(0, src.data() + group[g] * bytes, bytes);
              !w.ok())
            Die(w);
          bufs.push_back(std::move(buf));
        }
      }
      std::vector<LocalClient::PutBuffer*> ptrs;
      for (auto& b : bufs) ptrs.push_back(&b);
      auto done = (*local)->CommitPuts(ptrs, {});
      if (!done.ok()) Die(done.status());
      for (const auto& one : *done)
        if (!one.status.ok()) Die(one.status);
      const double secs = absl::ToDoubleSeconds(absl::Now() - t);
      bufs.clear();
      // The load, as the client loads a rank's regions into its tensors:
      // leased, copied out through the descriptors, released.
      const absl::Time l = absl::Now();
      {
        std::vector<LocalClient::Mapping> maps;
        if (way.map_many) {
          std::vector<std::pair<std::string, Region>> items;
          for (int i = 0; i < count; ++i)
            items.emplace_back(absl::StrCat("t", i), r);
          auto got = (*local)->MapMany("bench", version, items);
          if (!got.ok()) Die(got.status());
          maps = *std::move(got);
        } else {
          for (int i = 0; i < count; ++i) {
            auto m = (*local)->Map("bench", version, absl::StrCat("t", i), r,
                                   /*map=*/false);
            if (!m.ok()) Die(m.status());
            maps.push_back(std::move(*m));
          }
        }
        for (int i = 0; i < count; ++i) {
          if (auto s = maps[i].Read(0, dst.data() + i * bytes, bytes); !s.ok())
            Die(s);
        }
        if (way.map_many) {
          if (auto s = (*local)->Release(&maps); !s.ok()) Die(s);
        }
      }  // (one map each: each released as it goes)
      const double load_secs = absl::ToDoubleSeconds(absl::Now() - l);
      if (std::memcmp(src.data(), dst.data(), total) != 0)
        Die(absl::DataLossError("a load read other bytes than were saved"));
      std::memset(dst.data(), 1, total);
      // Each way's first save writes into fresh memory; later ones into
      // spares.
      if (run > 0) {
        way.save.push_back(total / secs / 1e9);
        way.per_put_us.push_back(secs / count * 1e6);
        way.load.push_back(total / load_secs / 1e9);
        way.per_map_us.push_back(load_secs / count * 1e6);
      }
      if (version > 1) {
        if (auto s = d->client->DeleteVersion("bench", version - 1); !s.ok())
          Die(s.status());
      }
    }
  }
  copy.erase(copy.begin());
  const Stats base = Summarize(copy);
  std::cout << absl::StrFormat(
      "%d regions of %d KiB (%.1f MiB), %zu runs each way, alternated, "
      "GB/s = 1e9 bytes/s\n"
      "  memcpy                 %7.2f %7.2f %7.2f\n",
      count, kib, total / 1048576.0, ways[0].save.size(), base.min, base.median,
      base.max);
  for (const Way& way : ways) {
    const Stats s = Summarize(way.save), us = Summarize(way.per_put_us);
    std::cout << absl::StrFormat(
        "  save, %-16s %7.2f %7.2f %7.2f  (%.0f%% of memcpy)\n"
        "    per region, us       %7.1f %7.1f %7.1f\n",
        way.name, s.min, s.median, s.max, 100 * s.median / base.median, us.min,
        us.median, us.max);
  }
  for (const Way& way : ways) {
    const Stats s = Summarize(way.load), us = Summarize(way.per_map_us);
    std::cout << absl::StrFormat(
        "  load, %-16s %7.2f %7.2f %7.2f  (%.0f%% of memcpy; of the save "
        "with %s)\n"
        "    per region, us       %7.1f %7.1f %7.1f\n",
        way.load_name, s.min, s.median, s.max, 100 * s.median / base.median,
        way.name, us.min, us.median, us.max);
  }
  std::cout << absl::StrFormat("  (%zu packs)\n", packs.size());
  return 0;
}

}  // namespace
}  // namespace ptc

int main(int argc, char** argv) {
  ptc::ConfigureMutexChecks();  // as in the daemons: off unless
                                // PTC_MUTEX_CHECKS=1
  auto fail = [](const std::string& why) {
    std::cerr << "store_benchmark: " << why << "\n";
    return 2;
  };
  auto args =
      ptc::Args::Parse(argc, argv, 1, {"max-mib", "regions", "region-kib"}, {});
  if (!args.ok()) return fail(std::string(args.status().message()));
  if (!args->positional().empty())
    return fail("takes no arguments, only options: " + args->positional()[0]);
  if (args->Has("regions") || args->Has("region-kib")) {
    int64_t count = 0, kib = 0;
    if (!absl::SimpleAtoi(args->Get("regions"), &count) ||
        !absl::SimpleAtoi(args->Get("region-kib"), &kib) || count < 1 ||
        count > 100000 || kib < 1 || kib > (1 << 20) ||
        count * kib > (int64_t{4} << 20)) {
      return fail(
          "--regions takes 1 to 100000 and --region-kib 1 to 1048576, both "
          "given, at most 4 GiB in all");
    }
    return ptc::RunRegions(static_cast<int>(count), static_cast<int>(kib));
  }
  int64_t max_mib = 1024;
  if (!absl::SimpleAtoi(args->Get("max-mib", "1024"), &max_mib) ||
      max_mib < 1 || max_mib > 4096) {
    return fail("--max-mib takes 1 to 4096");
  }
  return ptc::Run(static_cast<int>(max_mib));
}
