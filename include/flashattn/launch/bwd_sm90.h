// sm90 family backward: the warp-specialised main kernel (kernel/bwd_sm90.h)
// between the shared preprocess and dQ conversion passes, and its tile per
// head-dim bucket. Two consumer warpgroups; a query block of 64 rows; 128 keys
// per CTA up to d128 (the warpgroups split the keys of dK, dV), 64 above (they
// split the head dim). Shared memory: two Q and two dO stages, K, V, two P and
// two dS buffers: 192 KB at d128, 224 KB at d256.
#pragma once

#include "flashattn/arch/sm90.h"
#include "flashattn/kernel/bwd_sm90.h"
#include "flashattn/launch/bwd_launch.h"
#include "flashattn/launch/tma_sm90.h"

namespace flashattn {

#if defined(FLASHATTN_SM90_BWD_TILE_M) && defined(FLASHATTN_SM90_BWD_TILE_N)
template <int kHeadDim>
struct Sm90BwdTile {
  static constexpr int kM = FLASHATTN_SM90_BWD_TILE_M, kN = FLASHATTN_SM90_BWD_TILE_N;
};
#else
template <int kHeadDim>
struct Sm90BwdTile {
  static constexpr int kM = 64, kN = kHeadDim <= 128 ? 128 : 64;
};
#endif

// Q's and dO's descriptors; a batch without query rows reads neither (the
// workspace stands in for the address).
template <typename Traits>
BwdWsLoads<Traits> make_bwd_ws_loads(const BwdParams& p) {
  using Element = typename Traits::Element;
  constexpr int kD = Traits::kHeadDim, kM = Traits::kBlockM;
  using Layout = typename Traits::SmemLayoutQdO;
  const bool packed = p.cu_seqlens_q != nullptr;
  return {make_rows_tma<Element, kD, kM, Layout>("q", p.q, p.softmax_d, packed, p.seqlen_q, p.total_q, p.heads, p.batch,
                                                 p.head_dim, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
          make_rows_tma<Element, kD, kM, Layout>("dout", p.dout, p.softmax_d, packed, p.seqlen_q, p.total_q, p.heads, p.batch,
                                                 p.head_dim, p.dout_row_stride, p.dout_head_stride,
                                                 p.dout_batch_stride)};
}

template <typename Traits, bool kScoreMods, bool kDropout>
void launch_bwd_ws_variant(const BwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(sizeof(BwdWsSharedStorage<Traits>));
  static_assert(kSmem <= Traits::kMaxSmemBytes, "the tile needs more shared memory than Hopper gives a CTA");
  opt_in_smem<bwd_ws_kernel<Traits, kScoreMods, kDropout>>(kSmem, params.device);
  bwd_ws_kernel<Traits, kScoreMods, kDropout>
      <<<KeyTileScheduler<Traits::kBlockN>::num_ctas(params), Traits::kCtaThreads, kSmem, stream>>>(
          params, make_bwd_ws_loads<Traits>(params));
}

// Every tile fits Hopper's 227 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm90Bwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using T = Sm90BwdTile<kHeadDim>;
  using Traits = Sm90BwdWsTraits<Element, kHeadDim, T::kM, T::kN, /*warpgroups=*/2, /*S, dP rows=*/T::kM / 64,
                                 /*dK, dV rows=*/T::kN / 64, /*dQ rows=*/T::kM / 64>;
  using SharedStorage = BwdWsSharedStorage<Traits>;

  static void launch_main(const BwdParams& params, cudaStream_t stream) {
    launch_variant(params, [&](auto score_mods, auto dropout) {
      launch_bwd_ws_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>(params, stream);
    });
  }
};

}  // namespace flashattn
