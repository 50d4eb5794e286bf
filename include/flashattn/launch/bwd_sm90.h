// sm90 family backward: the warp-specialised main kernel (kernel/bwd_sm90.h)
// between the shared preprocess and dQ conversion passes, and its tile per
// head-dim bucket and variant. Two consumer warpgroups. Shared memory: two Q and
// two dO stages, K, V, two dS buffers, (queries as rows) two P buffers and (keys as
// rows, dropout) the keep masks' exchange: 170 KB at d128 with dropout, 162 KB
// without, 224 KB at d256.
#pragma once

#include "flashattn/arch/sm90.h"
#include "flashattn/kernel/bwd_sm90.h"
#include "flashattn/launch/bwd_launch.h"
#include "flashattn/launch/tma_sm90.h"

namespace flashattn {

// The tile of a head-dim bucket and kernel variant: 64 query rows per
// iteration, 128 keys per CTA up to d128 (the warpgroups split the keys of dK
// and dV), 64 above (they split the head dim). At d64 without dropout or score
// modifiers (keys as the rows of S and dP, kernel/bwd_sm90.h) 128 query rows:
// with softcap's derivative beside S, that tile spills 372 B.
#if defined(FLASHATTN_SM90_BWD_TILE_M) && defined(FLASHATTN_SM90_BWD_TILE_N)
template <int kHeadDim, bool kPlain>
struct Sm90BwdTile {
  static constexpr int kM = FLASHATTN_SM90_BWD_TILE_M, kN = FLASHATTN_SM90_BWD_TILE_N;
};
#else
template <int kHeadDim, bool kPlain>
struct Sm90BwdTile {
  static constexpr int kM = kHeadDim <= 64 && kPlain ? 128 : 64, kN = kHeadDim <= 128 ? 128 : 64;
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
  constexpr int kSmem = int(sizeof(BwdWsStorageFor<Traits, kDropout>));
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
  // kPlain: neither score modifiers nor dropout.
  template <bool kPlain>
  using TraitsFor = Sm90BwdWsTraits<Element, kHeadDim, Sm90BwdTile<kHeadDim, kPlain>::kM,
                                    Sm90BwdTile<kHeadDim, kPlain>::kN, /*warpgroups=*/2,
                                    /*S, dP rows=*/Sm90BwdTile<kHeadDim, kPlain>::kM / 64,
                                    /*dK, dV rows=*/Sm90BwdTile<kHeadDim, kPlain>::kN / 64,
                                    /*dQ rows=*/Sm90BwdTile<kHeadDim, kPlain>::kM / 64>;
  // The larger variant's (the kernel table's shared-memory figure).
  using PlainStorage = BwdWsStorageFor<TraitsFor<true>, false>;
  using DropoutStorage = BwdWsStorageFor<TraitsFor<false>, true>;
  using ModsStorage = BwdWsStorageFor<TraitsFor<false>, false>;
  using LargerStorage =
      std::conditional_t<(sizeof(PlainStorage) >= sizeof(DropoutStorage)), PlainStorage, DropoutStorage>;
  using SharedStorage = std::conditional_t<(sizeof(LargerStorage) >= sizeof(ModsStorage)), LargerStorage, ModsStorage>;

  // The three passes of the variant's tile (the dQ accumulator's layout follows it).
  static void launch_all(const BwdParams& params, cudaStream_t stream) {
    launch_variant(params, [&](auto score_mods, auto dropout) {
      using Traits = TraitsFor<!decltype(score_mods)::value && !decltype(dropout)::value>;
      launch_bwd_kernel<Traits>(params, stream,
                                &launch_bwd_ws_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>);
    });
  }
};

}  // namespace flashattn
