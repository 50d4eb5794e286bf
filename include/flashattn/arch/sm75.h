// Traits of the sm75 family (Turing: T4, RTX 20xx): SM75 16x8x8 mma atoms and
// ldmatrix like Ampere, but no cp.async (global->shared copies go through
// registers) and at most 64 KB of shared memory per CTA. fp16 only.
#pragma once

#include "flashattn/arch/sm80.h"

namespace flashattn {

// kRegisterPrefetch_: the next K/V tile is loaded into registers while the
// current one is used (StagedTileCopy), where the registers allow it.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kRegisterPrefetch_>
struct Sm75FwdTraits : Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_> {
  using Base = Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_>;
  static constexpr const char* kFamily = "sm75";
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t>, "Turing tensor cores take fp16 only");
  static constexpr int kMaxSmemBytes = 64 * 1024;  // a Turing CTA's shared memory
  // Dropout in lane units, as the sm80 forward's (its warps hold whole rows).

  // The 16x8x8 atom's C fragment has the 16x8x16 atom's layout (same rows, same
  // lanes: rowcol and the row shuffles are inherited), and its A fragment (16x8,
  // M x K) is laid out exactly like C: the S fragment of one 8-key block is
  // already the P operand of one 8-wide k-step.
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto c_to_a(Layout acc) {
    return acc;
  }

  // K-steps of 8: each ldmatrix reads two 8x8 matrices (x2), matching one atom.
  using TiledMma = TiledMMA<MMA_Atom<SM75_16x8x8_F32F16F16F32_TN>, Layout<Shape<Int<kNWarps_>, _1, _1>>,
                            Tile<Int<16 * kNWarps_>, _16, _8>>;
  using TiledMmaPV = TiledMma;
  using SmemCopyAtom = Copy_Atom<SM75_U32x2_LDSM_N, Element>;
  using SmemCopyAtomB = SmemCopyAtom;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x4_LDSM_T, Element>;
  using SmemCopyAtomTransposedB = SmemCopyAtomTransposed;
  // No cp.async: 16-byte loads into registers, then 16-byte shared stores.
  static constexpr bool kCopyZeroFills = false;
  static constexpr bool kRegisterPrefetch = kRegisterPrefetch_;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{},
                                                    typename Base::GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
};

// sm75 backward: each warp owns one 16 x 8 atom of a product's output per tile,
// so that small tiles (a T4 fits Q, dO, K, V of d256 in 64 KB only with 16 x 32
// blocks) still give every warp work. A operands (16 x 8 per k-step) are read
// with ldmatrix x2, B operands (8 x 8) with x1.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ, bool kDoubleBufferQ_, bool kRegisterPrefetch_ = false>
struct Sm75BwdTraits : Sm80AccumulatorLayout,
                       BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_> {
  using Base = BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_, kDoubleBufferQ_>;
  static constexpr const char* kFamily = "sm75";
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNWarps;
  static_assert(std::is_same_v<Element_, cutlass::half_t>, "Turing tensor cores take fp16 only");
  static constexpr int kMaxSmemBytes = 64 * 1024;  // a Turing CTA's shared memory

  template <int kWarpRows>
  using WarpTiledMma = TiledMMA<MMA_Atom<SM75_16x8x8_F32F16F16F32_TN>,
                                Layout<Shape<Int<kWarpRows>, Int<kNWarps / kWarpRows>, _1>>,
                                Tile<Int<16 * kWarpRows>, Int<8 * (kNWarps / kWarpRows)>, _8>>;
  using TiledMmaSdP = WarpTiledMma<kAtomMSdP>;
  using TiledMmadKV = WarpTiledMma<kAtomNdKV>;
  using TiledMmadQ = WarpTiledMma<kAtomMdQ>;
  static_assert(kBlockM % (16 * kAtomMSdP) == 0 && kBlockN % (8 * (kNWarps / kAtomMSdP)) == 0);
  // The dropout kernels' S and dP tiling: runs of 32 or 16 columns per warp (d32-d96;
  // d128, d160, d224); the d192 and d256 tiles hold 8 columns per warp (4 warps along
  // 32 keys), where each call is made for a quarter unit and the tiling stays plain.
  using DropoutSdP =
      DropoutSdPTiling<TiledMmaSdP, MMA_Atom<SM75_16x8x8_F32F16F16F32_TN>, kAtomMSdP, kNWarps / kAtomMSdP,
                       kBlockN, 8>;
  static constexpr int kDropoutGroupRun = DropoutSdP::kGroupRun;
  static constexpr bool kDropoutLaneUnits = true;
  using TiledMmaSdPDropout = typename DropoutSdP::TiledMma;
  static_assert(kBlockN % (16 * kAtomNdKV) == 0 && kHeadDim % (8 * (kNWarps / kAtomNdKV)) == 0);
  static_assert(kBlockM % (16 * kAtomMdQ) == 0 && kHeadDim % (8 * (kNWarps / kAtomMdQ)) == 0);

  // No cp.async: 16-byte loads into registers, then 16-byte shared stores.
  static constexpr bool kCopyZeroFills = false;
  static constexpr bool kRegisterPrefetch = kRegisterPrefetch_;  // the next Q/dO through registers
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element_>{},
                                                    typename Base::GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));

  using SmemCopyAtom = Copy_Atom<SM75_U32x2_LDSM_N, Element_>;
  using SmemCopyAtomB = Copy_Atom<SM75_U32x1_LDSM_N, Element_>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x4_LDSM_T, Element_>;
  using SmemCopyAtomTransposedB = Copy_Atom<SM75_U16x2_LDSM_T, Element_>;
};

}  // namespace flashattn
