// Programmatic dependent launch (sm_90 and newer): a kernel launched with it
// may start while the stream's previous kernel is still running, so that a
// short call's second kernel (decode's split merge, the KV cache kernel after
// the append) does not pay a whole launch after the first. Such a kernel must
// call wait_for_previous_kernel() before it reads or writes any memory: that
// returns once the previous kernel has finished and its writes are visible.
// Older GPUs and code built for them launch in order, as always.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

namespace flashattn {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the stream's next kernel, where it was launched as above, put its CTAs
// on the SMs once every CTA of this one has called this or exited (they wait
// as above).
__device__ __forceinline__ void allow_next_kernel_to_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Per kernel and device (< 64): whether its code for that device was compiled
// for sm_90 or newer, so that it waits in wait_for_previous_kernel() (a kernel
// compiled for an older target, run by a newer GPU, has no wait), and whether a
// dependent launch of it was refused there. Asked once per device.
template <auto kKernel>
struct DependentLaunch {
  static inline std::atomic<uint64_t> known{0}, waits{0};

  static bool allowed(int device) {
    const uint64_t bit = uint64_t(1) << (device & 63);
    if (known.load(std::memory_order_acquire) & bit) return waits.load(std::memory_order_relaxed) & bit;
    cudaFuncAttributes attributes{};
    if (cudaFuncGetAttributes(&attributes, kKernel) != cudaSuccess) {
      (void)cudaGetLastError();  // the ordinary launch reports what is wrong
      return false;
    }
    if (attributes.ptxVersion >= 90) waits.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
    return attributes.ptxVersion >= 90;
  }
  static void refused(int device) { waits.fetch_and(~(uint64_t(1) << (device & 63)), std::memory_order_relaxed); }
};

// Launches kKernel<<<grid, block, smem, stream>>>(args...), as a dependent launch
// where its code waits for the previous kernel (above); where the GPU or a graph
// being captured refuses that, as an ordinary launch from then on.
template <auto kKernel, typename... Args>
void launch_after_previous_kernel(dim3 grid, dim3 block, int smem, cudaStream_t stream, int device,
                                  const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = size_t(smem);
  config.stream = stream;
  if (DependentLaunch<kKernel>::allowed(device)) {
    cudaLaunchAttribute dependent[1];
    dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = dependent;
    config.numAttrs = 1;
    if (cudaLaunchKernelEx(&config, kKernel, args...) == cudaSuccess) return;
    (void)cudaGetLastError();
    config.attrs = nullptr;
    config.numAttrs = 0;
    // Only a refusal of the attribute itself turns it off (else the error stands).
    if (cudaLaunchKernelEx(&config, kKernel, args...) == cudaSuccess) DependentLaunch<kKernel>::refused(device);
    return;  // errors: the caller's check_launch
  }
  (void)cudaLaunchKernelEx(&config, kKernel, args...);  // errors: the caller's check_launch
}

}  // namespace flashattn
