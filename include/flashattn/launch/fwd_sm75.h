// sm75 family: tile shapes per head-dim bucket, within a T4's 64 KB of shared
// memory per CTA ((M + 2N) x d x 2 bytes) and without register spills on sm_75
// (128x64 spilled 4 / 204 / 104 bytes at d64 / d96 / d128; the register prefetch
// of K/V takes N x d / threads more halves per thread, so d128 runs 8 warps, and
// d224/d256, whose 4 warps hold 112/128 output accumulators each, load
// without it). T4 speed is not measured: chosen by resources
// (scripts/check_family.sh sm75), not timings.
#pragma once

#include "flashattn/arch/sm75.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

template <int kHeadDim> struct Sm75FwdTile;
template <> struct Sm75FwdTile<32>  { static constexpr int kM = 128, kN = 64, kWarps = 4; static constexpr bool kPrefetch = true; };   // 16 KB
template <> struct Sm75FwdTile<64>  { static constexpr int kM = 128, kN = 32, kWarps = 4; static constexpr bool kPrefetch = true; };   // 24 KB
template <> struct Sm75FwdTile<96>  { static constexpr int kM = 128, kN = 32, kWarps = 4; static constexpr bool kPrefetch = true; };   // 36 KB
template <> struct Sm75FwdTile<128> { static constexpr int kM = 128, kN = 32, kWarps = 8; static constexpr bool kPrefetch = true; };   // 48 KB
template <> struct Sm75FwdTile<160> { static constexpr int kM = 64,  kN = 32, kWarps = 4; static constexpr bool kPrefetch = true; };   // 40 KB
template <> struct Sm75FwdTile<192> { static constexpr int kM = 64,  kN = 32, kWarps = 4; static constexpr bool kPrefetch = true; };   // 48 KB
template <> struct Sm75FwdTile<224> { static constexpr int kM = 64,  kN = 32, kWarps = 4; static constexpr bool kPrefetch = false; };  // 56 KB
template <> struct Sm75FwdTile<256> { static constexpr int kM = 64,  kN = 32, kWarps = 4; static constexpr bool kPrefetch = false; };  // 64 KB

// Every tile fits 64 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm75Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using Tile = Sm75FwdTile<kHeadDim>;
  using Traits = Sm75FwdTraits<Element, kHeadDim, Tile::kM, Tile::kN, Tile::kWarps, Tile::kPrefetch>;
  using SharedStorage = FwdSharedStorage<Traits>;
  using KvTraits = Traits;  // the KV cache kernel: the same tile
  static constexpr int kKvStages = 1;
};

}  // namespace flashattn
