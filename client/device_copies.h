// Copies between a rank's GPU memory and its regions in ptcd's shared
// memory, for jobs whose state lives on GPUs. Each region's mapping is
// registered with CUDA (cudaHostRegister: pinned where it is, so the
// GPU's DMA engines read and write the store's pages directly, with no
// staging copy in the driver) and the copies run asynchronously on a side
// stream, after the work the caller's stream queued so far:
//
//   PTC_ASSIGN_OR_RETURN(auto copies, DeviceCopies::Create(/*device=*/0));
//   PTC_ASSIGN_OR_RETURN(auto save, client->BeginSave(step));
//   for (int i = 0; i < client->regions().size(); ++i)
//     PTC_RETURN_IF_ERROR(copies->Save(*save, i, MyShard(i), bytes, stream));
//   PTC_RETURN_IF_ERROR(copies->Finish().status());   // before Commit
//   PTC_RETURN_IF_ERROR(save->Commit().status());
//
// The CUDA runtime is linked statically: where no driver or GPU is there,
// Create answers UNAVAILABLE with CUDA's reason and the caller copies
// through host memory instead. Registration costs about 65 ms per GiB (an
// H100 host); a pinned copy runs at ~50 GB/s against ~5 GB/s (loads) and
// ~10 GB/s (saves) pageable, so it pays for itself from the first region.
#ifndef PTC_CLIENT_DEVICE_COPIES_H_
#define PTC_CLIENT_DEVICE_COPIES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace ptc {

// Not thread-safe: one DeviceCopies per thread that copies.
class DeviceCopies {
 public:
  // What the copies since the last Finish did.
  struct Stats {
    int regions = 0;
    int64_t bytes = 0;
    // Regions CUDA would not register (copied pageable: correct, slower),
    // and the first reason.
    int pageable_regions = 0;
    std::string pageable_reason;
    double register_seconds = 0;  // spent in cudaHostRegister
    double seconds = 0;           // from the first copy queued to Finish
  };

  // A side stream on GPU `device`. UNAVAILABLE (with CUDA's reason) where
  // CUDA has no driver or no GPU; INVALID_ARGUMENT for a device outside
  // [0, number of GPUs).
  static absl::StatusOr<std::unique_ptr<DeviceCopies>> Create(int device);
  // Waits for queued copies and releases the registrations.
  ~DeviceCopies();
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;

  // Queues a copy of `bytes` (exactly region i's size) from contiguous GPU
  // memory `src` into save's region i, after the work queued so far on
  // `after` (a cudaStream_t as an integer, e.g. PyTorch's
  // current_stream().cuda_stream; 0: the default stream). `src` must stay
  // valid and unchanged until Finish.
  absl::Status Save(Client::Save& save, int i, uintptr_t src, uint64_t bytes,
                    uintptr_t after);
  // Queues a copy of loaded region i into contiguous GPU memory `dst`
  // (`bytes`: exactly the region's size), after the work queued so far on
  // `after` (so it does not overwrite memory that work still reads).
  absl::Status Load(const Client::State& state, int i, uintptr_t dst,
                    uint64_t bytes, uintptr_t after);
  // Waits until every queued copy is done and unregisters the mappings.
  // Call it before Save::Commit and before the loaded GPU memory is used
  // (and before the State is destroyed). Returns what the copies did.
  absl::StatusOr<Stats> Finish();

  int device() const { return device_; }

 private:
  DeviceCopies(int device, void* stream, void* event);
  absl::Status Copy(void* dst, const void* src, uint64_t bytes, bool to_device,
                    const uint8_t* host, uint64_t host_bytes, uintptr_t after);

  int device_;
  void* stream_;  // cudaStream_t
  void* event_;   // cudaEvent_t, marks the caller's stream
  std::vector<const void*> registered_;
  Stats stats_;
  double started_ = 0;
};

}  // namespace ptc

#endif  // PTC_CLIENT_DEVICE_COPIES_H_
