// sm70 family backward: tile shapes per head-dim bucket, within a V100's 96 KB
// of shared memory per CTA, (M x D x (2 or 3) + 2 N x D + 2 M x N) x 2 bytes.
// Fewer query rows (or no second Q buffer) than the sm80 tiles where those do
// not fit; d224 and d256 run 32 x 32 with 4 warps, because 8 warps of 8 x 32
// need 64 keys, which do not fit next to d >= 224.
// V100 speed is not measured: these are chosen by resources (scripts/sm70_check.sh).
#pragma once

#include "flashattn/arch/sm70.h"
#include "flashattn/launch/bwd_launch.h"

namespace flashattn {

// (kBlockM, kBlockN, warps, warp rows of S/dP, dK/dV, dQ, the next Q/dO staged
// through registers while dQ = dS K runs (where the registers allow it: M x d / threads
// halves of each per thread), double-buffered Q).
template <int kHeadDim> struct Sm70BwdTile;
template <> struct Sm70BwdTile<32>  { static constexpr int kM = 64, kN = 128, kW = 8, kSdP = 4, kdKV = 8, kdQ = 8; static constexpr bool kPrefetch = true, kDbQ = true; };   // 60 KB
template <> struct Sm70BwdTile<64>  { static constexpr int kM = 64, kN = 128, kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kPrefetch = true, kDbQ = true; };   // 88 KB
template <> struct Sm70BwdTile<96>  { static constexpr int kM = 64, kN = 64,  kW = 8, kSdP = 4, kdKV = 8, kdQ = 8; static constexpr bool kPrefetch = false, kDbQ = true; };   // 76 KB
template <> struct Sm70BwdTile<128> { static constexpr int kM = 64, kN = 64,  kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kPrefetch = false, kDbQ = false; };  // 80 KB
template <> struct Sm70BwdTile<160> { static constexpr int kM = 64, kN = 64,  kW = 8, kSdP = 4, kdKV = 8, kdQ = 8; static constexpr bool kPrefetch = false, kDbQ = false; };  // 96 KB
template <> struct Sm70BwdTile<192> { static constexpr int kM = 32, kN = 64,  kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kPrefetch = false, kDbQ = false; };  // 80 KB
template <> struct Sm70BwdTile<224> { static constexpr int kM = 32, kN = 32,  kW = 4, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kPrefetch = false, kDbQ = true; };   // 74 KB
template <> struct Sm70BwdTile<256> { static constexpr int kM = 32, kN = 32,  kW = 4, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kPrefetch = false, kDbQ = true; };   // 84 KB

// Every tile fits 96 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm70Bwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using T = Sm70BwdTile<kHeadDim>;
  using Traits = Sm70BwdTraits<Element, kHeadDim, T::kM, T::kN, T::kW, T::kSdP, T::kdKV, T::kdQ, T::kDbQ, T::kPrefetch>;
  using SharedStorage = BwdSharedStorage<Traits>;
};

}  // namespace flashattn
