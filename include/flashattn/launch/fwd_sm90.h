// sm90 family: tile shapes per head-dim bucket. Two warpgroups of 64 query rows
// each; 128 keys per block up to d128, 64 above (the output accumulator takes
// d/2 registers per thread, S N/2 and P N/4 of the 255). Shared memory
// (M + 2N) x d x 2 bytes: at most 128 KB (d256).
#pragma once

#include "flashattn/arch/sm90.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

template <int kHeadDim>
struct Sm90FwdTile {
  static constexpr int kM = 128, kN = kHeadDim <= 128 ? 128 : 64;
};

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
