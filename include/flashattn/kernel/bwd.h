// The FlashAttention-2 backward pass, written once for every kernel family.
//
//   1. bwd_preprocess_kernel: D = rowsum(dO * O) per query row (fp32); zeroes
//      the fp32 dQ accumulator and, in deterministic mode, its semaphores.
//   2. bwd_kernel: one CTA per (key block, kv head, batch) keeps K, V and the
//      dK, dV accumulators on chip and walks every query block of every query
//      head of its GQA group that sees its keys, recomputing P from Q, K and the
//      forward's lse:
//        S = Q K^T, P = exp(S * scale - lse), dP = dO V^T, dS = P (dP - D),
//        dV += P^T dO, dK += dS^T Q, dQ += dS K (fp32 vector reductions into a
//        scratch accumulator, utils.h's scratch_add).
//      dK and dV come out at (b, s_k, h_k, d): GQA groups are summed on chip.
//      With dropout (mask Z, kernel/dropout.h, regenerated): dV += (P Z)^T dO and
//      dS = P (Z dP / (1 - p) - D), dV scaled by 1 / (1 - p) at the end.
//   3. bwd_convert_dq_kernel: dq = dq_accum * softmax_scale in the input dtype.
// Runtime flags cover masks, tails, GQA and deterministic mode; the template flag
// kScoreMods (softcap, ALiBi) is the forward's.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <type_traits>

#include "flashattn/kernel/dropout.h"
#include "flashattn/kernel/mask.h"
#include "flashattn/kernel/seqlen.h"
#include "flashattn/kernel/shared_storage.h"
#include "flashattn/kernel/tile_scheduler.h"
#include "flashattn/kernel/utils.h"
#include "flashattn/kernel/wgmma.h"
#include "flashattn/params.h"

namespace flashattn {

using namespace cute;

// The preprocess kernel: one CTA per (128-row block, head, sequence), scheduled
// like the forward's query blocks; 8 threads per row, 32 rows at a time.
struct BwdRows {
  static constexpr int kBlock = kBwdSeqlenQRounding, kThreads = 256, kThreadsPerRow = 8;
  static constexpr int kRows = kThreads / kThreadsPerRow;
  using Scheduler = QueryTileScheduler<kBlock>;
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(BwdRows::kThreads) bwd_preprocess_kernel(const BwdParams p) {
  using R = BwdRows;
  const R::Scheduler tile(p);
  const SeqlenInfo seq(p, tile.batch);
  const int block = tile.m_block;
  if (block * R::kBlock >= seq.seqlen_q) return;
  const int part = threadIdx.x % R::kThreadsPerRow;
  const index_t ws_row0 = seq.workspace_row(p, tile.batch, tile.head);
  const Element* o = static_cast<const Element*>(p.out) + seq.q_offset(p.out_batch_stride, p.out_row_stride, tile.batch) +
                     tile.head * p.out_head_stride;
  const Element* d_o = static_cast<const Element*>(p.dout) +
                       seq.q_offset(p.dout_batch_stride, p.dout_row_stride, tile.batch) + tile.head * p.dout_head_stride;
  // Every row of the block's whole query tiles: past the sequence's end the dq
  // accumulator is zeroed too (the backward adds whole tiles into it) and D = 0.
  // A thread's rows go in groups whose loads of O and dO (8 16-byte vectors a
  // thread) are all issued before the first is used.
  using Vec = cutlass::Array<Element, 8>;
  constexpr int kVecs = (kHeadDim / 8 + R::kThreadsPerRow - 1) / R::kThreadsPerRow;  // a row's vectors per thread
  constexpr int kGroupRows = kVecs >= 4 ? 1 : 4 / kVecs;
  constexpr int kRowsPerThread = R::kBlock / R::kRows;
  static_assert(kRowsPerThread % kGroupRows == 0);
  CUTE_UNROLL
  for (int g = 0; g < kRowsPerThread; g += kGroupRows) {
    Vec a[kGroupRows][kVecs], b[kGroupRows][kVecs];
    CUTE_UNROLL
    for (int r = 0; r < kGroupRows; ++r) {
      const int row = block * R::kBlock + threadIdx.x / R::kThreadsPerRow + (g + r) * R::kRows;
      CUTE_UNROLL
      for (int v = 0; v < kVecs; ++v) {
        const int c = (part + v * R::kThreadsPerRow) * 8;
        if (row < seq.seqlen_q && c < p.head_dim) {
          a[r][v] = *reinterpret_cast<const Vec*>(o + row * p.out_row_stride + c);
          b[r][v] = *reinterpret_cast<const Vec*>(d_o + row * p.dout_row_stride + c);
        } else {
          a[r][v].clear();
          b[r][v].clear();
        }
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kGroupRows; ++r) {
      const int row = block * R::kBlock + threadIdx.x / R::kThreadsPerRow + (g + r) * R::kRows;
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + (ws_row0 + row) * kHeadDim);
      CUTE_UNROLL
      for (int v = part; v < kHeadDim / 4; v += R::kThreadsPerRow) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
      float dot = 0.f;
      CUTE_UNROLL
      for (int v = 0; v < kVecs; ++v) {
        CUTE_UNROLL
        for (int i = 0; i < 8; ++i) dot = fmaf(float(a[r][v][i]), float(b[r][v][i]), dot);
      }
      dot = lane_allreduce<R::kThreadsPerRow - 1>(dot, [](float x, float y) { return x + y; });
      // With dropout, D (1 - p): p_and_ds makes dS (1 - p).
      if (part == 0) p.softmax_d[ws_row0 + row] = dot * (1.f - p.dropout_p);
    }
  }
}

// The copies that stage an accumulator tile (dQ, dK, dV) through shared memory
// for 16-byte global stores: the family's own where it names them (sm90: stmatrix
// and explicit shared loads, which element-wise copies through a pointer of
// unknown address space are not), else SmemCopyAtomO and the global copy's load.
template <typename Traits, typename = void>
struct StagingAtoms {
  using Store = typename Traits::SmemCopyAtomO;
  using Load = void;
};
template <typename Traits>
struct StagingAtoms<Traits, std::void_t<typename Traits::SmemLoadAtomOut>> {
  using Store = typename Traits::SmemCopyAtomOut;
  using Load = typename Traits::SmemLoadAtomOut;
};

// dq = dq_accum * softmax_scale for one (query block, head, batch): the
// accumulator tile is read back in the dQ product's fragment layout, then goes
// through shared memory for 16-byte stores.
template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads) bwd_convert_dq_kernel(const BwdParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(128) char smem[];
  const int tidx = threadIdx.x;
  const QueryTileScheduler<kBlockM> tile(params);
  const SeqlenInfo seq(params, tile.batch);
  const int m_block = tile.m_block;
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;

  typename Traits::TiledMmadQ mma_dq;
  Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_D)
  scratch_load<Traits::kNThreads>(
      params.dq_accum + (seq.workspace_row(params, tile.batch, tile.head) + m0) * kHeadDim, acc_dq, tidx);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) acc_dq(i) *= params.softmax_scale * params.dropout_scale;  // dS (1 - p)
  auto& storage = *reinterpret_cast<ConvertDqSharedStorage<Traits>*>(smem);
  Tensor sdQ = make_tensor(make_smem_ptr(storage.dq.data()), typename Traits::SmemLayoutQdO{});  // (M, d)
  Tensor gdQ = make_tensor(
      make_gmem_ptr(static_cast<Element*>(params.dq) + seq.q_offset(params.dq_batch_stride, params.dq_row_stride, tile.batch) +
                    tile.head * params.dq_head_stride + index_t(m0) * params.dq_row_stride),
      make_layout(make_shape(Int<kBlockM>{}, Int<kHeadDim>{}), make_stride(params.dq_row_stride, _1{})));  // (M, d)
  using Staging = StagingAtoms<Traits>;
  store_through_smem<typename Traits::GmemTiledCopyO, typename Staging::Store>(
      acc_dq, mma_dq, sdQ, gdQ, seq.seqlen_q - m0, params.head_dim, tidx, NoRowOffset{}, SyncThreads{},
      static_cast<typename Staging::Load*>(nullptr));
}

// Deterministic dQ: the CTAs adding into one query block take turns in
// key-block order. A CTA only waits for CTAs with smaller block indices, which
// the hardware started before it, so the wait always ends. `leader` spins, `sync`
// is the barrier of the threads that add (the whole CTA, or the consumer
// warpgroups of a warp-specialised kernel).
template <typename Sync>
__device__ __forceinline__ void wait_for_turn(const int* semaphore, int turn, bool leader, const Sync& sync) {
  if (leader) {
    int seen;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(semaphore) : "memory");
    } while (seen != turn);
  }
  sync();
}

template <typename Sync>
__device__ __forceinline__ void end_turn(int* semaphore, bool leader, const Sync& sync) {
  __threadfence();  // this thread's additions are visible before the next CTA's
  sync();
  if (leader) atomicAdd(semaphore, 1);
}

// dQ of one (query head, query block) added into the fp32 accumulator, in
// scratch_add's coalesced layout; in deterministic mode in key-block order.
// tidx: 0 .. kNThreads - 1 over the threads that add, `sync` their barrier.
template <typename Traits, typename Acc, typename Sync>
__device__ __forceinline__ void add_dq(const BwdParams& params, const AttentionMask& mask, index_t ws_row0, int m0,
                                       int n_block, const Acc& acc_dq, int tidx, const Sync& sync) {
  // One semaphore per query block: its first workspace row / 16 (query
  // blocks of >= 16 rows, sequences apart by >= 16 rows: params.h).
  int* semaphore =
      params.dq_semaphore == nullptr ? nullptr : params.dq_semaphore + (ws_row0 + m0) / kBwdSemaphoreRows;
  if (semaphore != nullptr) {
    int n_first, n_last;
    mask.key_block_range(m0, Traits::kBlockM, Traits::kBlockN, n_first, n_last);
    wait_for_turn(semaphore, n_block - n_first, tidx == 0, sync);
  }
  scratch_add<Traits::kNThreads>(params.dq_accum + (ws_row0 + m0) * Traits::kHeadDim, acc_dq, tidx);
  if (semaphore != nullptr) end_turn(semaphore, tidx == 0, sync);
}

// The softmax statistics of a tile's queries, by element (r, c) of a thread's
// (rows, cols) accumulator view: lse in log2 units as hi + lo (+inf past the
// sequence's end: P = 0 there) and D. Queries as rows: one of each per row, in
// registers (the sm90 backward's keys-as-rows tile has its own, by column).
template <int kRows>
struct RowStats {
  float hi[kRows], lo[kRows], d[kRows];
  __device__ __forceinline__ float lse_hi(int r, int) const { return hi[r]; }
  __device__ __forceinline__ float lse_lo(int r, int) const { return lo[r]; }
  __device__ __forceinline__ float d_of(int r, int) const { return d[r]; }
};

// P and dS of one tile, in place: acc_s holds S = Q K^T and becomes P = exp2(S *
// scale_log2 - lse_log2) (masked to 0; times the dropout mask Z), acc_dp holds
// dP = dO V^T and becomes dS = P (dP - D) (with dropout P (Z dP / (1 - p) - D)).
// Under wgmma dP may still be in flight: it is waited for after P's exponentials.
// stats: lse and D of each element's query (RowStats). The coordinates give
// each element's (query, key) in the tile, whichever of them its rows are.
// keep_words: the tile's dropout masks made beforehand (make_keep_words's words,
// or an object whose kept(r, c) tells), or nullptr to make them here.
template <typename Traits, bool kScoreMods, bool kDropout, typename Stats, typename Acc, typename Coords,
          typename CoordsRc, typename KeepWords = std::nullptr_t>
__device__ __forceinline__ void p_and_ds(Acc& acc_s, Acc& acc_dp, const Stats& stats,
                                         const BwdParams& params, const AttentionMask& mask, const Coords& tScS,
                                         const Coords& tScS0, const CoordsRc& tScS_rc, const CoordsRc& tScS0_rc,
                                         int batch, int head, int m0, int n0, const KeepWords& keep_words = nullptr) {
  const float softcap = params.softcap;
  auto dcap = make_tensor_like(acc_s);  // d(softcap(x))/dx, kScoreMods only
  if constexpr (kScoreMods) {
    if (softcap > 0.f) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const float t = tanh_exp2(acc_s(i) * params.softcap_prescale);
        acc_s(i) = softcap * t;
        dcap(i) = 1.f - t * t;
      }
    }
    if (params.alibi_slopes != nullptr) {
      const float slope = params.alibi_slopes[batch * params.alibi_batch_stride + head] / params.score_scale;
      mask.add_alibi(acc_s, tScS, tScS0, m0, n0, slope);
    }
  }
  Tensor s_rc = make_tensor(acc_s.data(), Traits::rowcol(acc_s.layout()));
  Tensor dp_rc = make_tensor(acc_dp.data(), Traits::rowcol(acc_dp.layout()));
  constexpr int kRows = decltype(size<0>(s_rc))::value;
  const float scale_log2 = params.score_scale_log2;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c)
      s_rc(r, c) = fmaf(s_rc(r, c), scale_log2, -stats.lse_hi(r, c)) - stats.lse_lo(r, c);
  }
  // Masked after scaling, so that a zero softmax_scale cannot turn -inf into NaN.
  if (mask.tile_needs_mask(m0, Traits::kBlockM, n0, Traits::kBlockN)) mask.apply(acc_s, tScS, tScS0, m0, n0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) acc_s(i) = exp2f(acc_s(i));
  products_wait<Traits, 0>(acc_dp);
  if constexpr (kDropout) {
    // P Z for dV; dS = P (Z dP / (1 - p) - D), made as dS (1 - p) = (P Z) dP - P D (1 - p):
    // the preprocess scaled D by 1 - p, and dK and dQ are scaled back. A select, a
    // product and an fma per element (two more products before).
    auto apply_one = [&](int r, int c, bool kept) {
      const float p = s_rc(r, c);
      const float kept_p = kept ? p : 0.f;
      dp_rc(r, c) = fmaf(kept_p, dp_rc(r, c), -p * stats.d_of(r, c));
      s_rc(r, c) = kept_p;
    };
    auto apply = [&](int r, int c, uint32_t keep) {
      apply_one(r, c, keep & 1u);
      apply_one(r, c + 1, (keep >> 16) & 1u);
    };
    if constexpr (std::is_same_v<KeepWords, std::nullptr_t>) {
      const Dropout<Traits> drop(params, batch, head);
      drop.for_each_mask(tScS_rc, tScS0_rc, m0, n0, apply);
    } else if constexpr (!std::is_array_v<KeepWords>) {  // an element's bit: keep_words.kept(r, c)
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) apply_one(r, c, keep_words.kept(r, c));
      }
    } else {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s_rc); c += 2) apply(r, c, keep_words[r][c / 2]);
      }
    }
  } else {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s_rc); ++c) dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - stats.d_of(r, c));
    }
  }
  if constexpr (kScoreMods) {
    if (softcap > 0.f) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dp); ++i) acc_dp(i) *= dcap(i);
    }
  }
}

// The dropout masks of the tile at (m0, n0) of query head `head`, as p_and_ds
// applies them: words[r][c / 2] is for_each_mask's word of elements (r, c), (r,
// c + 1) of the (rows, cols) view. Made ahead, where the tensor cores are busy
// with products that do not need them.
template <typename Traits, int kRows, int kPairs, typename CoordsRc>
__device__ __forceinline__ void make_keep_words(uint32_t (&words)[kRows][kPairs], const BwdParams& params,
                                                const CoordsRc& tScS_rc, const CoordsRc& tScS0_rc, int batch,
                                                int head, int m0, int n0) {
  const Dropout<Traits> drop(params, batch, head);
  drop.for_each_mask(tScS_rc, tScS0_rc, m0, n0, [&](int r, int c, uint32_t keep) { words[r][c / 2] = keep; });
}

// Epilogue: dK (scaled: S was Q K^T unscaled) and dV of the key block at n0
// through shared memory sdK, sdV (tiles of SmemLayoutKV, nobody reading them:
// the caller's barrier) for 16-byte stores.
template <typename Traits, bool kDropout, typename Acc, typename TiledMma, typename SmemTile, typename Sync>
__device__ __forceinline__ void store_dk_dv(Acc& acc_dk, Acc& acc_dv, TiledMma mma_dkv, SmemTile& sdK, SmemTile& sdV,
                                            const BwdParams& params, const SeqlenInfo& seq, int batch, int head_k,
                                            int n0, int tidx, const Sync& sync) {
  using Element = typename Traits::Element;
  // With dropout, dS (1 - p) (p_and_ds).
  const float dk_scale = kDropout ? params.softmax_scale * params.dropout_scale : params.softmax_scale;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= dk_scale;
  if constexpr (kDropout) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dv); ++i) acc_dv(i) *= params.dropout_scale;
  }
  auto out_tile = [&](void* base, index_t offset, index_t row_stride) {
    return make_tensor(make_gmem_ptr(static_cast<Element*>(base) + offset),
                       make_layout(make_shape(Int<Traits::kBlockN>{}, Int<Traits::kHeadDim>{}),
                                   make_stride(row_stride, _1{})));
  };
  Tensor gdK = out_tile(params.dk, seq.k_offset(params.dk_batch_stride, params.dk_row_stride, batch) +
                                       head_k * params.dk_head_stride + n0 * params.dk_row_stride,
                        params.dk_row_stride);  // (N, d)
  Tensor gdV = out_tile(params.dv, seq.k_offset(params.dv_batch_stride, params.dv_row_stride, batch) +
                                       head_k * params.dv_head_stride + n0 * params.dv_row_stride,
                        params.dv_row_stride);  // (N, d)
  using GmemCopyO = typename Traits::GmemTiledCopyO;
  using Staging = StagingAtoms<Traits>;
  using Load = typename Staging::Load;
  store_through_smem<GmemCopyO, typename Staging::Store>(acc_dk, mma_dkv, sdK, gdK, seq.seqlen_k - n0,
                                                         params.head_dim, tidx, NoRowOffset{}, sync,
                                                         static_cast<Load*>(nullptr));
  store_through_smem<GmemCopyO, typename Staging::Store>(acc_dv, mma_dkv, sdV, gdV, seq.seqlen_k - n0,
                                                         params.head_dim, tidx, NoRowOffset{}, sync,
                                                         static_cast<Load*>(nullptr));
}

// One product acc += A . B^T of the backward, both operands in shared memory:
// sA (rows, k) and sB (cols, k), transposed views where kTransposedA / B. The
// returned function takes acc and element offsets of A and B (the Q buffer).
// wgmma (kUsesWgmma) reads the operands through descriptors and returns at once:
// acc is ready after products_wait. The other families load the operands into
// registers with their copy atoms (ldmatrix; .trans for the transposed views)
// while the previous k-slice multiplies, and return with acc done.
// kZeroInit (wgmma only): acc = A . B^T, whatever acc held.
template <typename Traits, bool kTransposedA, bool kTransposedB, bool kZeroInit = false, typename TiledMma,
          typename SmemA, typename SmemB>
__device__ __forceinline__ auto smem_product(TiledMma tiled_mma, const SmemA& sA, const SmemB& sB, int tidx) {
  auto thr = tiled_mma.get_thread_slice(tidx);
  static_assert(!kZeroInit || kUsesWgmma<Traits>);
  if constexpr (kUsesWgmma<Traits>) {
    // Sliced at the thread, not at the warpgroup (warpgroup_slice, the forward's):
    // with uniform descriptors the long causal backwards (d128/d256, 4k-8k tokens)
    // ran 0.3-3% slower in six measures, non-causal 2k 1.6% faster in two, the
    // grid alike (H100, docs/perf-notes.md). Causal training shapes decide.
    return [tiled_mma, thr, sA, sB](auto& acc, int offset_a = 0, int offset_b = 0) mutable {
      Tensor a = thr.partition_fragment_A(make_tensor(sA.data() + offset_a, sA.layout()));
      Tensor b = thr.partition_fragment_B(make_tensor(sB.data() + offset_b, sB.layout()));
      wgmma_issue<kZeroInit>(tiled_mma, a, b, acc);
    };
  } else {
    using CopyAtomA = std::conditional_t<kTransposedA, typename Traits::SmemCopyAtomTransposed,
                                         typename Traits::SmemCopyAtom>;
    using CopyAtomB = std::conditional_t<kTransposedB, typename Traits::SmemCopyAtomTransposedB,
                                         typename Traits::SmemCopyAtomB>;
    auto copy_a = make_tiled_copy_A(CopyAtomA{}, tiled_mma);
    auto copy_b = make_tiled_copy_B(CopyAtomB{}, tiled_mma);
    // Register fragments take their shape from the views without the swizzle.
    auto unswizzled = [](const auto& s) { return make_tensor(s.data().get(), get_nonswizzle_portion(s.layout())); };
    return [tiled_mma, copy_a, copy_b, rA = thr.partition_fragment_A(unswizzled(sA)),
            rB = thr.partition_fragment_B(unswizzled(sB)), tAsA = copy_a.get_thread_slice(tidx).partition_S(sA),
            tBsB = copy_b.get_thread_slice(tidx).partition_S(sB)](auto& acc, int offset_a = 0,
                                                                 int offset_b = 0) mutable {
      gemm_smem_smem(acc, rA, rB, make_tensor(tAsA.data() + offset_a, tAsA.layout()),
                     make_tensor(tBsB.data() + offset_b, tBsB.layout()), tiled_mma, copy_a, copy_b);
    };
  }
}

// The S and dP products' tiling: Traits::TiledMmaSdPDropout in the dropout
// kernels where the family has one (the sm80 family's runs of columns for
// dropout's lane units), else TiledMmaSdP.
template <typename Traits, bool kDropout, typename = void>
struct SdPTiling {
  using type = typename Traits::TiledMmaSdP;
};
template <typename Traits>
struct SdPTiling<Traits, true, std::void_t<typename Traits::TiledMmaSdPDropout>> {
  using type = typename Traits::TiledMmaSdPDropout;
};

// kScoreMods: softcap and ALiBi; kDropout: dropout; template flags as in the forward.
template <typename Traits, bool kScoreMods, bool kDropout = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1) bwd_kernel(const BwdParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(128) char smem[];
  const int tidx = threadIdx.x;

  const KeyTileScheduler<kBlockN> tile(params);
  const int head_k = tile.head_k, batch = tile.batch;
  const SeqlenInfo seq(params, batch);
  const int n_block = tile.n_block;
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.seqlen_k) return;  // past the sequence's end: a spare slot of the varlen grid
  const int group = params.heads / params.heads_k;
  const int head0 = head_k * group;
  const int kv_head = head_k / params.kv_head_splits;  // of K and V (params.h)
  const AttentionMask mask(params, seq);
  int m_begin, m_end;
  mask.query_block_range(n0, kBlockN, kBlockM, m_begin, m_end);
  const int num_m = m_end - m_begin;
  const int num_iters = num_m * group;  // (query head, query block) pairs

  auto gmem_tile = [](const void* base, index_t offset, index_t row_stride, auto rows) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + offset),
                       make_layout(make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{})));
  };
  // K, V of this block; Q, dO of (head0, query block 0): the loop offsets them.
  Tensor gK = gmem_tile(params.k, seq.k_offset(params.k_batch_stride, params.k_row_stride, batch) +
                                      kv_head * params.k_head_stride + n0 * params.k_row_stride,
                        params.k_row_stride, Int<kBlockN>{});  // (N, d)
  Tensor gV = gmem_tile(params.v, seq.k_offset(params.v_batch_stride, params.v_row_stride, batch) +
                                      kv_head * params.v_head_stride + n0 * params.v_row_stride,
                        params.v_row_stride, Int<kBlockN>{});  // (N, d)
  Tensor gQ = gmem_tile(params.q, seq.q_offset(params.q_batch_stride, params.q_row_stride, batch) +
                                      head0 * params.q_head_stride,
                        params.q_row_stride, Int<kBlockM>{});  // (M, d)
  Tensor gdO = gmem_tile(params.dout, seq.q_offset(params.dout_batch_stride, params.dout_row_stride, batch) +
                                          head0 * params.dout_head_stride,
                         params.dout_row_stride, Int<kBlockM>{});  // (M, d)
  auto q_offset = [&](int head, int m_block) {
    return (head - head0) * params.q_head_stride + index_t(m_block) * kBlockM * params.q_row_stride;
  };
  auto do_offset = [&](int head, int m_block) {
    return (head - head0) * params.dout_head_stride + index_t(m_block) * kBlockM * params.dout_row_stride;
  };

  // Shared memory: Q (x2 when double-buffered), dO, K, V, P, dS.
  auto& storage = *reinterpret_cast<BwdSharedStorage<Traits>*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(storage.q[0].data()), typename Traits::SmemLayoutQdO{});  // (M, d), buffer 0
  Tensor sdO = make_tensor(make_smem_ptr(storage.d_o.data()), typename Traits::SmemLayoutQdO{});  // (M, d)
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKV{});      // (N, d)
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKV{});      // (N, d)
  Tensor sP = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutPdS{});     // (M, N)
  Tensor sdS = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPdS{});   // (M, N)
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQdOt{});     // (d, M)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQdOt{});   // (d, M)
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});       // (d, N)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});     // (N, M)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});   // (N, M)

  // Global -> shared copies, predicated on the head dim (columns) and tails (rows).
  typename Traits::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tidx);
  Tensor tQgQ = gmem_thr.partition_S(gQ);
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tdOgdO = gmem_thr.partition_S(gdO);
  Tensor tdOsdO = gmem_thr.partition_D(sdO);
  Tensor tKgK = gmem_thr.partition_S(gK);
  Tensor tKsK = gmem_thr.partition_D(sK);
  Tensor tVgV = gmem_thr.partition_S(gV);
  Tensor tVsV = gmem_thr.partition_D(sV);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKcK = gmem_thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  Tensor tQpQ = make_tensor<bool>(make_shape(size<2>(tQsQ)));
  Tensor tKpK = make_tensor<bool>(make_shape(size<2>(tKsK)));
  CUTE_UNROLL
  for (int k = 0; k < size(tQpQ); ++k) tQpQ(k) = get<1>(tQcQ(0, 0, k)) < params.head_dim;
  CUTE_UNROLL
  for (int k = 0; k < size(tKpK); ++k) tKpK(k) = get<1>(tKcK(0, 0, k)) < params.head_dim;
  // (CPY, CPY_M, CPY_D) partitions of Q and dO of a (head, query block), and of a Q buffer.
  auto q_src = [&](int head, int m_block) { return make_tensor(tQgQ.data() + q_offset(head, m_block), tQgQ.layout()); };
  auto do_src = [&](int head, int m_block) { return make_tensor(tdOgdO.data() + do_offset(head, m_block), tdOgdO.layout()); };
  auto q_dst = [&](int buffer) { return make_tensor(tQsQ.data() + buffer * int(size(sQ)), tQsQ.layout()); };
  // The next (head, query block)'s Q and dO load while this one computes: with
  // cp.async straight into shared memory; without it (sm70, sm75), through
  // registers where the tile has them (Traits::kRegisterPrefetch), issued before
  // a product and stored after it; else synchronously.
  using Staged = StagedTileCopy<Traits::kRegisterPrefetch, Traits::kCopyZeroFills, Element, decltype(tQsQ)>;
  Staged next_q, next_do;

  // The products (smem_product): S = Q K^T and dP = dO V^T; dV += P^T dO and
  // dK += dS^T Q (transposed reads); dQ = dS K: whole tiles, so no predicates
  // (padding rows and columns hold zeros).
  typename SdPTiling<Traits, kDropout>::type mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto product_s = smem_product<Traits, false, false>(mma_sdp, sQ, sK, tidx);
  auto product_dp = smem_product<Traits, false, false>(mma_sdp, sdO, sV, tidx);
  auto product_dv = smem_product<Traits, true, true>(mma_dkv, sPt, sdOt, tidx);
  auto product_dk = smem_product<Traits, true, true>(mma_dkv, sdSt, sQt, tidx);
  auto product_dq = smem_product<Traits, false, true>(mma_dq, sdS, sKt, tidx);

  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), Traits::rowcol(tScS.layout()));
  Tensor tScS0_rc = make_tensor(tScS0.data(), Traits::rowcol(tScS0.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  // P and dS: accumulator -> shared memory.
  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, mma_sdp);
  Tensor tPsP = copy_pds.get_thread_slice(tidx).partition_D(sP);
  Tensor tdSsdS = copy_pds.get_thread_slice(tidx).partition_D(sdS);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(acc_dk);
  clear(acc_dv);

  if (num_iters > 0) {
    // Prologue: K, V and the first Q, dO.
    copy_tile<Traits::kCopyZeroFills>(gmem_copy, tKgK, tKsK, tKcK, tKpK, seq.seqlen_k - n0);
    copy_tile<Traits::kCopyZeroFills>(gmem_copy, tVgV, tVsV, tKcK, tKpK, seq.seqlen_k - n0);
    Tensor q0 = q_dst(0);
    copy_tile<Traits::kCopyZeroFills>(gmem_copy, q_src(head0, m_begin), q0, tQcQ, tQpQ,
                                      seq.seqlen_q - m_begin * kBlockM);
    cp_async_fence();
    copy_tile<Traits::kCopyZeroFills>(gmem_copy, do_src(head0, m_begin), tdOsdO, tQcQ, tQpQ,
                                      seq.seqlen_q - m_begin * kBlockM);
    cp_async_fence();
  }

  int head = head0, m_block = m_begin, q_buffer = 0;
  for (int it = 0; it < num_iters; ++it) {
    const int m0 = m_block * kBlockM;
    const int next_head = m_block + 1 < m_end ? head : head + 1;
    const int next_m_block = m_block + 1 < m_end ? m_block + 1 : m_begin;
    const bool has_next = it + 1 < num_iters;
    const index_t lse_row0 = seq.lse_offset(params, batch, head);
    const index_t ws_row0 = seq.workspace_row(params, batch, head);

    // lse in log2 units as hi + lo (+inf past the end: P = 0 there) and D of this thread's rows.
    RowStats<kRows> stats;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = m0 + get<0>(tScS_rc(r, 0));
      const bool in = row < seq.seqlen_q;
      lse_to_log2(in ? params.softmax_lse[lse_row0 + row] : INFINITY, stats.hi[r], stats.lo[r]);
      stats.d[r] = in ? params.softmax_d[ws_row0 + row] : 0.f;
    }

    // Loads in flight: Q[it] (oldest), then dO[it], then (double-buffered) Q[it+1].
    cp_async_wait<1>();
    publish_smem_to_mma<Traits>();
    __syncthreads();  // Q landed; every warp is done with the last P, dS

    const int q_smem_offset = q_buffer * int(size(sQ));
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    product_s(acc_s, q_smem_offset);
    const int next_rows = seq.seqlen_q - next_m_block * kBlockM;
    Tensor next_q_dst = q_dst(Traits::kDoubleBufferQ ? q_buffer ^ 1 : 0);
    if (Traits::kDoubleBufferQ && has_next) {
      // The other Q buffer was last read in the previous iteration.
      next_q.issue(gmem_copy, q_src(next_head, next_m_block), next_q_dst, tQcQ, tQpQ, next_rows);
      cp_async_fence();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    publish_smem_to_mma<Traits>();
    __syncthreads();  // dO landed
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_dp);
    product_dp(acc_dp);
    if (Traits::kDoubleBufferQ && has_next) next_q.commit(gmem_copy, next_q_dst);

    // P and dS, while dP = dO V^T may still be in flight (wgmma).
    products_wait<Traits, 1>(acc_s);
    p_and_ds<Traits, kScoreMods, kDropout>(acc_s, acc_dp, stats, params, mask, tScS, tScS0, tScS_rc,
                                           tScS0_rc, batch, head, m0, n0);
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor rdS = convert_fragment<Element>(acc_dp);
    copy(copy_pds, make_tensor(rP.data(), copy_pds.retile(rP.layout())), tPsP);
    copy(copy_pds, make_tensor(rdS.data(), copy_pds.retile(rdS.layout())), tdSsdS);
    publish_smem_to_mma<Traits>();
    __syncthreads();  // P, dS in shared memory

    product_dv(acc_dv);
    product_dk(acc_dk, 0, q_smem_offset);
    // dQ = dS K: under wgmma issued now, to run under the barrier and the next
    // loads; the other families compute it after issuing the loads, which then fly under it.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    clear(acc_dq);
    if constexpr (kUsesWgmma<Traits>) product_dq(acc_dq);
    products_wait<Traits, kUsesWgmma<Traits> ? 1 : 0>(acc_dv, acc_dk);
    __syncthreads();  // every warp is done with Q and dO: the next ones load
    if (has_next) {
      if constexpr (!Traits::kDoubleBufferQ) {
        next_q.issue(gmem_copy, q_src(next_head, next_m_block), next_q_dst, tQcQ, tQpQ, next_rows);
        cp_async_fence();
      }
      next_do.issue(gmem_copy, do_src(next_head, next_m_block), tdOsdO, tQcQ, tQpQ, next_rows);
      cp_async_fence();
    }

    if constexpr (!kUsesWgmma<Traits>) product_dq(acc_dq);
    products_wait<Traits, 0>(acc_dq);
    if (has_next) {  // read after the next iteration's first barrier
      if constexpr (!Traits::kDoubleBufferQ) next_q.commit(gmem_copy, next_q_dst);
      next_do.commit(gmem_copy, tdOsdO);
    }
    add_dq<Traits>(params, mask, ws_row0, m0, n_block, acc_dq, tidx, SyncThreads{});
    if constexpr (Traits::kDoubleBufferQ) q_buffer ^= 1;
    head = next_head;
    m_block = next_m_block;
  }

  // Epilogue: dK and dV staged where Q and dO were.
  Tensor sdK = make_tensor(sQ.data(), typename Traits::SmemLayoutKV{});
  Tensor sdV = make_tensor(sdK.data() + size(sdK), typename Traits::SmemLayoutKV{});
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q and dO
  store_dk_dv<Traits, kDropout>(acc_dk, acc_dv, mma_dkv, sdK, sdV, params, seq, batch, head_k, n0, tidx, SyncThreads{});
}

}  // namespace flashattn
