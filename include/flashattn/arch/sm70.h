// Traits of the sm70 family (Volta: V100, Titan V): SM70 8x8x4 mma atoms, fp16
// only, no cp.async (global->shared copies go through registers) and no
// ldmatrix (shared->register reads are 8-byte loads), at most 96 KB of shared
// memory per CTA.
//
// An 8x8x4 atom is computed by a quad pair: lanes 4q + {0..3} and 4q + 16 +
// {0..3}. A warp here is its 4 quad pairs side by side, an 8 x 32 tile: each
// quad pair then holds different B rows (2 x 2 quad pairs would hold every B
// row twice, which spilled the forward's V fragments at d >= 64).
#pragma once

#include "flashattn/arch/sm80.h"

namespace flashattn {

// The accumulator of one 8x8 atom holds 8 values per thread: mode (2 columns,
// 2 rows 2 apart, 2 columns 4 apart). Row r of the atom lives in 2 atom threads
// that differ in bit 1 (lane bit 1), each with 4 of its 8 columns; the warp's
// other quad pairs (lane bits 2, 3) hold the other 24 columns of the same rows.
// So a row reduction xor-shuffles lanes 2, 4 and 8. The C fragment is no operand
// fragment (A rows live in one thread each), so P goes through shared memory.
struct Sm70AccumulatorLayout {
  static constexpr unsigned kRowShuffleMask = 0x2 | 0x4 | 0x8;
  static constexpr bool kPThroughSmem = true;
  // A thread's rows come in pairs (r, r + 2), and the 2 lanes that differ in lane
  // bit 1 hold the 8 columns of an atom's row pair, 4 each (kernel/dropout.h).
  static constexpr int kPairedRowStride = 2;
  static constexpr unsigned kUnitLanes = 0x2;

  // ((2,2,2), MMA_M, MMA_N) -> ((2, MMA_M), ((2,2), MMA_N)): rows, columns.
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto rowcol(Layout acc) {
    static_assert(decltype(rank<0>(acc))::value == 3);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(make_layout(get<0, 0>(acc), get<0, 2>(acc)), get<2>(acc)));
  }
};

// kWarpRows x kWarpCols warps of 8 x 32: thread group g = 4 * warp + quad pair,
// warps column-major.
template <typename Atom, int kWarpRows, int kWarpCols>
using Sm70TiledMma = TiledMMA<MMA_Atom<Atom>, Layout<Shape<Int<kWarpRows>, Shape<_4, Int<kWarpCols>>, _1>,
                                                     Stride<_4, Stride<_1, Int<4 * kWarpRows>>, _0>>>;

// Each operand has the atom whose register layout matches how it lies in shared
// memory, so every thread reads 4 contiguous halves (one 8-byte load): TN for a
// K-major A and B (Q K^T), TT for a B that is N-major (V, K in P V and dS K), NT
// for a transposed A and B (P^T dO, dS^T Q).
using Sm70AtomTN = SM70_8x8x4_F32F16F16F32_TN;
using Sm70AtomTT = SM70_8x8x4_F32F16F16F32_TT;
using Sm70AtomNT = SM70_8x8x4_F32F16F16F32_NT;
using Sm70SmemCopyAtom = Copy_Atom<UniversalCopy<uint64_t>, cutlass::half_t>;

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct Sm70FwdTraits : Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_>, Sm70AccumulatorLayout {
  using Base = Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_>;
  static constexpr const char* kFamily = "sm70";
  using Element = Element_;
  using Sm70AccumulatorLayout::kUnitLanes;
  using Sm70AccumulatorLayout::kPairedRowStride;
  using Sm70AccumulatorLayout::kPThroughSmem;
  using Sm70AccumulatorLayout::kRowShuffleMask;
  using Sm70AccumulatorLayout::rowcol;
  static constexpr bool kDropoutLaneUnits = false;  // units of two lanes (kernel/dropout.h)
  static_assert(std::is_same_v<Element, cutlass::half_t>, "Volta tensor cores take fp16 only");

  using TiledMma = Sm70TiledMma<Sm70AtomTN, kNWarps_, 1>;
  using TiledMmaPV = Sm70TiledMma<Sm70AtomTT, kNWarps_, 1>;
  using SmemCopyAtom = Sm70SmemCopyAtom;
  using SmemCopyAtomB = Sm70SmemCopyAtom;
  using SmemCopyAtomTransposed = Sm70SmemCopyAtom;
  using SmemCopyAtomTransposedB = Sm70SmemCopyAtom;

  // P (M x N), after K and V.
  static constexpr int kPCols = kBlockN_ % 64 == 0 ? 64 : 32;
  using SmemLayoutP = decltype(tile_to_shape(
      composition(Swizzle<kPCols == 32 ? 2 : 3, 3, 3>{}, Layout<Shape<_8, Int<kPCols>>, Stride<Int<kPCols>, _1>>{}),
      Shape<Int<kBlockM_>, Int<kBlockN_>>{}));
  static constexpr int kMaxSmemBytes = 96 * 1024;  // a Volta CTA's shared memory

  // No cp.async: 16-byte loads into registers, then 16-byte shared stores; the
  // next K/V tile is loaded into registers while the current one is used.
  static constexpr bool kCopyZeroFills = false;
  static constexpr bool kRegisterPrefetch = true;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{},
                                                    typename Base::GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
};

// Backward: kAtom* warps along a product's rows (8 each), the rest along its
// columns (32 each).
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ, bool kDoubleBufferQ_, bool kRegisterPrefetch_ = false>
struct Sm70BwdTraits : Sm70AccumulatorLayout,
                       BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_> {
  using Base = BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_>;
  static constexpr const char* kFamily = "sm70";
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNWarps;
  static_assert(std::is_same_v<Element_, cutlass::half_t>, "Volta tensor cores take fp16 only");
  static constexpr int kMaxSmemBytes = 96 * 1024;  // a Volta CTA's shared memory

  using TiledMmaSdP = Sm70TiledMma<Sm70AtomTN, kAtomMSdP, kNWarps / kAtomMSdP>;
  using TiledMmadKV = Sm70TiledMma<Sm70AtomNT, kAtomNdKV, kNWarps / kAtomNdKV>;
  using TiledMmadQ = Sm70TiledMma<Sm70AtomTT, kAtomMdQ, kNWarps / kAtomMdQ>;
  static_assert(kBlockM % (8 * kAtomMSdP) == 0 && kBlockN % (32 * (kNWarps / kAtomMSdP)) == 0);
  static_assert(kBlockN % (8 * kAtomNdKV) == 0 && kHeadDim % (32 * (kNWarps / kAtomNdKV)) == 0);
  static_assert(kBlockM % (8 * kAtomMdQ) == 0 && kHeadDim % (32 * (kNWarps / kAtomMdQ)) == 0);

  static constexpr bool kCopyZeroFills = false;
  static constexpr bool kRegisterPrefetch = kRegisterPrefetch_;  // the next Q/dO through registers
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element_>{},
                                                    typename Base::GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));

  using SmemCopyAtom = Sm70SmemCopyAtom;
  using SmemCopyAtomB = Sm70SmemCopyAtom;
  using SmemCopyAtomTransposed = Sm70SmemCopyAtom;
  using SmemCopyAtomTransposedB = Sm70SmemCopyAtom;
};

}  // namespace flashattn
