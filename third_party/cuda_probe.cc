// Reports the NCCL version and the number of CUDA devices: a check that
// CUDA and NCCL from /usr/local/cuda link and load on this machine.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int nccl = 0;
  const ncclResult_t r = ncclGetVersion(&nccl);
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  std::printf("NCCL %d.%d.%d (%s); CUDA devices: %d (%s)\n", nccl / 10000,
              (nccl / 100) % 100, nccl % 100, ncclGetErrorString(r),
              e == cudaSuccess ? devices : 0, cudaGetErrorString(e));
  return 0;
}
