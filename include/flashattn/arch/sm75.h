// Traits of the sm75 family (Turing: T4, RTX 20xx): SM75 16x8x8 mma atoms and
// ldmatrix like Ampere, but no cp.async (global->shared copies go through
// registers) and at most 64 KB of shared memory per CTA. fp16 only.
#pragma once

#include "flashattn/arch/sm80.h"

namespace flashattn {

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_>
struct Sm75FwdTraits : Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_> {
  using Base = Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kNWarps_>;
  static constexpr const char* kFamily = "sm75";
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t>, "Turing tensor cores take fp16 only");
  static_assert(Base::kSmemSize <= 64 * 1024, "a Turing CTA has at most 64 KB of shared memory");

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
  using SmemCopyAtom = Copy_Atom<SM75_U32x2_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x4_LDSM_T, Element>;
  // No cp.async: 16-byte loads into registers, then 16-byte shared stores.
  static constexpr bool kCopyZeroFills = false;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{},
                                                    typename Base::GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
};

}  // namespace flashattn
