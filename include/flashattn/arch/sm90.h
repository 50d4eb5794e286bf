// Traits of the sm90 family (Hopper, compute capability 9.0 exactly): warpgroup
// MMAs (wgmma) that read their operands from shared memory through descriptors,
// 64 query rows per warpgroup. Everything else (loads, masks, softmax, epilogue)
// is the sm80 family's. wgmma exists only in sm_90a code, which runs on cc 9.0
// alone: newer GPUs run the sm80 family.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "flashattn/arch/sm80.h"

namespace flashattn {

using namespace cute;

// Accumulator facts of a 64xN wgmma: warp w of the warpgroup holds rows 16w..16w+15,
// laid out within the warp as an m16n8 mma.sync tile repeated along N. So row
// reductions, the dropout units and the P fragment are those of the sm80 family.
struct Sm90AccumulatorLayout {
  static constexpr unsigned kRowShuffleMask = 0x3;
  static constexpr int kPairedRowStride = 8;
  static constexpr unsigned kUnitLanes = 0x3;
  // A warp holds its rows' columns in runs of 32 or more (N of a wgmma, in the
  // forward's and the backward's S tiles alike), so each lane's dropout unit is
  // its own 16 elements of a row pair in 32 columns: no words cross lanes
  // (kernel/dropout.h).
  static constexpr bool kDropoutLaneUnits = true;

  // ((2, 2, N/8), MMA_M, MMA_N) -> ((2, MMA_M), (2, N/8, MMA_N)): rows, columns.
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto rowcol(Layout acc) {
    static_assert(decltype(rank<0>(acc))::value == 3);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
  }

  // The C fragment of S is the register A operand of P . V (k-steps of 16 keys):
  // ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, N/16 * MMA_N).
  template <typename Layout>
  CUTE_HOST_DEVICE static constexpr auto c_to_a(Layout acc) {
    auto l = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(acc),
                       coalesce(make_layout(get<2, 1>(l), get<2>(acc))));
  }
};

// A 16-byte load from shared memory by its shared-window address: the
// forward's read of its staged output, which the compiler otherwise emits as a
// generic load (it cannot tell the tile's address space through the kernel's
// storage struct).
struct SharedLoad128 {
  using SRegisters = uint128_t[1];
  using DRegisters = uint128_t[1];
  CUTE_DEVICE static void copy(uint128_t const& src, uint128_t& dst) {
    const uint32_t address = cast_smem_ptr_to_uint(&src);
    uint32_t* d = reinterpret_cast<uint32_t*>(&dst);
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(address));
  }
};

}  // namespace flashattn

namespace cute {
template <>
struct Copy_Traits<flashattn::SharedLoad128> {
  using ThrID = Layout<_1>;
  using SrcLayout = Layout<Shape<_1, _128>>;
  using DstLayout = Layout<Shape<_1, _128>>;
  using RefLayout = SrcLayout;
};
}  // namespace cute

namespace flashattn {

// `setmaxnreg` moves registers within what the CTA got at launch: with
// __launch_bounds__(threads, 1) that is 64 K / threads per thread, rounded down
// to a multiple of 8. A split asking for more makes the consumers' allocation
// wait forever.
constexpr bool register_split_fits(int producer_threads, int producer_regs, int consumer_threads,
                                   int consumer_regs) {
  const int threads = producer_threads + consumer_threads;
  return producer_regs * producer_threads + consumer_regs * consumer_threads <= (64 * 1024 / threads) / 8 * 8 * threads;
}

// K-major shared-memory atom for rows of kCols elements: the 128-byte swizzle
// where the head dim is a multiple of 64, else the 64-byte one (multiples of 32).
template <typename Element, int kCols>
using Sm90SmemAtomK = std::conditional_t<kCols % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                         GMMA::Layout_K_SW64_Atom<Element>>;

// A TMA load of q, k, v, dO through a (rows, head dim, heads, batch) view: a
// tile is a box of kRows x the bucket's head dim, and rows or columns outside
// the view land as zeros (launch/tma_sm90.h makes the descriptors).
using GmemLayoutRows = Layout<Shape<int, int, int, int>, Stride<int64_t, _1, int64_t, int64_t>>;
template <typename Element, int kHeadDim, int kRows, typename SmemLayout>
using TmaRows = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                       make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayoutRows{}),
                                       SmemLayout{}, Shape<Int<kRows>, Int<kHeadDim>>{}, _1{}));

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_>
struct Sm90FwdTraits : Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, 4 * (kBlockM_ / 64)>,
                       Sm90AccumulatorLayout {
  using Base = Sm80FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, 4 * (kBlockM_ / 64)>;
  static constexpr const char* kFamily = "sm90";
  using Element = Element_;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNWarps, Base::kNThreads;
  using Sm90AccumulatorLayout::kRowShuffleMask, Sm90AccumulatorLayout::kPairedRowStride,
      Sm90AccumulatorLayout::kUnitLanes, Sm90AccumulatorLayout::kDropoutLaneUnits, Sm90AccumulatorLayout::rowcol,
      Sm90AccumulatorLayout::c_to_a;
  static_assert(kBlockM % 64 == 0, "a warpgroup computes 64 query rows");

  // The products read their operands straight from shared memory (wgmma).
  static constexpr bool kWgmma = true;
  // S = Q K^T: both operands in shared memory, K-major.
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, _16>>(),
      Layout<Shape<Int<kBlockM / 64>, _1, _1>>{}));
  // O += P V: P from registers, V in shared memory seen as (head dim, keys).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, _16>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kBlockM / 64>, _1, _1>>{}));

  using SmemLayoutAtom = Sm90SmemAtomK<Element, kHeadDim>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = SmemLayoutVt;  // unused: wgmma reads the swizzled layout
  using SmemLayoutO = SmemLayoutQ;
};

// The warp-specialised forward (kernel/fwd_sm90.h): the traits above for the
// consumer warpgroups (one per 64 query rows), plus one producer warpgroup, of
// which one thread issues the TMA loads of Q and of K and V into kStages stages.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_ = 2>
struct Sm90FwdWsTraits : Sm90FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_> {
  using Base = Sm90FwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_>;
  using Element = Element_;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumerThreads = Base::kNThreads;  // GmemTiledCopyO: O, by the consumers
  static constexpr int kProducerThreads = 128;
  static constexpr int kCtaThreads = kProducerThreads + kConsumerThreads;
  static constexpr int kConsumerWarpgroups = kConsumerThreads / 128;
  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3);
  // The softmax under P V above d128 too needs 240 registers per consumer thread
  // (at 224 the d256 loop spilled 100 B; at 240 no d160-d256 kernel spills, the
  // producer's 24 included). +3-4% forward at d256, 1k-2k tokens (H100).
  static constexpr bool kWideOverlap = kHeadDim > 128 && kConsumerWarpgroups == 2;
  // Registers per thread after `setmaxnreg` (multiples of 8, within what the
  // CTA got at launch). Two consumer warpgroups: 40 / 232 measured no faster
  // than 56 / 224 (24 spilled the producer's tile state before it loaded by
  // TMA; the d160-d256 kernels at 24 do not). Three (192 rows): the CTA gets
  // 128 per thread, 32 / 160 uses them all.
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : kWideOverlap ? 24 : 56;
  static constexpr int kConsumerRegisters =
      kConsumerWarpgroups == 1 ? 256 : kConsumerWarpgroups == 2 ? (kWideOverlap ? 240 : 224) : 160;
  static_assert(register_split_fits(kProducerThreads, kProducerRegisters, kConsumerThreads, kConsumerRegisters));
  // The softmax of key block n - 1 runs while P V of block n multiplies: S and
  // P live at once, which fits the consumers' registers up to d128 with two
  // consumer warpgroups (the d256 tile spilled 100 B in its loop at 224, three
  // warpgroups' 160 registers spilled in the d64 loop). +4.5% forward at d128
  // on an H100. Three warpgroups overlap one's softmax with the others' products.
  static constexpr bool kOverlapSoftmax = (kHeadDim <= 128 || kWideOverlap) && kConsumerWarpgroups < 3;
  // A consumer warpgroup whose rows all lie past the sequence's end skips the
  // tile's products (kernel/fwd_sm90.h). Three warpgroups only: 512 or 1k tokens
  // in 192-row tiles leave one or two such warpgroups per sequence. On at every
  // tile it cost 3-8% on dense shapes and won 4% on varlen batches of short
  // sequences (H100, docs/perf-notes.md).
  static constexpr bool kSkipRowlessWarpgroups = kConsumerWarpgroups == 3;
  // The output's epilogue: the accumulators into shared memory by stmatrix
  // (16 bytes per thread and instruction, where element-wise copies store 4),
  // read back by explicit shared loads, then 16-byte global stores.
  using SmemCopyAtomOut = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  using SmemLoadAtomOut = Copy_Atom<SharedLoad128, Element>;
  // Shared -> global for one warpgroup's 64 rows of O (its 128 threads).
  using GmemTiledCopyOWarpgroup = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{},
      Layout<Shape<Int<128 / Base::kGmemThreadsPerRow>, Int<Base::kGmemThreadsPerRow>>,
             Stride<Int<Base::kGmemThreadsPerRow>, _1>>{},
      Layout<Shape<_1, _8>>{}));
  // Q stages: two where a second Q tile fits beside the K and V stages and the
  // output's own tile (d <= 128): the next tile's Q loads while this one runs
  // (+1-3% at 512-2k tokens, H100). Else one, loaded after the tile's first K
  // once the last tile's S (or, staged in Q's place, its output) is done with it.
  // -DFLASHATTN_SM90_Q_STAGES=1 builds one everywhere, to compare.
#if defined(FLASHATTN_SM90_Q_STAGES)
  static constexpr int kQStagesWanted = FLASHATTN_SM90_Q_STAGES;
#else
  static constexpr int kQStagesWanted = 2;
#endif
  static constexpr int kQStages =
      ((kQStagesWanted + 1) * kBlockM + 2 * kStages * kBlockN) * kHeadDim * int(sizeof(Element)) + 2048 <=
              Base::kMaxSmemBytes
          ? kQStagesWanted
          : 1;
  // Stages filled by TMA: the full barrier counts the bytes that landed.
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;

  // Q, K and V are read through TMA descriptors (TmaRows).
  using TmaQ = TmaRows<Element, kHeadDim, kBlockM, typename Base::SmemLayoutQ>;
  using TmaKV = TmaRows<Element, kHeadDim, kBlockN, typename Base::SmemLayoutKV>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);
};

// sm90 backward (the warp-specialised kernel/bwd_sm90.h, traits below): the
// key-stationary backward's five products as SS wgmmas (kernel/bwd.h's
// smem_product), both operands read from shared memory through descriptors; P and
// dS go through shared memory as in the other families. Every
// tile is laid out in GMMA's K-major swizzle atoms, so that the transposed views
// the dV, dK and dQ products read (P^T, dS^T, dO^T, Q^T, K^T) are GMMA's MN-major
// operands of the same bytes. kWarpGroups warpgroups; kAtom*: the warpgroups along
// a product's output rows (a warpgroup computes 64 of them), the rest along its
// columns:
//   S = Q K^T, dP = dO V^T  (M x N)   A, B K-major
//   dV += P^T dO, dK += dS^T Q (N x D) A, B MN-major
//   dQ = dS K                  (M x D) A K-major, B MN-major
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpGroups, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ, bool kDoubleBufferQ_>
struct Sm90BwdTraits : Sm90AccumulatorLayout,
                       BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, 4 * kWarpGroups, kDoubleBufferQ_> {
  using Base = BwdTileLayouts<Element_, kHeadDim_, kBlockM_, kBlockN_, 4 * kWarpGroups, kDoubleBufferQ_>;
  static constexpr const char* kFamily = "sm90";
  using Element = Element_;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNThreads;
  static constexpr bool kWgmma = true;

  template <int kRows, int kCols, int kAtomRows, GMMA::Major kMajorA, GMMA::Major kMajorB>
  using WarpGroupTiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kCols / (kWarpGroups / kAtomRows)>, _16>, kMajorA, kMajorB>(),
      Layout<Shape<Int<kAtomRows>, Int<kWarpGroups / kAtomRows>, _1>>{}));
  static_assert(kBlockM == 64 * kAtomMSdP && kBlockN == 64 * kAtomNdKV && kBlockM == 64 * kAtomMdQ,
                "each warpgroup computes 64 rows of every product");
  using TiledMmaSdP = WarpGroupTiledMma<kBlockM, kBlockN, kAtomMSdP, GMMA::Major::K, GMMA::Major::K>;
  using TiledMmadKV = WarpGroupTiledMma<kBlockN, kHeadDim, kAtomNdKV, GMMA::Major::MN, GMMA::Major::MN>;
  using TiledMmadQ = WarpGroupTiledMma<kBlockM, kHeadDim, kAtomMdQ, GMMA::Major::K, GMMA::Major::MN>;

  // The two warpgroups' MN-major views of Q^T, dO^T (dK, dV at 64 keys) and K^T
  // (dQ) start half a head dim apart: the swizzle atom must divide d / 2, so that
  // each view starts at a whole atom.
  using SmemAtomQKV = std::conditional_t<
      (kHeadDim / 2) % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
      std::conditional_t<(kHeadDim / 2) % 32 == 0, GMMA::Layout_K_SW64_Atom<Element>, GMMA::Layout_K_SW32_Atom<Element>>>;
  using SmemLayoutQdO = decltype(tile_to_shape(SmemAtomQKV{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtomQKV{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(Sm90SmemAtomK<Element, kBlockN>{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutQdOt = decltype(composition(
      SmemLayoutQdO{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutPdSt = decltype(composition(
      SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));

  // Keys as the rows of S and dP (kernel/bwd_sm90.h): S^T = K Q^T and dP^T = V dO^T,
  // where each warpgroup's rows are its own 64 keys, those of its dK and dV
  // rows. Its P^T and dS^T are then in registers in the layout of the A operand
  // of dV += P^T dO and dK += dS^T Q; only dS^T goes through shared memory (keys
  // as rows, queries contiguous), read by dQ = dS K as an MN-major A operand.
  // Two warpgroups that split the keys of dK and dV (d <= 128).
  static constexpr bool kKeysAsRowsFits = kWarpGroups == 2 && kAtomNdKV == 2;
  using TiledMmaSdPt = WarpGroupTiledMma<kBlockN, kBlockM, kAtomNdKV, GMMA::Major::K, GMMA::Major::K>;
  using TiledMmadKVFromRegisters = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / (kWarpGroups / kAtomNdKV)>, _16>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<kAtomNdKV>, Int<kWarpGroups / kAtomNdKV>, _1>>{}));
  using TiledMmadQFromKeyRows = WarpGroupTiledMma<kBlockM, kHeadDim, kAtomMdQ, GMMA::Major::MN, GMMA::Major::MN>;
  using SmemLayoutdSKeyRows =
      decltype(tile_to_shape(Sm90SmemAtomK<Element, kBlockM>{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));  // (N, M)
  using SmemLayoutdSKeyRowsT = decltype(composition(
      SmemLayoutdSKeyRows{}, make_layout(Shape<Int<kBlockM>, Int<kBlockN>>{}, GenRowMajor{})));  // (M, N)

  // P and dS (dS^T) into shared memory by stmatrix, 16 bytes per thread and
  // instruction into the swizzled tile: element-wise copies became generic 4-byte
  // stores, each behind 64-bit address arithmetic (the compiler cannot tell the
  // tile is in shared memory). The epilogues' dK, dV and dQ the same way, read back
  // by explicit shared loads (kernel/bwd.h StagingAtoms).
  using SmemCopyAtomPdS = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  using SmemCopyAtomOut = SmemCopyAtomPdS;
  using SmemLoadAtomOut = Copy_Atom<SharedLoad128, Element>;

  static constexpr bool kCopyZeroFills = true;
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{}, typename Base::GmemLayoutAtom{},
      Layout<Shape<_1, _8>>{}));
};

// The warp-specialised backward (kernel/bwd_sm90.h): the traits above for the
// consumer warpgroups, plus one producer warpgroup that copies Q, dO, lse and D
// of each (query head, query block) into kStages shared-memory stages. P and dS
// are double-buffered, so the consumers meet once per iteration.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarpGroups, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ>
struct Sm90BwdWsTraits
    : Sm90BwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kWarpGroups, kAtomMSdP, kAtomNdKV, kAtomMdQ, false> {
  using Base = Sm90BwdTraits<Element_, kHeadDim_, kBlockM_, kBlockN_, kWarpGroups, kAtomMSdP, kAtomNdKV, kAtomMdQ, false>;
  using Element = Element_;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDim, Base::kNThreads;
  static constexpr int kStages = 2;
  static constexpr int kPdSBuffers = 2;
  static constexpr int kConsumerThreads = kNThreads;  // every product, P, dS, dQ, dK, dV
  static constexpr int kProducerThreads = 128;
  static constexpr int kCtaThreads = kProducerThreads + kConsumerThreads;
  // Registers per thread after `setmaxnreg`: the consumers hold dK and dV, S and
  // dP (or dQ) at once.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(register_split_fits(kProducerThreads, kProducerRegisters, kConsumerThreads, kConsumerRegisters));
  // Stages filled by TMA (Q and dO; lse and D by the producer warp's lanes).
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using TmaQdO = TmaRows<Element, kHeadDim, kBlockM, typename Base::SmemLayoutQdO>;
  static constexpr uint32_t kQdOBytes = kBlockM * kHeadDim * sizeof(Element);
};

}  // namespace flashattn
