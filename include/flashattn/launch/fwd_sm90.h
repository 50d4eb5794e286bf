// sm90 family forward: the warp-specialised kernel's tiles per head-dim bucket,
// and the KV cache kernel's. Two consumer warpgroups of 64 query rows (three up
// to d64), and key blocks as long as two K and two V stages
// leave room for (H100, bf16; the stage-1 tile sweeps and the warp-specialised
// kernel's runs are in docs/perf-notes.md); above d192 a second tile with longer
// key blocks for long sequences. benchmarks/sweep_sm90_tiles.sh builds every bucket with
// one tile instead (FLASHATTN_SM90_TILE_M / _N) to time alternatives.
#pragma once

#include <type_traits>

#include "flashattn/arch/sm90.h"
#include "flashattn/kernel/fwd_sm90.h"
#include "flashattn/launch/fwd_launch.h"
#include "flashattn/launch/query_tiles.h"
#include "flashattn/launch/tma_sm90.h"

namespace flashattn {

// Key blocks per bucket. Dropout's 8-bit units span the column groups of four
// lanes (kernel/dropout.h): its kernels need key blocks of a multiple of 32
// columns, which every tile but the long one (below) has.
template <int kHeadDim>
struct Sm90FwdWsKeyBlock {
  static constexpr int kN = kHeadDim <= 160 ? 128 : kHeadDim <= 192 ? 96 : 64;
};
#if defined(FLASHATTN_SM90_TILE_M) && defined(FLASHATTN_SM90_TILE_N)
template <int kHeadDim>
struct Sm90FwdWsTile {
  static constexpr int kM = FLASHATTN_SM90_TILE_M, kN = FLASHATTN_SM90_TILE_N;
};
template <int kHeadDim>
struct Sm90FwdWsLongTile : Sm90FwdWsTile<kHeadDim> {};
template <int kHeadDim>
struct Sm90FwdWsShortTile : Sm90FwdWsTile<kHeadDim> {};
#else
// Up to d64, three consumer warpgroups (192 rows): +2-7% forward over 128 rows
// but for causal 1k tokens (-3%; H100, docs/perf-notes.md); with dropout +4% (2k
// and 8k tokens +4 to +9%, 512 non-causal -1.5%), where the three warpgroups make
// the Philox words in place and the two made them under the previous P V.
template <int kHeadDim>
struct Sm90FwdWsTile : Sm90FwdWsKeyBlock<kHeadDim> {
  static constexpr int kM = kHeadDim <= 64 ? 192 : 128;
};
// Above d192, long sequences run key blocks of 80 (two K and two V stages of
// them beside Q fill 224 KB): the S product reads Q from shared memory once per
// key block, so longer blocks ease the shared-memory bandwidth that bounds the
// d256 loop. d256, bf16, same-call A/B on an H100: +3% at 4k-8k keys, +6% at 16k.
// A short sequence's last block pads more keys and a causal diagonal wastes
// more of them (80 everywhere: -5% at 512 keys, -10% causal, H200), so short
// calls keep blocks of 64 (use_long_key_blocks). Other buckets: one tile.
template <int kHeadDim>
struct Sm90FwdWsLongTile : Sm90FwdWsTile<kHeadDim> {
  static constexpr int kN = kHeadDim > 192 ? 80 : Sm90FwdWsTile<kHeadDim>::kN;
};
// Up to d64, short sequences run two warpgroups (128 rows) where that makes no
// more tiles per head (launch/query_tiles.h). Other buckets: one tile.
template <int kHeadDim>
struct Sm90FwdWsShortTile : Sm90FwdWsTile<kHeadDim> {
  static constexpr int kM = 128;
};
#endif

// Whether a call runs the long-sequence tile (Sm90FwdWsLongTile): from 1024 keys,
// 2048 under a causal or window mask (where the padding no longer costs more
// than the longer blocks win). Varlen: the longest sequence decides.
inline bool use_long_key_blocks(const FwdParams& p) {
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  return p.seqlen_k >= (masked ? 2048 : 1024);
}

template <typename Traits>
FwdWsLoads<Traits> make_fwd_ws_loads(const FwdParams& p) {
  using Element = typename Traits::Element;
  constexpr int kD = Traits::kHeadDim, kM = Traits::kBlockM, kN = Traits::kBlockN;
  const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
  using LayoutQ = typename Traits::SmemLayoutQ;
  using LayoutKV = typename Traits::SmemLayoutKV;
  return {make_rows_tma<Element, kD, kM, LayoutQ>("q", p.q, p.q, packed_q, p.seqlen_q, p.total_q, p.heads, p.batch,
                                             p.head_dim, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
          make_rows_tma<Element, kD, kN, LayoutKV>("k", p.k, p.q, packed_k, p.seqlen_k, p.total_k, p.heads_k, p.batch,
                                              p.head_dim, p.k_row_stride, p.k_head_stride, p.k_batch_stride),
          make_rows_tma<Element, kD, kN, LayoutKV>("v", p.v, p.q, packed_k, p.seqlen_k, p.total_k, p.heads_k, p.batch,
                                              p.head_dim, p.v_row_stride, p.v_head_stride, p.v_batch_stride)};
}

template <typename Traits, bool kScoreMods, bool kDropout>
void launch_fwd_ws_variant(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(sizeof(FwdWsSharedStorage<Traits>));
  static_assert(kSmem <= Traits::kMaxSmemBytes, "the tile needs more shared memory than Hopper gives a CTA");
  opt_in_smem<fwd_ws_kernel<Traits, kScoreMods, kDropout>>(kSmem, params.device);
  fwd_ws_kernel<Traits, kScoreMods, kDropout>
      <<<QueryTileScheduler<Traits::kBlockM>::num_persistent_ctas(params), Traits::kCtaThreads, kSmem, stream>>>(
          params, make_fwd_ws_loads<Traits>(params));
}

// The KV cache kernel: one warpgroup of 64 query rows (decode has few). Up to
// d64, key blocks of 64 with two blocks of K and V in flight (kernel/fwd.h
// kKvStages): decode d64 +4% (b = 1, h = h_k, long caches +5 to +11%; paged
// caches -1%) over one block of 128 keys; 64 keys with one block in flight lost
// 11%, and at d128 two stages of 64 keys won short caches and lost long ones
// (H100, docs/perf-notes.md).
// FLASHATTN_SM90_KV_N and FLASHATTN_SM90_KV_STAGES (up to d128) build other
// tiles to time them.
template <int kHeadDim>
struct Sm90FwdKvTile {
  static constexpr bool kStaged = kHeadDim <= 64;
#if defined(FLASHATTN_SM90_KV_N) && defined(FLASHATTN_SM90_KV_STAGES)
  static constexpr int kM = 64, kN = kHeadDim <= 128 ? FLASHATTN_SM90_KV_N : 64;
  static constexpr int kStages = kHeadDim <= 128 ? FLASHATTN_SM90_KV_STAGES : 1;
#else
  static constexpr int kM = 64, kN = kStaged || kHeadDim > 128 ? 64 : 128, kStages = kStaged ? 2 : 1;
#endif
};

// Every tile fits Hopper's 227 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm90Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using KvTile = Sm90FwdKvTile<kHeadDim>;
  using KvTraits = Sm90FwdTraits<Element, kHeadDim, KvTile::kM, KvTile::kN>;
  static constexpr int kKvStages = KvTile::kStages;
  using WsTile = Sm90FwdWsTile<kHeadDim>;
  using WsTraits = Sm90FwdWsTraits<Element, kHeadDim, WsTile::kM, WsTile::kN>;
  using WsLongTile = Sm90FwdWsLongTile<kHeadDim>;
  using WsLongTraits = Sm90FwdWsTraits<Element, kHeadDim, WsLongTile::kM, WsLongTile::kN>;
  static constexpr bool kHasLongTile = !std::is_same_v<WsLongTraits, WsTraits>;
  using WsShortTile = Sm90FwdWsShortTile<kHeadDim>;
  using WsShortTraits = Sm90FwdWsTraits<Element, kHeadDim, WsShortTile::kM, WsShortTile::kN>;
  static constexpr bool kHasShortTile = !std::is_same_v<WsShortTraits, WsTraits>;
  static_assert(!kHasShortTile || WsTraits::kSkipRowlessWarpgroups,
                "the host (zeroed_tile_counter) takes the short tile to replace one that skips rows");
  // Rows per tile of the forward (dropout's included) where its warpgroups skip
  // rows past the end (three warpgroups up to d64; the long tile is above d192).
  static constexpr int kSkippingBlockM = WsTraits::kSkipRowlessWarpgroups ? WsTraits::kBlockM : 0;
  // The kernel table's shared memory: the largest of the forward kernels'.
  using SharedStorage = LargestType<FwdWsSharedStorage<WsTraits>, FwdWsSharedStorage<WsLongTraits>,
                                    FwdWsSharedStorage<WsShortTraits>, KvSharedStorage<KvTraits, kKvStages>>;

  // The forward (but the KV cache's) runs the warp-specialised kernel; with
  // dropout, in every tile but the long one.
  static void launch_plain(const FwdParams& params, cudaStream_t stream) {
    launch_variant(params, [&](auto score_mods, auto dropout) {
      constexpr bool kScoreMods = decltype(score_mods)::value, kDropout = decltype(dropout)::value;
      if (!kDropout && kHasLongTile && use_long_key_blocks(params)) {  // its 80-key blocks: no dropout kernel
        if constexpr (!kDropout) launch_fwd_ws_variant<WsLongTraits, kScoreMods, false>(params, stream);
      } else if (kHasShortTile && use_short_query_tiles(params)) {
        launch_fwd_ws_variant<WsShortTraits, kScoreMods, kDropout>(params, stream);
      } else {
        launch_fwd_ws_variant<WsTraits, kScoreMods, kDropout>(params, stream);
      }
    });
  }
};

}  // namespace flashattn
