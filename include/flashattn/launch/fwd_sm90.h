// sm90 family: tile shapes per head-dim bucket, measured (H100, bf16, s = 1k and
// 8k, causal and not; benchmarks/sweep_sm90_tiles.sh, docs/perf-notes.md). One
// warpgroup of 64 query rows per CTA wins wherever its registers leave room for
// two or more CTAs per SM: the CTAs' softmax and products then overlap, which a
// CTA's barriers prevent between its own warpgroups. At d192/d224 the output
// accumulator (d/2 registers per thread of a 64-row warpgroup) leaves room for
// one such CTA only, and two warpgroups of 64 rows do better.
#pragma once

#include "flashattn/arch/sm90.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

#if defined(FLASHATTN_SM90_TILE_M) && defined(FLASHATTN_SM90_TILE_N)
// Tile sweeps (benchmarks/sweep_sm90_tiles.sh) build every bucket with one tile.
template <int kHeadDim>
struct Sm90FwdTile {
  static constexpr int kM = FLASHATTN_SM90_TILE_M, kN = FLASHATTN_SM90_TILE_N;
};
#else
template <int kHeadDim> struct Sm90FwdTile                { static constexpr int kM = 64,  kN = 128; };  // d32-d160
template <> struct Sm90FwdTile<192>                        { static constexpr int kM = 128, kN = 96; };
template <> struct Sm90FwdTile<224>                        { static constexpr int kM = 128, kN = 64; };
template <> struct Sm90FwdTile<256>                        { static constexpr int kM = 64,  kN = 64; };
#endif

// The KV cache kernel: one warpgroup of 64 query rows (decode has few).
template <int kHeadDim>
struct Sm90FwdKvTile {
  static constexpr int kM = 64, kN = kHeadDim <= 128 ? 128 : 64;
};

// Every tile fits Hopper's 227 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm90Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using Tile = Sm90FwdTile<kHeadDim>;
  using Traits = Sm90FwdTraits<Element, kHeadDim, Tile::kM, Tile::kN>;
  using SharedStorage = FwdSharedStorage<Traits>;
  using KvTile = Sm90FwdKvTile<kHeadDim>;
  using KvTraits = Sm90FwdTraits<Element, kHeadDim, KvTile::kM, KvTile::kN>;
};

}  // namespace flashattn
