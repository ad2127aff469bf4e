// gpu_store_benchmark (not a test): a GPU job's save into and load from a
// real ptcd, through the client library's DeviceCopies (the store's shared
// memory registered with CUDA, copies on a side stream), against the
// limit measured in the same run: cudaMemcpy between the same GPU and
// CUDA's own pinned memory (cudaMallocHost), for the same bytes.
//
//   gpu_store_benchmark --coordinator ADDR --job J --socket PATH
//                       [--runs N] [--device D]
//
// The job must be registered with one rank on the ptcd at PATH (e.g.
// `ptcctl register --job J --model gpt:layers=4,hidden=1024,heads=16,
// vocab=32000,positions=1024 --config tp=1 --hosts host0`: 1.1 GiB).
// Every run saves the rank's regions from GPU memory as a new version
// (BeginSave -> buffers -> copies -> Finish -> small objects -> Commit),
// each phase timed, and loads the committed version into fresh GPU memory
// (Load -> copies -> Finish). Between Finish and Commit it times one
// checksum pass over the saved bytes (left out of the save's time): what a
// pass costs on this host, for reading the commit's time. Every run also
// saves the same regions the other way a client could: through a pinned
// buffer of CUDA's and Save::Write (checksummed while the CPU copies), the
// two ways alternated. The first load is copied back to the host and
// compared with what was saved, element for element. Prints min/median/max
// seconds and GB/s per phase.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/device_copies.h"
#include "common/args.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "tools/internal/synthetic.h"

namespace ptc::tools {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status Cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// --name N within [lo, hi], or `fallback` when absent.
absl::StatusOr<int> IntOption(const Args& args, const std::string& name,
                              int fallback, int lo, int hi) {
  if (!args.Has(name)) return fallback;
  int v = 0;
  if (!absl::SimpleAtoi(args.Get(name), &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " takes a whole number from ", lo, " to ", hi, ", not '",
        args.Get(name), "'"));
  }
  return v;
}

struct Series {
  std::string name;
  std::vector<double> seconds;
};

void Print(const Series& s, int64_t bytes) {
  std::vector<double> v = s.seconds;
  std::sort(v.begin(), v.end());
  const double med = v[v.size() / 2];
  std::cout << absl::StrFormat(
      "%-34s %7.3f s %7.3f s %7.3f s   %6.2f GB/s (%.2f-%.2f)\n", s.name,
      v.front(), med, v.back(), bytes / med / 1e9, bytes / v.back() / 1e9,
      bytes / v.front() / 1e9);
}

// GPU buffers, one per region.
struct DeviceRegions {
  std::vector<void*> ptr;
  ~DeviceRegions() {
    for (void* p : ptr) cudaFree(p);
  }
};

absl::Status Run(const Args& args) {
  PTC_ASSIGN_OR_RETURN(std::string coordinator, args.Required("coordinator"));
  PTC_ASSIGN_OR_RETURN(std::string job, args.Required("job"));
  PTC_ASSIGN_OR_RETURN(std::string socket, args.Required("socket"));
  PTC_ASSIGN_OR_RETURN(int runs, IntOption(args, "runs", 5, 1, 100));
  PTC_ASSIGN_OR_RETURN(int device, IntOption(args, "device", 0, 0, 1023));

  PTC_ASSIGN_OR_RETURN(auto copies, DeviceCopies::Create(device));
  PTC_ASSIGN_OR_RETURN(auto client,
                       Client::Connect({socket, coordinator, job, 0}));
  if (client->world_size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' has ", client->world_size(),
        " ranks; register it with one (--config tp=1) on this ptcd's host"));
  }
  cudaDeviceProp prop;
  PTC_RETURN_IF_ERROR(Cuda(cudaGetDeviceProperties(&prop, device), "GPU"));
  const std::vector<RankRegion>& regions = client->regions();
  int64_t bytes = 0;
  DeviceRegions src, dst;
  for (const RankRegion& r : regions) {
    const std::vector<char> host =
        Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
    void* s = nullptr;
    void* d = nullptr;
    PTC_RETURN_IF_ERROR(Cuda(cudaMalloc(&s, host.size()), "cudaMalloc"));
    src.ptr.push_back(s);
    PTC_RETURN_IF_ERROR(Cuda(cudaMalloc(&d, host.size()), "cudaMalloc"));
    dst.ptr.push_back(d);
    PTC_RETURN_IF_ERROR(Cuda(
        cudaMemcpy(s, host.data(), host.size(), cudaMemcpyHostToDevice),
        "filling the GPU"));
    bytes += static_cast<int64_t>(host.size());
  }
  std::cout << absl::StrFormat(
      "%s (GPU %d), job %s: %d regions, %.2f GiB per save and load, %d runs\n",
      prop.name, device, job, regions.size(), bytes / 1073741824.0, runs);

  Series save{"save (BeginSave .. Commit)"}, save_begin{"  of which BeginSave"},
      save_buffers{"  of which AllocatePut + mmap"},
      save_register{"  of which cudaHostRegister"},
      save_queue{"  of which queueing (with register)"},
      save_finish{"  of which copies' wait + unregister"},
      save_commit{"  of which Commit"}, save_sum{"  a checksum pass (apart)"},
      staged{"save staged (pinned + Write)"},
      staged_commit{"  of which Commit"}, load{"load (Load .. copies done)"},
      load_copies{"  of which store -> GPU copies"},
      load_register{"  of which cudaHostRegister"};
  // The staged path: each region through a pinned buffer of CUDA's, then
  // written into the store by the CPU (checksummed while it copies).
  size_t largest = 0;
  for (const RankRegion& r : regions)
    largest = std::max<size_t>(largest, r.bytes);
  void* pinned_stage[2] = {nullptr, nullptr};
  cudaEvent_t stage_done[2];
  cudaStream_t stage_stream;
  PTC_RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stage_stream), "stream"));
  for (int k = 0; k < 2; ++k) {
    PTC_RETURN_IF_ERROR(
        Cuda(cudaMallocHost(&pinned_stage[k], largest), "cudaMallocHost"));
    PTC_RETURN_IF_ERROR(Cuda(cudaEventCreate(&stage_done[k]), "event"));
  }
  int64_t step = 0;
  auto save_staged = [&]() -> absl::Status {
    const double t0 = Now();
    PTC_ASSIGN_OR_RETURN(auto s, client->BeginSave(++step));
    auto queue = [&](size_t i) -> absl::Status {
      PTC_RETURN_IF_ERROR(Cuda(
          cudaMemcpyAsync(pinned_stage[i % 2], src.ptr[i], regions[i].bytes,
                          cudaMemcpyDeviceToHost, stage_stream),
          "copying a region to pinned memory"));
      return Cuda(cudaEventRecord(stage_done[i % 2], stage_stream),
                  "marking a copy");
    };
    if (!regions.empty()) PTC_RETURN_IF_ERROR(queue(0));
    for (size_t i = 0; i < regions.size(); ++i) {
      PTC_RETURN_IF_ERROR(
          Cuda(cudaEventSynchronize(stage_done[i % 2]), "wait"));
      if (i + 1 < regions.size()) PTC_RETURN_IF_ERROR(queue(i + 1));
      PTC_RETURN_IF_ERROR(
          s->Write(i, absl::Span<const uint8_t>(
                          static_cast<const uint8_t*>(pinned_stage[i % 2]),
                          regions[i].bytes)));
    }
    for (const SmallObjectSpec& o : client->spec().small_objects)
      PTC_RETURN_IF_ERROR(
          s->PutSmallObject(o.name, SyntheticSmallObject(o.name, 0)));
    const double t1 = Now();
    PTC_RETURN_IF_ERROR(s->Commit().status());
    const double t2 = Now();
    staged.seconds.push_back(t2 - t0);
    staged_commit.seconds.push_back(t2 - t1);
    return client->WaitCommitted(s->version(), absl::Seconds(60));
  };
  for (int run = 0; run < runs; ++run) {
    if (run % 2 == 1) PTC_RETURN_IF_ERROR(save_staged());
    const double t0 = Now();
    PTC_ASSIGN_OR_RETURN(auto s, client->BeginSave(++step));
    const double t1 = Now();
    for (size_t i = 0; i < regions.size(); ++i)
      PTC_RETURN_IF_ERROR(s->Buffer(i, /*populate=*/false).status());
    const double t2 = Now();
    for (size_t i = 0; i < regions.size(); ++i) {
      PTC_RETURN_IF_ERROR(copies->Save(
          *s, i, reinterpret_cast<uintptr_t>(src.ptr[i]), regions[i].bytes, 0));
    }
    const double t3 = Now();
    PTC_ASSIGN_OR_RETURN(DeviceCopies::Stats st, copies->Finish());
    const double t4 = Now();
    if (st.pageable_regions > 0) {
      std::cout << "  note: " << st.pageable_regions
                << " regions copied pageable: " << st.pageable_reason << "\n";
    }
    // One checksum pass over what was copied, timed apart and left out of
    // the save's time: what each pass over the bytes costs on this host.
    for (size_t i = 0; i < regions.size(); ++i) {
      PTC_ASSIGN_OR_RETURN(absl::Span<uint8_t> b, s->Buffer(i));
      (void)Checksum(b.data(), b.size());  // another library's: not elided
    }
    const double t5 = Now();
    for (const SmallObjectSpec& o : client->spec().small_objects)
      PTC_RETURN_IF_ERROR(s->PutSmallObject(o.name, SyntheticSmallObject(o.name, 0)));
    PTC_RETURN_IF_ERROR(s->Commit().status());
    const double t6 = Now();
    save.seconds.push_back(t6 - t0 - (t5 - t4));
    save_begin.seconds.push_back(t1 - t0);
    save_buffers.seconds.push_back(t2 - t1);
    save_register.seconds.push_back(st.register_seconds);
    save_queue.seconds.push_back(t3 - t2);
    save_finish.seconds.push_back(t4 - t3);
    save_sum.seconds.push_back(t5 - t4);
    save_commit.seconds.push_back(t6 - t5);
    const int64_t version = s->version();
    s.reset();
    PTC_RETURN_IF_ERROR(client->WaitCommitted(version, absl::Seconds(60)));
    if (run % 2 == 0) PTC_RETURN_IF_ERROR(save_staged());

    const double l0 = Now();
    PTC_ASSIGN_OR_RETURN(auto state, client->Load());
    for (size_t i = 0; i < regions.size(); ++i) {
      PTC_RETURN_IF_ERROR(copies->Load(
          *state, i, reinterpret_cast<uintptr_t>(dst.ptr[i]), regions[i].bytes, 0));
    }
    PTC_ASSIGN_OR_RETURN(st, copies->Finish());
    load.seconds.push_back(Now() - l0);
    load_copies.seconds.push_back(st.seconds);
    load_register.seconds.push_back(st.register_seconds);
    if (run == 0) {
      for (size_t i = 0; i < regions.size(); ++i) {
        const RankRegion& r = regions[i];
        const std::vector<char> want =
            Synthetic(r.tensor, r.shape, r.region, ElementSize(r.dtype));
        std::vector<char> got(want.size());
        PTC_RETURN_IF_ERROR(Cuda(cudaMemcpy(got.data(), dst.ptr[i], got.size(),
                                            cudaMemcpyDeviceToHost),
                                 "reading back"));
        if (got != want) {
          return absl::DataLossError(absl::StrCat(
              "region ", r.region.ToString(), " of '", r.key,
              "' came back from the store into the GPU with wrong bytes"));
        }
      }
      std::cout << "every element of the first load matches what was saved\n";
    }
  }

  // The limit, same bytes, same GPU: CUDA's own pinned memory.
  Series d2h{"limit: GPU -> cudaMallocHost"}, h2d{"limit: cudaMallocHost -> GPU"};
  {
    void* pinned = nullptr;
    void* gpu = nullptr;
    PTC_RETURN_IF_ERROR(Cuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost"));
    PTC_RETURN_IF_ERROR(Cuda(cudaMalloc(&gpu, bytes), "cudaMalloc"));
    std::memset(pinned, 1, bytes);
    for (int run = 0; run < runs; ++run) {
      double t0 = Now();
      PTC_RETURN_IF_ERROR(Cuda(cudaMemcpy(pinned, gpu, bytes, cudaMemcpyDeviceToHost), "d2h"));
      d2h.seconds.push_back(Now() - t0);
      t0 = Now();
      PTC_RETURN_IF_ERROR(Cuda(cudaMemcpy(gpu, pinned, bytes, cudaMemcpyHostToDevice), "h2d"));
      h2d.seconds.push_back(Now() - t0);
    }
    cudaFree(gpu);
    cudaFreeHost(pinned);
  }
  std::cout << absl::StrFormat("%-34s %9s %9s %9s   %s\n", "", "min", "median", "max",
                               "GB/s at the median (worst-best)");
  for (const Series* s :
       {&save, &save_begin, &save_buffers, &save_register, &save_queue,
        &save_finish, &save_commit, &save_sum, &staged, &staged_commit, &d2h,
        &load, &load_copies, &load_register, &h2d})
    Print(*s, bytes);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ptc::tools

int main(int argc, char** argv) {
  auto args = ptc::Args::Parse(argc, argv, 1,
                               {"coordinator", "job", "socket", "runs", "device"}, {});
  if (!args.ok()) {
    std::cerr << args.status().message()
              << "\nusage: gpu_store_benchmark --coordinator ADDR --job J --socket PATH "
                 "[--runs N] [--device D]\n";
    return 2;
  }
  const absl::Status s = ptc::tools::Run(*args);
  if (!s.ok()) {
    std::cerr << "gpu_store_benchmark: " << s << "\n";
    return 1;
  }
  return 0;
}
