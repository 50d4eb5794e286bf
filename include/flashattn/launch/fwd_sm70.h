// sm70 family: tile shapes per head-dim bucket, within a V100's 96 KB of
// shared memory per CTA ((M + 2N) x d + M x N (for P)) x 2 bytes. 8 warps of
// 8 rows: every thread holds M x d / 256 output accumulators (at most 64), which
// keeps the sm_70 kernels free of spills; fewer rows per CTA from d160 on. V100 speed is not
// measured: these are chosen by resources (scripts/sm70_check.sh).
#pragma once

#include "flashattn/arch/sm70.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

template <int kHeadDim> struct Sm70FwdTile;
template <> struct Sm70FwdTile<32>  { static constexpr int kM = 128, kN = 128, kWarps = 8; };  // 56 KB
template <> struct Sm70FwdTile<64>  { static constexpr int kM = 128, kN = 64,  kWarps = 8; };  // 48 KB
template <> struct Sm70FwdTile<96>  { static constexpr int kM = 128, kN = 64,  kWarps = 8; };  // 64 KB
template <> struct Sm70FwdTile<128> { static constexpr int kM = 128, kN = 64,  kWarps = 8; };  // 80 KB
template <> struct Sm70FwdTile<160> { static constexpr int kM = 64,  kN = 64,  kWarps = 8; };  // 68 KB
template <> struct Sm70FwdTile<192> { static constexpr int kM = 64,  kN = 64,  kWarps = 8; };  // 80 KB
template <> struct Sm70FwdTile<224> { static constexpr int kM = 64,  kN = 64,  kWarps = 8; };  // 92 KB
template <> struct Sm70FwdTile<256> { static constexpr int kM = 64,  kN = 32,  kWarps = 8; };  // 68 KB

// Every tile fits 96 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm70Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using Tile = Sm70FwdTile<kHeadDim>;
  using Traits = Sm70FwdTraits<Element, kHeadDim, Tile::kM, Tile::kN, Tile::kWarps>;
  using SharedStorage = FwdSharedStorage<Traits>;
  using KvTraits = Traits;  // the KV cache kernel: the same tile
  static constexpr int kKvStages = 1;
};

}  // namespace flashattn
