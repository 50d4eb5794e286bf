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

// Tiles within 99 KB of shared memory (cc 8.6/8.9), for the buckets whose
// default tile needs more (d224: 112 KB, d256: 128 KB); (M + 2N) x d x 2 bytes.
// 64 x 64 with 4 warps: the same 16 query rows and O accumulator per warp as the
// default, half the rows per CTA (84 / 96 KB).
template <int kHeadDim> struct Sm80FwdTileSmem99 { static constexpr bool kOwn = false; };
template <> struct Sm80FwdTileSmem99<224> { static constexpr bool kOwn = true; static constexpr int kM = 64, kN = 64, kWarps = 4; };
template <> struct Sm80FwdTileSmem99<256> { static constexpr bool kOwn = true; static constexpr int kM = 64, kN = 64, kWarps = 4; };

// The KV cache kernel's tile (decode, split-KV: few query rows, many keys): 64
// query rows (4 warps of 16) and long key blocks, memory-bound: the bytes in
// flight per SM set its speed. Up to d64, key blocks of 64 with two blocks of K
// and V in flight (kernel/fwd.h kKvStages; decode d64 +3% on an H100 over one
// block of 128 keys, as the sm90 family's tile +5%; at d64, 256 keys spilled
// registers and ran 1.5-2x slower); 128 keys up to d128 (32 KB per K or V load),
// 64 beyond. 40 / 80 / 96 KB of shared memory (d64 / d128 / d256): within 99 KB,
// so one tile serves every sm_8x. Compiled for one CTA per SM like the others
// (255 registers): bounds for three CTAs at d64 spilled and ran 1.2-1.6x slower.
template <int kHeadDim>
struct Sm80FwdKvTile {
  static constexpr bool kStaged = kHeadDim <= 64;
  static constexpr int kM = 64, kN = kStaged || kHeadDim > 128 ? 64 : 128, kWarps = 4, kStages = kStaged ? 2 : 1;
};

template <typename Element, int kHeadDim, TileSet kSet>
struct Sm80Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault || Sm80FwdTileSmem99<kHeadDim>::kOwn;
  using Tile = std::conditional_t<kSet == TileSet::kSmem99 && Sm80FwdTileSmem99<kHeadDim>::kOwn,
                                  Sm80FwdTileSmem99<kHeadDim>, Sm80FwdTile<kHeadDim>>;
  using Traits = Sm80FwdTraits<Element, kHeadDim, Tile::kM, Tile::kN, Tile::kWarps>;
  using SharedStorage = FwdSharedStorage<Traits>;
  static_assert(kSet != TileSet::kSmem99 || !kBuilt || sizeof(SharedStorage) <= kSmem99Bytes);
  using KvTile = Sm80FwdKvTile<kHeadDim>;
  using KvTraits = Sm80FwdTraits<Element, kHeadDim, KvTile::kM, KvTile::kN, KvTile::kWarps>;
  static constexpr int kKvStages = KvTile::kStages;
  static_assert(kv_smem_bytes<KvTraits, kKvStages>() <= kSmem99Bytes);
};

}  // namespace flashattn
