// Traits of the sm80 family (Ampere, Ada, and every newer GPU): SM80 16x8x16
// mma atoms, cp.async global->shared copies, swizzled shared memory, ldmatrix.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/numeric_types.h>

namespace flashattn {

using namespace cute;

template <typename Element>
struct Sm80MmaAtom;
template <>
struct Sm80MmaAtom<cutlass::half_t> {
  using type = MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>;
};
template <>
struct Sm80MmaAtom<cutlass::bfloat16_t> {
  using type = MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>;
};

// Accumulator-layout facts of the 16x8x16 (and 16x8x8) fp32 atoms, shared by the
// sm80 and sm75 families. The C fragment of one atom holds 4 values per thread:
// mode (2 columns, 2 rows 8 apart). Row r of the atom lives in the 4 lanes
// 4*(r%8) + {0,1,2,3}, so a row reduction xor-shuffles lanes 1 and 2.
struct Sm80AccumulatorLayout {
  static constexpr unsigned kRowShuffleMask = 0x3;
  // A thread's rows come in pairs (r, r + 8), and the 4 lanes that differ in lane
  // bits 0-1 hold the 8 columns of an atom's row pair, 2 each (kernel/dropout.h).
  static constexpr int kPairedRowStride = 8;
  static constexpr unsigned kUnitLanes = 0x3;

  // ((2,2), MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)): rows, columns.
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto rowcol(Layout acc) {
    static_assert(decltype(rank<0>(acc))::value == 2);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<2>(acc)));
  }

  // The C fragment of S (two adjacent 16x8 tiles) is the A fragment of P for
  // the next 16x8x16 mma: ((2,2), MMA_M, MMA_N) -> ((2,2,2), MMA_M, MMA_N/2).
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto c_to_a(Layout acc) {
    auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
  }
};

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct Sm80FwdTraits : Sm80AccumulatorLayout {
  static constexpr const char* kFamily = "sm80";
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;  // bucket; the real head dim is predicated
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;

  // Warps split the query rows; each warp owns whole rows of S, so the softmax
  // never reduces across warps.
  using TiledMma = TiledMMA<typename Sm80MmaAtom<Element>::type, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;
  using TiledMmaPV = TiledMma;  // O += P V
  static constexpr bool kPThroughSmem = false;  // P stays in registers (c_to_a)
  // A lane holds its rows' columns of the whole key block (32 or more), so each
  // dropout unit is one lane's 16 elements of a row pair in 32 columns: no words
  // cross lanes (kernel/dropout.h). The sm75 forward, which derives from these
  // traits, takes them too; the sm70 forward (8x8x4 atoms) keeps units shared by
  // lanes.
  static constexpr bool kDropoutLaneUnits = true;

  // Shared memory: rows of 64 (or 32) elements, XOR-swizzled so that ldmatrix
  // reads of 8 rows hit 8 different 16-byte bank groups.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V seen as (head_dim, keys) for the P.V product, read with ldmatrix.trans.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  using SmemLayoutO = SmemLayoutQ;  // the output is staged where Q was

  // Shared memory per CTA the family's GPUs allow (sm_80: 163 KB, sm_90: 227 KB);
  // the shared-memory struct (kernel/shared_storage.h) is checked against it.
  static constexpr int kMaxSmemBytes = 227 * 1024;

  // Global -> shared: 16-byte cp.async per thread, threads laid along rows.
  static constexpr int kGmemElemsPerLoad = int(sizeof(uint128_t) / sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  // cp.async that zero-fills rows and columns outside the tensor by itself; it
  // overlaps loads with compute without staging them in registers.
  static constexpr bool kCopyZeroFills = true;
  static constexpr bool kRegisterPrefetch = false;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
  // Shared -> global for the output: 16-byte stores.
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));

  // Shared -> registers.
  // Shared -> registers, for the A and B operands (B: the second, N x K).
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomB = SmemCopyAtom;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomTransposedB = SmemCopyAtomTransposed;
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// Backward tiles, shared by the sm80 and sm75 backward traits. The
// key-stationary backward runs three products with different output shapes:
//   S = Q.K^T and dP = dO.V^T   (M x N)
//   dV += P^T.dO, dK += dS^T.Q  (N x D)
//   dQ = dS.K                   (M x D)
// P and dS go through shared memory, where the dV/dK products read them
// transposed. With kDoubleBufferQ the next Q block loads while this one is in
// use. The family adds its mma atoms, warp layouts and shared->register copies.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kDoubleBufferQ_>
struct BwdTileLayouts {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr bool kDoubleBufferQ = kDoubleBufferQ_;

  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));
  using SmemLayoutQdO = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Transposed views, read with ldmatrix.trans: Q^T, dO^T (D x M), K^T (D x N).
  using SmemLayoutQdOt = decltype(composition(
      SmemLayoutQdO{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  // P and dS (M x N) and their transposes (N x M).
  static constexpr int kPdSCols = kBlockN % 64 == 0 ? 64 : 32;
  static_assert(kBlockN % 32 == 0);
  using SmemLayoutAtomPdS = decltype(composition(
      Swizzle<kPdSCols == 32 ? 2 : 3, 3, 3>{}, Layout<Shape<_8, Int<kPdSCols>>, Stride<Int<kPdSCols>, _1>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(SmemLayoutAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSt = decltype(composition(
      SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));

  // The next Q/dO staged through registers (families without cp.async, where the
  // tile has the registers); the family's traits override it.
  static constexpr bool kRegisterPrefetch = false;

  // Shared memory per CTA the family's GPUs allow (sm_80: 163 KB, sm_90: 227 KB);
  // the shared-memory struct (kernel/shared_storage.h) is checked against it.
  static constexpr int kMaxSmemBytes = 227 * 1024;

  static constexpr int kGmemElemsPerLoad = int(sizeof(uint128_t) / sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  static_assert(kBlockM % (kNThreads / kGmemThreadsPerRow) == 0 &&
                kBlockN % (kNThreads / kGmemThreadsPerRow) == 0, "tile smaller than one copy pass");
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// S and dP of the backward's dropout kernels (kernel/bwd.h SdPTiling). Dropout's lane
// units (kernel/dropout.h) cover 32 columns of a lane's row pair, and each warp of
// the plain tiling takes every kWarpsN-th 8-column atom of the key block. This tiling
// permutes the atoms so that each warp holds runs of 32 columns where the block has
// 32 per warp, else runs of 16 (each unit then made for the half its warp holds):
// the same products, operands and shared-memory traffic, in another order of atoms.
// Where a warp holds only 8 columns (kGroupRun 1, sm75's d192/d256) a lane makes each
// call for the quarter of its unit it holds, and the plain tiling stays. The plain
// kernels keep the plain tiling (the permuted one ran sm80's d64 backward 2-3%
// slower; H200, docs/perf-notes.md).
template <class PlainTiledMma, class MmaAtom, int kAtomM, int kWarpsN, int kBlockN, int kAtomK>
struct DropoutSdPTiling {
  static constexpr int kGroupRun = kBlockN % (32 * kWarpsN) == 0 ? 4 : kBlockN % (16 * kWarpsN) == 0 ? 2 : 1;
  static_assert(kGroupRun > 1 || kWarpsN % 4 == 0, "single groups: a warp's groups share their place");
  using Columns = Layout<Shape<_8, Int<kWarpsN>, Int<kGroupRun>>, Stride<_1, Int<8 * kGroupRun>, _8>>;
  using Permuted = TiledMMA<MmaAtom, Layout<Shape<Int<kAtomM>, Int<kWarpsN>, _1>>,
                            Tile<Int<16 * kAtomM>, Columns, Int<kAtomK>>>;
  using TiledMma = std::conditional_t<kGroupRun == 1, PlainTiledMma, Permuted>;
};

// sm80 backward: each warp owns 16 x 16 of a product's output per tile (the
// ldmatrix x4 shape); kAtom* warps along the output's rows, the rest along its
// columns, for S/dP, dK/dV and dQ.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ, bool kDoubleBufferQ_>
struct Sm80BwdTraits : Sm80AccumulatorLayout,
                       BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_> {
  using Base = BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_>;
  static constexpr const char* kFamily = "sm80";
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNWarps;

  template <int kWarpRows>
  using WarpTiledMma = TiledMMA<typename Sm80MmaAtom<Element_>::type,
                                Layout<Shape<Int<kWarpRows>, Int<kNWarps / kWarpRows>, _1>>,
                                Tile<Int<16 * kWarpRows>, Int<16 * (kNWarps / kWarpRows)>, _16>>;
  using TiledMmaSdP = WarpTiledMma<kAtomMSdP>;
  using TiledMmadKV = WarpTiledMma<kAtomNdKV>;
  using TiledMmadQ = WarpTiledMma<kAtomMdQ>;
  static_assert(kBlockM % (16 * kAtomMSdP) == 0 && kBlockN % (16 * (kNWarps / kAtomMSdP)) == 0);
  // The dropout kernels' S and dP tiling: runs of 32 or 16 columns per warp.
  using DropoutSdP =
      DropoutSdPTiling<TiledMmaSdP, typename Sm80MmaAtom<Element_>::type, kAtomMSdP, kNWarps / kAtomMSdP,
                       kBlockN, 16>;
  static_assert(DropoutSdP::kGroupRun > 1, "sm80 tiles hold 16 columns per warp");
  static constexpr int kDropoutGroupRun = DropoutSdP::kGroupRun;
  static constexpr bool kDropoutLaneUnits = true;
  using TiledMmaSdPDropout = typename DropoutSdP::TiledMma;
  static_assert(kBlockN % (16 * kAtomNdKV) == 0 && kHeadDim % (16 * (kNWarps / kAtomNdKV)) == 0);
  static_assert(kBlockM % (16 * kAtomMdQ) == 0 && kHeadDim % (16 * (kNWarps / kAtomMdQ)) == 0);

  // cp.async that zero-fills rows and columns outside the tensor by itself.
  static constexpr bool kCopyZeroFills = true;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element_>{}, typename Base::GmemLayoutAtom{},
      Layout<Shape<_1, _8>>{}));

  // Shared -> registers, for the A and B operands (B: the second, N x K).
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element_>;
  using SmemCopyAtomB = SmemCopyAtom;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element_>;
  using SmemCopyAtomTransposedB = SmemCopyAtomTransposed;
};

}  // namespace flashattn
