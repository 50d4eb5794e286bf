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

template <typename Element, int kHeadDim>
void launch_bwd_sm80(const BwdParams& params, cudaStream_t stream) {
  using T = Sm80BwdTile<kHeadDim>;
  launch_bwd_kernel<Sm80BwdTraits<Element, kHeadDim, T::kM, T::kN, T::kW, T::kSdP, T::kdKV, T::kdQ, T::kDbQ>>(
      params, stream);
}

}  // namespace flashattn
