// Page reuse benchmark (not a test): how fast ptcd's next buffer faults in
// huge pages right after the store freed a version, when that version was
// held in 4 KiB pages (written through a memfd's descriptor) and when it
// was held in huge pages (mapped with MADV_HUGEPAGE and populated). Each
// round writes a "version" of --version bytes into shared memory, keeps it
// --keep-seconds (a training step), frees it, and at once populates a new
// buffer of --next bytes in huge pages, as a change's staged buffers and the
// spare pool's refill do; the rates are that populate's, min / median /
// max GB/s, the rounds of 4 KiB pages first, then those of huge pages.
//
// On a VM that hands free memory back to its hypervisor (virtio-balloon
// free page reporting) only whole free huge pages are handed back, and
// a huge page can only be made of a whole free 2 MiB block: memory freed
// as 4 KiB pages leaves the next huge pages to come from memory the
// hypervisor must back again. Needs transparent huge pages for shared
// memory (shmem_enabled "advise"; tools/setup.sh sets it).
//
//   bazel build -c opt //tools:page_reuse_benchmark &&
//   bazel-bin/tools/page_reuse_benchmark [--rounds 4] [--version 1GiB]
//       [--next 614MiB] [--keep-seconds 3]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "tools/internal/stats.h"

namespace ptc {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A memfd of `bytes`, or -1.
int NewMemfd(int64_t bytes) {
  const int fd = memfd_create("ptc-page-reuse", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, bytes) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Maps `fd`'s `bytes` in huge pages and populates them for writing.
bool PopulateHuge(int fd, int64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  madvise(p, bytes, MADV_HUGEPAGE);
  const bool ok = madvise(p, bytes, MADV_POPULATE_WRITE) == 0;
  munmap(p, bytes);
  return ok;
}

// Writes `bytes` into `fd` through its descriptor, 256 KiB at a time, as
// ptc's client writes a region under 8 MiB: shared memory takes 4 KiB
// pages.
bool WriteThroughDescriptor(int fd, int64_t bytes) {
  std::vector<char> chunk(256 << 10, 1);
  for (int64_t off = 0; off < bytes;) {
    const ssize_t n = pwrite(
        fd, chunk.data(),
        static_cast<size_t>(std::min<int64_t>(chunk.size(), bytes - off)), off);
    if (n <= 0) return false;
    off += n;
  }
  return true;
}

int Run(int rounds, int64_t version_bytes, int64_t next_bytes,
        absl::Duration keep) {
  std::vector<double> after_small, after_huge;
  // One kind after the other, each after an idle pause: a round of huge
  // pages just before a round of 4 KiB pages would lend it whole free
  // blocks (its version carves its 4 KiB pages out of them and gives them
  // back whole), which a store's versions, among other memory, do not get.
  for (int round = 0; round < 2 * rounds; ++round) {
    const bool huge = round >= rounds;
    if (round % rounds == 0) absl::SleepFor(absl::Seconds(10));
    const int version = NewMemfd(version_bytes);
    if (version < 0 ||
        !(huge ? PopulateHuge(version, version_bytes)
               : WriteThroughDescriptor(version, version_bytes))) {
      std::cerr << "page_reuse_benchmark: could not write the version: "
                << std::strerror(errno) << "\n";
      return 1;
    }
    absl::SleepFor(keep);
    close(version);  // the store frees it: its pages go back to the kernel
    const absl::Time t = absl::Now();
    const int next = NewMemfd(next_bytes);
    if (next < 0 || !PopulateHuge(next, next_bytes)) {
      std::cerr << "page_reuse_benchmark: could not populate the next "
                   "buffer: "
                << std::strerror(errno) << "\n";
      return 1;
    }
    const double gbps =
        next_bytes / absl::ToDoubleSeconds(absl::Now() - t) / 1e9;
    close(next);
    (huge ? after_huge : after_small).push_back(gbps);
    std::cerr << absl::StrFormat("round %d: after %s pages %.2f GB/s\n",
                                 round % rounds + 1, huge ? "huge" : "4 KiB",
                                 gbps);
  }
  std::cout << absl::StrFormat(
      "populating %d MiB in huge pages right after freeing a %d MiB version "
      "kept %.0f s, %d rounds each, GB/s min / median / max\n",
      next_bytes / kMiB, version_bytes / kMiB, absl::ToDoubleSeconds(keep),
      rounds);
  for (const auto& [name, v] : {std::pair<const char*, std::vector<double>*>{
                                    "held in 4 KiB pages", &after_small},
                                {"held in huge pages", &after_huge}}) {
    const Stats s = Summarize(*v);
    std::cout << absl::StrFormat("  version %-20s %6.2f / %6.2f / %6.2f\n",
                                 name, s.min, s.median, s.max);
  }
  return 0;
}

}  // namespace
}  // namespace ptc

int main(int argc, char** argv) {
  auto fail = [](const std::string& why) {
    std::cerr << "page_reuse_benchmark: " << why << "\n";
    return 2;
  };
  auto args = ptc::Args::Parse(
      argc, argv, 1, {"rounds", "version", "next", "keep-seconds"}, {});
  if (!args.ok()) return fail(std::string(args.status().message()));
  if (!args->positional().empty())
    return fail("takes no arguments, only options: " + args->positional()[0]);
  int64_t rounds = 4, keep_seconds = 3;
  if (!absl::SimpleAtoi(args->Get("rounds", "4"), &rounds) || rounds < 1 ||
      rounds > 1000) {
    return fail("--rounds takes a count from 1 to 1000");
  }
  if (!absl::SimpleAtoi(args->Get("keep-seconds", "3"), &keep_seconds) ||
      keep_seconds < 0 || keep_seconds > 3600) {
    return fail("--keep-seconds takes seconds from 0 to 3600");
  }
  auto version = ptc::ParseBytes(args->Get("version", "1GiB"));
  auto next = ptc::ParseBytes(args->Get("next", "614MiB"));
  for (const auto* bytes : {&version, &next}) {
    if (!bytes->ok()) return fail(std::string(bytes->status().message()));
    if (**bytes < ptc::kMiB || **bytes > (int64_t{64} << 30)) {
      return fail("--version and --next take 1MiB to 64GiB");
    }
  }
  return ptc::Run(static_cast<int>(rounds), *version, *next,
                  absl::Seconds(keep_seconds));
}
