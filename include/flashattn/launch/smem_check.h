// Shared-memory limit check before a launch: a tile chosen for a GPU with more
// shared memory than this one gets a clear error instead of a failed launch.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace flashattn {

inline void check_smem_fits(int smem_bytes, const char* family, const char* pass, int head_dim) {
  int device = 0, max_smem = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (smem_bytes <= max_smem) return;
  throw std::runtime_error(
      std::string("flashattn: the ") + family + " " + pass + " kernel for head-dim bucket " +
      std::to_string(head_dim) + " needs " + std::to_string(smem_bytes / 1024) +
      " KB of shared memory per block, and this GPU allows " + std::to_string(max_smem / 1024) +
      " KB; tiles for GPUs with less shared memory (compute capability 8.6/8.9) are not built "
      "yet for this head dim: use a smaller head dim");
}

}  // namespace flashattn
