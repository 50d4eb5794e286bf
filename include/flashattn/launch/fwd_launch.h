// Host side of a forward launch, shared by every family: grid, shared memory.
#pragma once

#include <cuda_runtime.h>

#include "flashattn/kernel/fwd.h"
#include "flashattn/launch/smem_check.h"
#include "flashattn/params.h"

namespace flashattn {

template <typename Traits>
void launch_fwd_kernel(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = Traits::kSmemSize;
  const bool score_mods = params.softcap > 0.f || params.alibi_slopes != nullptr;
  auto kernel = score_mods ? &fwd_kernel<Traits, true> : &fwd_kernel<Traits, false>;
  check_smem_fits(kSmem, Traits::kFamily, "forward", Traits::kHeadDim);
  if constexpr (kSmem >= 48 * 1024) {
    // Above 48 KB a kernel must opt in; cheap, and per device, so done per launch.
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  }
  const int64_t num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  // < 2^31 CTAs: checked on the host (more would need more memory than exists).
  const int64_t num_ctas = num_m_blocks * params.heads * params.batch;
  kernel<<<dim3(unsigned(num_ctas)), Traits::kNThreads, kSmem, stream>>>(params);
}

}  // namespace flashattn
