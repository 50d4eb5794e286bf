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

// -DFLASHATTN_NO_GRID_WAIT compiles the wait out (wrong results: it only shows
// whether the tests can see a missing wait).
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(FLASHATTN_NO_GRID_WAIT)
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

// Per kernel and device (< 64): whether a dependent launch of it is used there,
// and whether one was refused. Used where the device is a Hopper GPU (compute
// capability 9.x, where it was tested, inside CUDA graph captures too: a launch
// refused during a capture ends the capture, so no retry could save it) and the
// kernel's code for it was compiled for sm_90 or newer, so that it waits in
// wait_for_previous_kernel() (a kernel compiled for an older target has no
// wait). Asked once per device.
template <auto kKernel>
struct DependentLaunch {
  static inline std::atomic<uint64_t> known{0}, waits{0};

  static bool allowed(int device) {
    const uint64_t bit = uint64_t(1) << (device & 63);
    if (known.load(std::memory_order_acquire) & bit) return waits.load(std::memory_order_relaxed) & bit;
    cudaFuncAttributes attributes{};
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaFuncGetAttributes(&attributes, kKernel) != cudaSuccess) {
      (void)cudaGetLastError();  // the ordinary launch reports what is wrong
      return false;
    }
    const bool use = major == 9 && attributes.ptxVersion >= 90;
    if (use) waits.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
    return use;
  }
  static void refused(int device) { waits.fetch_and(~(uint64_t(1) << (device & 63)), std::memory_order_relaxed); }
};

// Launches kKernel<<<grid, block, smem, stream>>>(args...), as a dependent launch
// where DependentLaunch allows it; where the GPU refuses that, as an ordinary
// launch from then on. Returns the launch's error (also left for the caller's
// check_launch), so that nothing is launched after a kernel that was not.
template <auto kKernel, typename... Args>
cudaError_t launch_after_previous_kernel(dim3 grid, dim3 block, int smem, cudaStream_t stream, int device,
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
    if (cudaLaunchKernelEx(&config, kKernel, args...) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();
    config.attrs = nullptr;
    config.numAttrs = 0;
    // Only a refusal of the attribute itself turns it off (else the error stands).
    const cudaError_t error = cudaLaunchKernelEx(&config, kKernel, args...);
    if (error == cudaSuccess) DependentLaunch<kKernel>::refused(device);
    return error;
  }
  return cudaLaunchKernelEx(&config, kKernel, args...);
}

}  // namespace flashattn
