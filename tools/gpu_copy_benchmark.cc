// gpu_copy_benchmark (not a test): how fast a GPU job could save into and
// load from ptcd's shared memory. The store's buffers are memfd mappings
// (MAP_SHARED; a loading client maps them read-only); this copies between
// such a mapping and GPU memory with cudaMemcpyAsync on a side stream,
// pageable as they are, and after cudaHostRegister (pinned: the GPU's DMA
// engines read and write the pages directly, no staging copy in the
// driver). The limit beside them: CUDA's own pinned memory
// (cudaMallocHost). It also times the registration itself, which a client
// pays once per mapping.
//
//   gpu_copy_benchmark [RUNS] [MiB ...]     (default: 5 runs; 64 256 1024)
//
// Prints, per size, min/median/max GB/s of host-to-device (load) and
// device-to-host (save) copies for each kind of host memory. Then, for a
// save's many regions (1 GiB as 8 and as 208 memfds whose pages exist, as
// the spare pool keeps them, each mapped afresh and unpopulated, as a
// saving client maps them), how long pinning them takes four ways: one
// cudaHostRegister after another (what DeviceCopies does), the mappings
// populated first (MADV_POPULATE_WRITE) on one thread or on 8, then
// registered, and the registrations spread over 8 threads.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A buffer as ptcd's store makes one: a memfd of `bytes`, mapped shared
// and written once (so its pages exist), huge pages where the host allows.
struct StoreBuffer {
  int fd = -1;
  void* writable = nullptr;
  void* read_only = nullptr;
  size_t bytes = 0;
  explicit StoreBuffer(size_t n) : bytes(n) {
    fd = memfd_create("ptc-gpu-bench", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, n) != 0) {
      std::perror("memfd");
      std::exit(1);
    }
    writable = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    read_only = mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    if (writable == MAP_FAILED || read_only == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    madvise(writable, n, MADV_HUGEPAGE);
    std::memset(writable, 1, n);
  }
  ~StoreBuffer() {
    munmap(writable, bytes);
    munmap(read_only, bytes);
    close(fd);
  }
};

struct Stats {
  double min, median, max;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

// GB/s of `runs` copies of `bytes` on `stream`.
Stats Rate(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
           cudaStream_t stream, int runs) {
  std::vector<double> rates;
  Check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "warm-up copy");
  Check(cudaStreamSynchronize(stream), "sync");
  for (int r = 0; r < runs; ++r) {
    const double t = Now();
    Check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "copy");
    Check(cudaStreamSynchronize(stream), "sync");
    rates.push_back(bytes / (Now() - t) / 1e9);
  }
  return Summarize(rates);
}

void Print(const char* what, Stats s) {
  std::printf("  %-44s %6.2f / %6.2f / %6.2f GB/s\n", what, s.min, s.median,
              s.max);
}

// Runs fn(i) for i in [0, n) on `threads` threads (each a stride of i).
template <typename Fn>
void OnThreads(int threads, int n, Fn fn) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = t; i < n; i += threads) fn(i);
    });
  for (std::thread& th : pool) th.join();
}

// `regions` memfds of `bytes` each whose pages exist (written once through
// a mapping since unmapped), mapped afresh for every try.
struct SaveRegions {
  std::vector<int> fds;
  std::vector<void*> maps;
  size_t bytes;
  SaveRegions(int regions, size_t n) : bytes(n) {
    for (int i = 0; i < regions; ++i) {
      const int fd = memfd_create("ptc-gpu-bench-save", MFD_CLOEXEC);
      if (fd < 0 || ftruncate(fd, n) != 0) {
        std::perror("memfd");
        std::exit(1);
      }
      void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        std::perror("mmap");
        std::exit(1);
      }
      std::memset(m, 1, n);
      munmap(m, n);
      fds.push_back(fd);
    }
  }
  ~SaveRegions() {
    for (int fd : fds) close(fd);
  }
  void Map() {
    maps.clear();
    for (int fd : fds) {
      void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        std::perror("mmap");
        std::exit(1);
      }
      maps.push_back(m);
    }
  }
  void UnregisterAndUnmap() {
    for (void* m : maps) {
      Check(cudaHostUnregister(m), "unregister");
      munmap(m, bytes);
    }
    maps.clear();
  }
};

// Milliseconds to pin every region's fresh mapping: populated first on
// `populate_threads` threads (0: not populated), then registered on
// `register_threads` threads; min / median / max of `runs`.
Stats PinTime(SaveRegions& r, int populate_threads, int register_threads,
              int runs) {
  std::vector<double> ms;
  const int n = static_cast<int>(r.fds.size());
  for (int run = 0; run < runs; ++run) {
    r.Map();
    const double t = Now();
    if (populate_threads > 0) {
      OnThreads(populate_threads, n, [&](int i) {
        if (madvise(r.maps[i], r.bytes, MADV_POPULATE_WRITE) != 0) {
          std::perror("madvise(MADV_POPULATE_WRITE)");
          std::exit(1);
        }
      });
    }
    OnThreads(register_threads, n, [&](int i) {
      Check(cudaHostRegister(r.maps[i], r.bytes, cudaHostRegisterPortable),
            "cudaHostRegister");
    });
    ms.push_back((Now() - t) * 1e3);
    r.UnregisterAndUnmap();
  }
  return Summarize(ms);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 5;
  if (runs < 1) runs = 5;
  std::vector<size_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(size_t(std::atoll(argv[i])) << 20);
  if (sizes.empty()) sizes = {size_t{64} << 20, size_t{256} << 20, size_t{1} << 30};
  int devices = 0;
  Check(cudaGetDeviceCount(&devices), "counting GPUs");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "reading the GPU's properties");
  std::printf("GPU 0: %s; %d runs per case; min / median / max\n", prop.name,
              runs);
  cudaStream_t stream;  // a side stream, as a saving client would use
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (size_t bytes : sizes) {
    std::printf("%zu MiB\n", bytes >> 20);
    void* dev = nullptr;
    Check(cudaMalloc(&dev, bytes), "cudaMalloc");
    StoreBuffer store(bytes);
    Print("load: store mapping, pageable -> GPU",
          Rate(dev, store.read_only, bytes, cudaMemcpyHostToDevice, stream, runs));
    Print("save: GPU -> store mapping, pageable",
          Rate(store.writable, dev, bytes, cudaMemcpyDeviceToHost, stream, runs));
    double t = Now();
    Check(cudaHostRegister(store.read_only, bytes, cudaHostRegisterReadOnly),
          "cudaHostRegister (read-only mapping)");
    const double register_ro = Now() - t;
    Print("load: store mapping, registered -> GPU",
          Rate(dev, store.read_only, bytes, cudaMemcpyHostToDevice, stream, runs));
    Check(cudaHostUnregister(store.read_only), "unregister");
    t = Now();
    Check(cudaHostRegister(store.writable, bytes, cudaHostRegisterDefault),
          "cudaHostRegister");
    const double register_rw = Now() - t;
    Print("save: GPU -> store mapping, registered",
          Rate(store.writable, dev, bytes, cudaMemcpyDeviceToHost, stream, runs));
    Check(cudaHostUnregister(store.writable), "unregister");
    void* pinned = nullptr;
    Check(cudaMallocHost(&pinned, bytes), "cudaMallocHost");
    std::memset(pinned, 1, bytes);
    Print("limit: cudaMallocHost -> GPU",
          Rate(dev, pinned, bytes, cudaMemcpyHostToDevice, stream, runs));
    Print("limit: GPU -> cudaMallocHost",
          Rate(pinned, dev, bytes, cudaMemcpyDeviceToHost, stream, runs));
    std::printf("  cudaHostRegister of the mapping: %.1f ms read-only, %.1f ms "
                "writable\n",
                register_ro * 1e3, register_rw * 1e3);
    Check(cudaFreeHost(pinned), "cudaFreeHost");
    Check(cudaFree(dev), "cudaFree");
  }
  Check(cudaStreamDestroy(stream), "stream");
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const int threads = static_cast<int>(std::min(8u, cpus));
  std::printf(
      "pinning a save's regions, 1 GiB as fresh unpopulated mappings "
      "of memfds whose pages exist (ms, min / median / max; %d "
      "threads where several)\n",
      threads);
  for (const int regions : {8, 208}) {
    SaveRegions r(regions, (size_t{1} << 30) / regions / 4096 * 4096);
    auto row = [&](const char* what, Stats s) {
      std::printf("  %3d regions: %-40s %7.1f / %7.1f / %7.1f ms  %5.2f GB/s\n",
                  regions, what, s.min, s.median, s.max,
                  r.bytes * double(regions) / (s.median / 1e3) / 1e9);
    };
    row("register, one after another", PinTime(r, 0, 1, runs));
    row("populate, then register", PinTime(r, 1, 1, runs));
    row("populate on threads, then register", PinTime(r, threads, 1, runs));
    row("register on threads", PinTime(r, 0, threads, runs));
    row("populate and register on threads", PinTime(r, threads, threads, runs));
  }
  return 0;
}
