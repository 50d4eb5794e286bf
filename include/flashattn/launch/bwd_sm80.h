// sm80 family backward: tile shapes per head-dim bucket.
#pragma once

#include "flashattn/arch/sm80.h"
#include "flashattn/launch/bwd_launch.h"

namespace flashattn {

// (kBlockM, kBlockN, warps, warp rows of S/dP, dK/dV, dQ, double-buffered Q).
// Shared memory is (M x D x (2 or 3) + 2 N x D + 2 M x N) x 2 bytes.
template <int kHeadDim> struct Sm80BwdTile;
template <> struct Sm80BwdTile<32>  { static constexpr int kM = 128, kN = 128, kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTile<64>  { static constexpr int kM = 128, kN = 128, kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTile<96>  { static constexpr int kM = 64,  kN = 128, kW = 8, kSdP = 2, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTile<128> { static constexpr int kM = 64,  kN = 128, kW = 8, kSdP = 2, kdKV = 4, kdQ = 2; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTile<160> { static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = false; };
template <> struct Sm80BwdTile<192> { static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 4, kdKV = 2, kdQ = 2; static constexpr bool kDbQ = false; };
template <> struct Sm80BwdTile<224> { static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = false; };
template <> struct Sm80BwdTile<256> { static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 4, kdKV = 2, kdQ = 2; static constexpr bool kDbQ = false; };

// Tiles within 99 KB of shared memory (cc 8.6/8.9) for the buckets whose default
// needs more (all but d160, 96 KB). Keys per CTA stay as many as fit, since each
// query block's loads and dQ additions are paid once per key block:
//   d32  128 x 128, one Q buffer              96 KB
//   d64   64 x 128, Q double-buffered         88 KB
//   d96   64 x 64,  Q double-buffered         76 KB
//   d128  64 x 64,  Q double-buffered         96 KB
//   d192  64 x 32                             80 KB
//   d224  32 x 32, 4 warps, Q double-buffered 74 KB (8 warps cannot tile 32 x 224)
//   d256  32 x 32, 4 warps, Q double-buffered 84 KB (64 x 32 needs 104 KB)
template <int kHeadDim> struct Sm80BwdTileSmem99 { static constexpr bool kOwn = false; };
template <> struct Sm80BwdTileSmem99<32>  { static constexpr bool kOwn = true; static constexpr int kM = 128, kN = 128, kW = 8, kSdP = 4, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = false; };
template <> struct Sm80BwdTileSmem99<64>  { static constexpr bool kOwn = true; static constexpr int kM = 64,  kN = 128, kW = 8, kSdP = 2, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTileSmem99<96>  { static constexpr bool kOwn = true; static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 2, kdKV = 4, kdQ = 4; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTileSmem99<128> { static constexpr bool kOwn = true; static constexpr int kM = 64,  kN = 64,  kW = 8, kSdP = 2, kdKV = 4, kdQ = 2; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTileSmem99<192> { static constexpr bool kOwn = true; static constexpr int kM = 64,  kN = 32,  kW = 8, kSdP = 4, kdKV = 2, kdQ = 4; static constexpr bool kDbQ = false; };
template <> struct Sm80BwdTileSmem99<224> { static constexpr bool kOwn = true; static constexpr int kM = 32,  kN = 32,  kW = 4, kSdP = 2, kdKV = 2, kdQ = 2; static constexpr bool kDbQ = true; };
template <> struct Sm80BwdTileSmem99<256> { static constexpr bool kOwn = true; static constexpr int kM = 32,  kN = 32,  kW = 4, kSdP = 2, kdKV = 2, kdQ = 2; static constexpr bool kDbQ = true; };

template <typename Element, int kHeadDim, TileSet kSet>
struct Sm80Bwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault || Sm80BwdTileSmem99<kHeadDim>::kOwn;
  using T = std::conditional_t<kSet == TileSet::kSmem99 && Sm80BwdTileSmem99<kHeadDim>::kOwn,
                               Sm80BwdTileSmem99<kHeadDim>, Sm80BwdTile<kHeadDim>>;
  using Traits = Sm80BwdTraits<Element, kHeadDim, T::kM, T::kN, T::kW, T::kSdP, T::kdKV, T::kdQ, T::kDbQ>;
  using SharedStorage = BwdSharedStorage<Traits>;
  static_assert(kSet != TileSet::kSmem99 || !kBuilt || sizeof(SharedStorage) <= kSmem99Bytes);
};

}  // namespace flashattn
