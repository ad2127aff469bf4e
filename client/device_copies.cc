#include "client/device_copies.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ptc {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// INTERNAL naming the call and CUDA's reason (clearing CUDA's last error,
// which is not sticky for these calls).
absl::Status CudaError(cudaError_t e, absl::string_view what) {
  cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t AsEvent(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCopies>> DeviceCopies::Create(int device) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "CUDA is not usable on this host: ",
        e == cudaErrorInsufficientDriver
            ? "no NVIDIA driver, or one older than CUDA 13 needs; "
            : "",
        e == cudaSuccess ? "it has no GPU"
                         : absl::StrCat(cudaGetErrorName(e), " (",
                                        cudaGetErrorString(e), ")")));
  }
  if (device < 0 || device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU ", device, " does not exist: this host has ", devices));
  }
  if (cudaError_t s = cudaSetDevice(device); s != cudaSuccess)
    return CudaError(s, absl::StrCat("selecting GPU ", device));
  cudaStream_t stream = nullptr;
  if (cudaError_t s = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      s != cudaSuccess)
    return CudaError(s, "creating the copies' stream");
  cudaEvent_t event = nullptr;
  if (cudaError_t s = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      s != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaError(s, "creating the copies' event");
  }
  return std::unique_ptr<DeviceCopies>(new DeviceCopies(device, stream, event));
}

DeviceCopies::DeviceCopies(int device, void* stream, void* event)
    : device_(device), stream_(stream), event_(event) {}

DeviceCopies::~DeviceCopies() {
  Finish().IgnoreError();  // nothing to report to from a destructor
  cudaSetDevice(device_);
  cudaEventDestroy(AsEvent(event_));
  cudaStreamDestroy(AsStream(stream_));
}

absl::Status DeviceCopies::Save(Client::Save& save, int i, uintptr_t src,
                                uint64_t bytes, uintptr_t after) {
  // Not populated first: registering pins every page, faulting it in.
  // Mapping all of a save's regions at its first region and faulting their
  // pages in on 8 threads before registering them was tried (on an H200
  // host, 2026-11-29) and made the save slower, not faster: 0.454-0.460 s
  // against 0.435 s with the spare pool's memory ready, 0.779 s against
  // 0.715 s without it (tools/gpu_store_compare.sh, the builds alternated).
  PTC_ASSIGN_OR_RETURN(absl::Span<uint8_t> dst,
                       save.Buffer(i, /*populate=*/false));
  return Copy(dst.data(), reinterpret_cast<const void*>(src), bytes,
              /*to_device=*/false, dst.data(), dst.size(), after);
}

absl::Status DeviceCopies::Load(const Client::State& state, int i,
                                uintptr_t dst, uint64_t bytes, uintptr_t after) {
  PTC_ASSIGN_OR_RETURN(absl::Span<const uint8_t> src, state.Region(i));
  return Copy(reinterpret_cast<void*>(dst), src.data(), bytes,
              /*to_device=*/true, src.data(), src.size(), after);
}

absl::Status DeviceCopies::Copy(void* dst, const void* src, uint64_t bytes,
                                bool to_device, const uint8_t* host,
                                uint64_t host_bytes, uintptr_t after) {
  if (bytes != host_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the GPU memory holds ", bytes, " bytes; the region has ", host_bytes,
        " (pass the region's whole contiguous tensor)"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
    return CudaError(e, absl::StrCat("selecting GPU ", device_));
  // A host pointer or another GPU's memory would fault inside the copy:
  // refuse it here, with a reason.
  const void* gpu = to_device ? dst : src;
  cudaPointerAttributes attr{};
  if (cudaError_t e = cudaPointerGetAttributes(&attr, gpu); e != cudaSuccess)
    return CudaError(e, "reading the GPU pointer's attributes");
  if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address 0x", absl::Hex(reinterpret_cast<uintptr_t>(gpu)),
        " is not memory of GPU ", device_,
        attr.type == cudaMemoryTypeDevice
            ? absl::StrCat(" (it is GPU ", attr.device, "'s)")
            : " (it is host memory)"));
  }
  if (stats_.regions == 0) started_ = Now();
  // Pin the store's pages where they are. A read-only load mapping needs
  // cudaHostRegisterReadOnly. If CUDA refuses (an old driver, a locked-
  // memory limit), the copy still runs, pageable.
  if (std::find(registered_.begin(), registered_.end(), host) == registered_.end()) {
    const double t = Now();
    const unsigned flags = cudaHostRegisterPortable |
                           (to_device ? cudaHostRegisterReadOnly : 0u);
    const cudaError_t e =
        cudaHostRegister(const_cast<uint8_t*>(host), host_bytes, flags);
    stats_.register_seconds += Now() - t;
    if (e == cudaSuccess) {
      registered_.push_back(host);
    } else if (e != cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
      if (stats_.pageable_regions++ == 0)
        stats_.pageable_reason =
            absl::StrCat("cudaHostRegister: ", cudaGetErrorName(e), " (",
                         cudaGetErrorString(e), ")");
    } else {
      cudaGetLastError();
    }
  }
  // After what the caller's stream queued so far (the step that wrote the
  // tensors, or the last reads of the memory a load overwrites).
  if (cudaError_t e = cudaEventRecord(AsEvent(event_),
                                      reinterpret_cast<cudaStream_t>(after));
      e != cudaSuccess)
    return CudaError(e, "marking the caller's stream");
  if (cudaError_t e = cudaStreamWaitEvent(AsStream(stream_), AsEvent(event_), 0);
      e != cudaSuccess)
    return CudaError(e, "ordering the copy after the caller's stream");
  if (cudaError_t e = cudaMemcpyAsync(
          dst, src, bytes,
          to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
          AsStream(stream_));
      e != cudaSuccess)
    return CudaError(e, to_device ? "copying a region to the GPU"
                                  : "copying a region from the GPU");
  ++stats_.regions;
  stats_.bytes += static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

absl::StatusOr<DeviceCopies::Stats> DeviceCopies::Finish() {
  absl::Status status;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
    status = CudaError(e, absl::StrCat("selecting GPU ", device_));
  if (status.ok()) {
    if (cudaError_t e = cudaStreamSynchronize(AsStream(stream_)); e != cudaSuccess)
      status = CudaError(e, "waiting for the copies");
  }
  // Unregister even after a failure: the mappings are unmapped next.
  for (const void* p : registered_) {
    if (cudaError_t e = cudaHostUnregister(const_cast<void*>(p));
        e != cudaSuccess && status.ok())
      status = CudaError(e, "unregistering a mapping");
  }
  registered_.clear();
  Stats out = stats_;
  if (out.regions > 0) out.seconds = Now() - started_;
  stats_ = Stats{};
  if (!status.ok()) return status;
  return out;
}

}  // namespace ptc
