// sm90 family backward: tile shapes per head-dim bucket. Two warpgroups; a query
// block of 64 rows; 128 keys per CTA up to d128 (the warpgroups split the keys of
// dK, dV), 64 above (they split the head dim). Shared memory is
// (3 M x D + 2 N x D + 2 M x N) x 2 bytes: 144 KB at d128, 176 KB at d256.
#pragma once

#include "flashattn/arch/sm90.h"
#include "flashattn/launch/bwd_launch.h"

namespace flashattn {

template <int kHeadDim>
struct Sm90BwdTile {
  static constexpr int kM = 64, kN = kHeadDim <= 128 ? 128 : 64;
};

// Every tile fits Hopper's 227 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm90Bwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using T = Sm90BwdTile<kHeadDim>;
  using Traits = Sm90BwdTraits<Element, kHeadDim, T::kM, T::kN, /*warpgroups=*/2, /*S, dP rows=*/T::kM / 64,
                               /*dK, dV rows=*/T::kN / 64, /*dQ rows=*/T::kM / 64, /*double-buffered Q=*/true>;
  using SharedStorage = BwdSharedStorage<Traits>;
  // wgmma reads its operands through swizzled descriptors, which need every tile
  // 1024-byte aligned: each tile is a whole number of KB, so they stay aligned
  // one after another from the start of dynamic shared memory.
  static_assert(sizeof(SharedStorage::d_o) % 1024 == 0 && sizeof(SharedStorage::k) % 1024 == 0 &&
                    sizeof(SharedStorage::p) % 1024 == 0,
                "a shared-memory tile of the wgmma backward would start off a 1024-byte boundary");
};

}  // namespace flashattn
