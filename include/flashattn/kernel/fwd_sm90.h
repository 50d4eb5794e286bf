// The sm90 family's warp-specialised forward (Hopper, sm_90a): one producer
// warpgroup loads K and V into a ring of shared-memory stages while the consumer
// warpgroups (64 query rows each) run S = Q K^T and O += P V as warpgroup MMAs
// and the softmax between them. Producer and consumers meet at mbarriers (one
// full/empty pair per stage, cutlass::PipelineAsync); `setmaxnreg` hands the
// producer's registers to the consumers. Everything else is the shared kernel's:
// masks, online softmax, score modifiers, tile scheduler, epilogue.
//
// It serves the forward (dense and varlen, with causal/window masks, softcap,
// ALiBi, GQA, dropout). The KV cache kernel runs the shared kernel (kernel/fwd.h)
// with the family's traits.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashattn/kernel/dropout.h"
#include "flashattn/kernel/mask.h"
#include "flashattn/kernel/seqlen.h"
#include "flashattn/kernel/shared_storage.h"
#include "flashattn/kernel/softmax.h"
#include "flashattn/kernel/tile_scheduler.h"
#include "flashattn/kernel/utils.h"
#include "flashattn/kernel/wgmma.h"
#include "flashattn/params.h"

namespace flashattn {

using namespace cute;

// Q (the output is staged there at the end), kStages K and V tiles, and the
// pipelines' barriers. 1024-byte alignment: the period of the 128-byte swizzle,
// which the MMA descriptors assume for every tile's base.
template <typename Traits>
struct FwdWsSharedStorage {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> k[Traits::kStages];
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> v[Traits::kStages];
  typename Pipeline::SharedStorage pipeline_k, pipeline_v;
};

// kDropout: dropout (kernel/dropout.h), the shared forward's template flag.
template <typename Traits, bool kScoreMods, bool kDropout = false>
__global__ void __launch_bounds__(Traits::kCtaThreads, 1) fwd_ws_kernel(const FwdParams params) {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(1024) char ws_smem[];
  auto& storage = *reinterpret_cast<FwdWsSharedStorage<Traits>*>(ws_smem);
  const QueryTileScheduler<kBlockM> tile(params);
  const SeqlenInfo seq(params, tile.batch);
  const int m0 = tile.m_block * kBlockM;
  if (m0 >= seq.seqlen_q) return;  // a spare slot of the varlen grid: the whole CTA leaves
  const int head_k = tile.head / (params.heads / params.heads_k);
  const AttentionMask mask(params, seq);
  int n_begin, n_end;
  mask.key_block_range(m0, kBlockM, kBlockN, n_begin, n_end);

  // Barriers: full (a stage landed; one arrival per producer warp) and empty (a
  // stage was read; one arrival per consumer warp), initialised by warp 0.
  const int lane = threadIdx.x % 32;
  const bool producer = threadIdx.x < Traits::kProducerThreads;
  typename Pipeline::Params pipe_params;
  pipe_params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.producer_arv_count = Traits::kProducerThreads / 32;
  pipe_params.consumer_arv_count = Traits::kConsumerThreads / 32;
  Pipeline pipeline_k(storage.pipeline_k, pipe_params);
  Pipeline pipeline_v(storage.pipeline_v, pipe_params);
  __syncthreads();  // barriers initialised before anyone waits on them

  auto gmem = [](const void* base, index_t offset, int rows, index_t row_stride) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + offset),
                       make_layout(make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{})));
  };

  if (producer) {
    // ---- producer: K[n] then V[n] into stage (n_end - 1 - n) % kStages, last block first.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int tidx = threadIdx.x;
    Tensor mK = gmem(params.k, seq.k_offset(params.k_batch_stride, params.k_row_stride, tile.batch) +
                                   head_k * params.k_head_stride, seq.seqlen_k, params.k_row_stride);
    Tensor mV = gmem(params.v, seq.k_offset(params.v_batch_stride, params.v_row_stride, tile.batch) +
                                   head_k * params.v_head_stride, seq.seqlen_k, params.v_row_stride);
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (N, d, blocks)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
    typename Traits::ProducerTiledCopy gmem_copy;
    auto thr = gmem_copy.get_thread_slice(tidx);
    Tensor tKgK = thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, blocks)
    Tensor tVgV = thr.partition_S(gV);
    Tensor tKcK = thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tKpK = make_tensor<bool>(make_shape(size<2>(tKcK)));
    CUTE_UNROLL
    for (int k = 0; k < size(tKpK); ++k) tKpK(k) = get<1>(tKcK(0, 0, k)) < params.head_dim;

    auto state = cutlass::make_producer_start_state<Pipeline>();
    for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
      const int rows_left = seq.seqlen_k - n_block * kBlockN;
      Tensor sK = make_tensor(make_smem_ptr(storage.k[state.index()].data()), typename Traits::SmemLayoutKV{});
      Tensor sV = make_tensor(make_smem_ptr(storage.v[state.index()].data()), typename Traits::SmemLayoutKV{});
      Tensor tKsK = thr.partition_D(sK);
      Tensor tVsV = thr.partition_D(sV);
      pipeline_k.producer_acquire(state);
      copy_tile<true>(gmem_copy, tKgK(_, _, _, n_block), tKsK, tKcK, tKpK, rows_left);
      cp_async_fence();
      pipeline_v.producer_acquire(state);
      copy_tile<true>(gmem_copy, tVgV(_, _, _, n_block), tVsV, tKcK, tKpK, rows_left);
      cp_async_fence();
      // cp.async writes go through the generic proxy, wgmma reads through the
      // async one: each thread fences its landed writes before its warp arrives.
      cp_async_wait<1>();
      cutlass::arch::fence_view_async_shared();
      __syncwarp();
      if (lane == 0) pipeline_k.producer_commit(state);
      cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();
      __syncwarp();
      if (lane == 0) pipeline_v.producer_commit(state);
      ++state;
    }
    return;
  }

  // ---- consumers: warpgroup w computes query rows [64 w, 64 w + 64) of the tile.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tidx = threadIdx.x - Traits::kProducerThreads;
  const int rows_left_q = seq.seqlen_q - m0;
  Tensor mQ = gmem(params.q, seq.q_offset(params.q_batch_stride, params.q_row_stride, tile.batch) +
                                 index_t(tile.head) * params.q_head_stride, seq.seqlen_q, params.q_row_stride);
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));
  Tensor mO = make_tensor(
      make_gmem_ptr(static_cast<Element*>(params.out) +
                    seq.q_offset(params.out_batch_stride, params.out_row_stride, tile.batch) +
                    index_t(tile.head) * params.out_head_stride),
      make_layout(make_shape(seq.seqlen_q, Int<kHeadDim>{}), make_stride(params.out_row_stride, _1{})));
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  typename Traits::TiledMmaPV tiled_mma_pv;
  auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tidx);
  Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor acc_o_rc = make_tensor(acc_o.data(), Traits::rowcol(acc_o.layout()));
  Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), Traits::rowcol(tOcO.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  float lse[kRows];

  if (n_end > n_begin) {
    {  // Q, loaded by the consumers themselves while the producer starts on K.
      typename Traits::GmemTiledCopyQKV gmem_copy;
      auto thr = gmem_copy.get_thread_slice(tidx);
      Tensor tQcQ = thr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
      Tensor tQpQ = make_tensor<bool>(make_shape(size<2>(tQcQ)));
      CUTE_UNROLL
      for (int k = 0; k < size(tQpQ); ++k) tQpQ(k) = get<1>(tQcQ(0, 0, k)) < params.head_dim;
      Tensor tQsQ = thr.partition_D(sQ);
      copy_tile<true>(gmem_copy, thr.partition_S(gQ), tQsQ, tQcQ, tQpQ, rows_left_q);
      cp_async_fence();
      cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();
      consumers_sync<Traits>();
    }
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor tScS = thr_mma.partition_C(cS);
    Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), Traits::rowcol(tScS.layout()));
    Tensor tScS0_rc = make_tensor(tScS0.data(), Traits::rowcol(tScS0.layout()));
    const float alibi_slope =
        !kScoreMods || params.alibi_slopes == nullptr
            ? 0.f
            : params.alibi_slopes[tile.batch * params.alibi_batch_stride + tile.head] / params.score_scale;

    clear(acc_o);
    OnlineSoftmax<kRows, Traits::kRowShuffleMask> softmax;
    typename Pipeline::PipelineState state;  // stage 0, phase 0: the producer's order
    for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
      const int n0 = n_block * kBlockN;
      Tensor sK = make_tensor(make_smem_ptr(storage.k[state.index()].data()), typename Traits::SmemLayoutKV{});
      Tensor sV = make_tensor(make_smem_ptr(storage.v[state.index()].data()), typename Traits::SmemLayoutKV{});
      Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
      Tensor tSrK = thr_mma.partition_fragment_B(sK);
      Tensor tOrVt = thr_mma_pv.partition_fragment_B(sVt);

      Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
      pipeline_k.consumer_wait(state);
      wgmma_gemm<true>(tiled_mma, tSrQ, tSrK, acc_s);
      __syncwarp();
      if (lane == 0) pipeline_k.consumer_release(state);

      if constexpr (kScoreMods) {
        if (params.softcap > 0.f) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) acc_s(i) = params.softcap * tanh_exp2(acc_s(i) * params.softcap_prescale);
        }
        if (alibi_slope != 0.f) mask.add_alibi(acc_s, tScS, tScS0, m0, n0, alibi_slope);
      }
      if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) mask.apply(acc_s, tScS, tScS0, m0, n0);
      Tensor acc_s_rc = make_tensor(acc_s.data(), Traits::rowcol(acc_s.layout()));
      softmax.update(acc_s_rc, acc_o_rc, params.score_scale_log2);
      Tensor rP = convert_fragment<Element>(acc_s);
      if constexpr (kDropout) {
        Dropout<Traits>(params, tile.batch, tile.head)
            .drop_probabilities(make_tensor(rP.data(), Traits::rowcol(rP.layout())), tScS_rc, tScS0_rc, m0, n0);
      }
      Tensor tOrP = make_tensor(rP.data(), Traits::c_to_a(rP.layout()));

      pipeline_v.consumer_wait(state);
      wgmma_gemm<false>(tiled_mma_pv, tOrP, tOrVt, acc_o);
      __syncwarp();
      if (lane == 0) pipeline_v.consumer_release(state);
      ++state;
    }
    softmax.finalize(acc_o_rc, params.score_scale_log2, lse);
    if constexpr (kDropout) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= params.dropout_scale;  // kept P / (1 - p)
    }
  } else {
    // No key is visible to any row of this block: output 0, lse +inf.
    clear(acc_o);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) lse[r] = INFINITY;
  }

  float* lse_row0 = params.softmax_lse + seq.lse_offset(params, tile.batch, tile.head);
  if (get<1>(tOcO_rc(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = m0 + get<0>(tOcO_rc(r, 0));
      if (row < seq.seqlen_q) lse_row0[row] = lse[r];
    }
  }
  // Epilogue: O through shared memory (where Q was) for 16-byte global stores,
  // once every consumer is done reading Q.
  consumers_sync<Traits>();
  store_through_smem<typename Traits::GmemTiledCopyO, typename Traits::SmemCopyAtomO>(
      acc_o, tiled_mma_pv, sO, gO, rows_left_q, params.head_dim, tidx, NoRowOffset{},
      [] { consumers_sync<Traits>(); });
}

}  // namespace flashattn
