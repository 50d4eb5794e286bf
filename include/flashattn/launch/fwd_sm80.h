// sm80 family: tile shapes per head-dim bucket.
#pragma once

#include "flashattn/arch/sm80.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

// (kBlockM, kBlockN, warps) per bucket: the largest key block whose S and O
// accumulators still fit the register file without spills; 8 warps from 160
// on, where 4 warps would hold too large an O accumulator each.
template <int kHeadDim> struct Sm80FwdTile;
template <> struct Sm80FwdTile<32>  { static constexpr int kM = 128, kN = 128, kWarps = 4; };
template <> struct Sm80FwdTile<64>  { static constexpr int kM = 128, kN = 64,  kWarps = 4; };
template <> struct Sm80FwdTile<96>  { static constexpr int kM = 128, kN = 64,  kWarps = 4; };
template <> struct Sm80FwdTile<128> { static constexpr int kM = 128, kN = 64,  kWarps = 4; };
template <> struct Sm80FwdTile<160> { static constexpr int kM = 128, kN = 64,  kWarps = 8; };
template <> struct Sm80FwdTile<192> { static constexpr int kM = 128, kN = 64,  kWarps = 8; };
template <> struct Sm80FwdTile<224> { static constexpr int kM = 128, kN = 64,  kWarps = 8; };
template <> struct Sm80FwdTile<256> { static constexpr int kM = 128, kN = 64,  kWarps = 8; };

template <typename Element, int kHeadDim>
void launch_fwd_sm80(const FwdParams& params, cudaStream_t stream) {
  using Tile = Sm80FwdTile<kHeadDim>;
  launch_fwd_kernel<Sm80FwdTraits<Element, kHeadDim, Tile::kM, Tile::kN, Tile::kWarps>>(params, stream);
}

}  // namespace flashattn
