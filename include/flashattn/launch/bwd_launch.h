// Host side of a backward launch, shared by every family: preprocess, main
// kernel, dQ conversion. The caller allocates the workspaces (params.h).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "flashattn/kernel/bwd.h"
#include "flashattn/launch/tile_set.h"
#include "flashattn/params.h"

namespace flashattn {

// The main kernel of the (score modifiers, dropout) flags.
template <typename Traits, bool kScoreMods, bool kDropout>
void launch_bwd_variant(const BwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(sizeof(BwdSharedStorage<Traits>));
  static_assert(kSmem <= Traits::kMaxSmemBytes, "the tile needs more shared memory than the family's GPUs give a CTA");
  opt_in_smem<bwd_kernel<Traits, kScoreMods, kDropout>>(kSmem, params.device);
  bwd_kernel<Traits, kScoreMods, kDropout>
      <<<KeyTileScheduler<Traits::kBlockN>::num_ctas(params), Traits::kNThreads, kSmem, stream>>>(params);
}

// The shared main kernel, one of four by the (score modifiers, dropout) flags.
template <typename Traits>
void launch_bwd_main(const BwdParams& params, cudaStream_t stream) {
  launch_variant(params, [&](auto score_mods, auto dropout) {
    launch_bwd_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>(params, stream);
  });
}

// The three passes: preprocess, the main kernel (launch_main), dQ conversion.
template <typename Traits, typename LaunchMain>
void launch_bwd_kernel(const BwdParams& params, cudaStream_t stream, LaunchMain launch_main) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  static_assert(Traits::kBlockM <= kBwdSeqlenQRounding && kBwdSeqlenQRounding % Traits::kBlockM == 0);
  static_assert(Traits::kBlockM % kBwdSemaphoreRows == 0);

  // The preprocess kernel loops over its rows: a grid of at most 2^20 CTAs.
  // A varlen batch without queries has no rows: dK = dV = 0 come from the main
  // kernel alone.
  const unsigned row_grid = BwdRows::Scheduler::num_ctas(params);
  if (row_grid > 0) bwd_preprocess_kernel<Element, kHeadDim><<<row_grid, BwdRows::kThreads, 0, stream>>>(params);

  launch_main(params, stream);

  constexpr int kConvertSmem = int(sizeof(ConvertDqSharedStorage<Traits>));
  static_assert(kConvertSmem <= 48 * 1024);
  const unsigned convert_grid = QueryTileScheduler<Traits::kBlockM>::num_ctas(params);
  if (convert_grid > 0)
    bwd_convert_dq_kernel<Traits><<<convert_grid, Traits::kNThreads, kConvertSmem, stream>>>(params);
}

// A family may launch the passes itself (Kernel::launch_all: the sm90 family's
// warp-specialised main kernels between the shared passes, a tile per variant).
template <typename Kernel, typename = void>
struct HasOwnBwdLaunch : std::false_type {};
template <typename Kernel>
struct HasOwnBwdLaunch<Kernel, std::void_t<decltype(&Kernel::launch_all)>> : std::true_type {};

template <typename Kernel>
void launch_bwd(const BwdParams& params, cudaStream_t stream) {
  if constexpr (Kernel::kBuilt) {
    if constexpr (HasOwnBwdLaunch<Kernel>::value) {
      Kernel::launch_all(params, stream);
    } else {
      using Traits = typename Kernel::Traits;
      launch_bwd_kernel<Traits>(params, stream, &launch_bwd_main<Traits>);  // instantiated only here
    }
  }
}

}  // namespace flashattn
