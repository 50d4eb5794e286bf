// sm75 family backward: tile shapes per head-dim bucket, for a T4's 64 KB of
// shared memory per CTA. Shared memory is (M x D x (2 or 3) + 2 N x D + 2 M x N)
// x 2 bytes, so every tile trades query rows (M) against keys (N) under that
// bound; keys are kept as many as fit, because each query block's Q, dO loads
// and dQ additions are paid once per key block. 8 warps where the copy shapes
// allow it (a T4 runs one such CTA per SM: its warps hide the latency).
// d256 is the tightest: Q, dO, K, V alone take 64 KB at 32 x 32, so it runs
// 16 query rows x 32 keys with 4 warps (58 KB with the second Q buffer).
// T4 speed is not measured: these are chosen by resources (scripts/sm75_check.sh).
#pragma once

#include "flashattn/arch/sm75.h"
#include "flashattn/launch/bwd_launch.h"

namespace flashattn {

// (kBlockM, kBlockN, warps, warp rows of S/dP, dK/dV, dQ, the next Q/dO staged
// through registers while dQ = dS K runs (where the registers allow it: M x d / threads
// halves of each per thread), double-buffered Q).
template <int kHeadDim> struct Sm75BwdTile;
template <> struct Sm75BwdTile<32>  { static constexpr int kM = 64, kN = 128, kW = 8, kSdP = 4, kdKV = 8, kdQ = 4; static constexpr bool kPrefetch = true, kDbQ = true; };   // 60 KB
template <> struct Sm75BwdTile<64>  { static constexpr int kM = 32, kN = 128, kW = 8, kSdP = 2, kdKV = 8, kdQ = 2; static constexpr bool kPrefetch = true, kDbQ = true; };   // 60 KB
template <> struct Sm75BwdTile<96>  { static constexpr int kM = 32, kN = 64,  kW = 4, kSdP = 2, kdKV = 4, kdQ = 2; static constexpr bool kPrefetch = false, kDbQ = true; };   // 50 KB
template <> struct Sm75BwdTile<128> { static constexpr int kM = 32, kN = 64,  kW = 8, kSdP = 2, kdKV = 4, kdQ = 2; static constexpr bool kPrefetch = true, kDbQ = false; };  // 56 KB
template <> struct Sm75BwdTile<160> { static constexpr int kM = 32, kN = 32,  kW = 4, kSdP = 2, kdKV = 2, kdQ = 2; static constexpr bool kPrefetch = false, kDbQ = true; };   // 54 KB
template <> struct Sm75BwdTile<192> { static constexpr int kM = 32, kN = 32,  kW = 8, kSdP = 2, kdKV = 2, kdQ = 2; static constexpr bool kPrefetch = false, kDbQ = false; };  // 52 KB
template <> struct Sm75BwdTile<224> { static constexpr int kM = 32, kN = 32,  kW = 4, kSdP = 2, kdKV = 2, kdQ = 2; static constexpr bool kPrefetch = false, kDbQ = false; };  // 60 KB
template <> struct Sm75BwdTile<256> { static constexpr int kM = 16, kN = 32,  kW = 4, kSdP = 1, kdKV = 2, kdQ = 1; static constexpr bool kPrefetch = false, kDbQ = true; };   // 58 KB

// Every tile fits 64 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm75Bwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using T = Sm75BwdTile<kHeadDim>;
  using Traits = Sm75BwdTraits<Element, kHeadDim, T::kM, T::kN, T::kW, T::kSdP, T::kdKV, T::kdQ, T::kDbQ, T::kPrefetch>;
  using SharedStorage = BwdSharedStorage<Traits>;
};

}  // namespace flashattn
