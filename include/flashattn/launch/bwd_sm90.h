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
// and dV), 64 above (they split the head dim). Up to d64 without score
// modifiers (keys as the rows of S and dP, kernel/bwd_sm90.h) 128 query rows:
// with softcap's derivative beside S, that tile spills 372 B. With dropout too,
// whose keep masks the producer's warps make (its main loop reloads 5 spilled
// values): the backward's main kernel with dropout +2.6% at d64 and +4.5% at d32
// on every shape timed (H200, docs/perf-notes.md).
// -DFLASHATTN_SM90_BWD_DROPOUT_64_ROWS keeps dropout at 64 rows, to compare (as
// does the consumers' keep exchange, FLASHATTN_SM90_BWD_KEEP_BY_CONSUMERS).
#if defined(FLASHATTN_SM90_BWD_DROPOUT_64_ROWS) || defined(FLASHATTN_SM90_BWD_KEEP_BY_CONSUMERS)
inline constexpr bool kBwdDropoutLongQueryBlocks = false;
#else
inline constexpr bool kBwdDropoutLongQueryBlocks = true;
#endif
#if defined(FLASHATTN_SM90_BWD_TILE_M) && defined(FLASHATTN_SM90_BWD_TILE_N)
template <int kHeadDim, bool kScoreMods, bool kDropout>
struct Sm90BwdTile {
  static constexpr int kM = FLASHATTN_SM90_BWD_TILE_M, kN = FLASHATTN_SM90_BWD_TILE_N;
};
#else
template <int kHeadDim, bool kScoreMods, bool kDropout>
struct Sm90BwdTile {
  static constexpr int kM = kHeadDim <= 64 && !kScoreMods && (kBwdDropoutLongQueryBlocks || !kDropout) ? 128 : 64;
  static constexpr int kN = kHeadDim <= 128 ? 128 : 64;
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
  template <bool kScoreMods, bool kDropout>
  using Tile = Sm90BwdTile<kHeadDim, kScoreMods, kDropout>;
  template <bool kScoreMods, bool kDropout>
  using TraitsFor = Sm90BwdWsTraits<Element, kHeadDim, Tile<kScoreMods, kDropout>::kM, Tile<kScoreMods, kDropout>::kN,
                                    /*warpgroups=*/2,
                                    /*S, dP rows=*/Tile<kScoreMods, kDropout>::kM / 64,
                                    /*dK, dV rows=*/Tile<kScoreMods, kDropout>::kN / 64,
                                    /*dQ rows=*/Tile<kScoreMods, kDropout>::kM / 64>;
  template <bool kScoreMods, bool kDropout>
  using StorageFor = BwdWsStorageFor<TraitsFor<kScoreMods, kDropout>, kDropout>;
  // The largest variant's (the kernel table's shared-memory figure).
  using SharedStorage = LargestType<StorageFor<false, false>, StorageFor<false, true>, StorageFor<true, false>,
                                    StorageFor<true, true>>;

  // The three passes of the variant's tile (the dQ accumulator's layout follows it).
  static void launch_all(const BwdParams& params, cudaStream_t stream) {
    launch_variant(params, [&](auto score_mods, auto dropout) {
      using Traits = TraitsFor<decltype(score_mods)::value, decltype(dropout)::value>;
      launch_bwd_kernel<Traits>(params, stream,
                                &launch_bwd_ws_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>);
    });
  }
};

}  // namespace flashattn
