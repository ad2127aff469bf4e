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
// device-to-host (save) copies for each kind of host memory.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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
  return 0;
}
