// Host side of a backward launch, shared by every family: preprocess, main
// kernel, dQ conversion. The caller allocates the workspaces (params.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "flashattn/kernel/bwd.h"
#include "flashattn/launch/tile_set.h"
#include "flashattn/params.h"

namespace flashattn {

template <typename Traits>
void launch_bwd_kernel(const BwdParams& params, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  static_assert(Traits::kBlockM <= kBwdSeqlenQRounding && kBwdSeqlenQRounding % Traits::kBlockM == 0);
  static_assert(Traits::kBlockM % kBwdSemaphoreRows == 0);
  constexpr int kSmem = Traits::kSmemSize;

  // The preprocess kernel loops over its rows: a grid of at most 2^20 CTAs.
  const unsigned row_grid = unsigned(std::min<int64_t>(BwdRowsIndex::num_blocks(params), 1 << 20));
  bwd_preprocess_kernel<Element, kHeadDim><<<row_grid, BwdRowsIndex::kThreads, 0, stream>>>(params);

  const bool score_mods = params.softcap > 0.f || params.alibi_slopes != nullptr;
  if (score_mods) {
    opt_in_smem<bwd_kernel<Traits, true>>(kSmem, params.device);
  } else {
    opt_in_smem<bwd_kernel<Traits, false>>(kSmem, params.device);
  }
  auto kernel = score_mods ? &bwd_kernel<Traits, true> : &bwd_kernel<Traits, false>;
  const int64_t num_n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const int64_t num_ctas = num_n_blocks * params.heads_k * params.batch;
  kernel<<<dim3(unsigned(num_ctas)), Traits::kNThreads, kSmem, stream>>>(params);

  const int64_t num_m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  constexpr int kConvertSmem = int(size(typename Traits::SmemLayoutQdO{})) * int(sizeof(Element));
  static_assert(kConvertSmem <= 48 * 1024);
  bwd_convert_dq_kernel<Traits><<<dim3(unsigned(num_m_blocks * params.heads * params.batch)),
                                  Traits::kNThreads, kConvertSmem, stream>>>(params);
}

template <typename Kernel>
void launch_bwd(const BwdParams& params, cudaStream_t stream) {
  if constexpr (Kernel::kBuilt) launch_bwd_kernel<typename Kernel::Traits>(params, stream);
}

}  // namespace flashattn
