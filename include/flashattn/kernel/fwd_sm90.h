// The sm90 family's warp-specialised forward (Hopper, sm_90a): one producer
// lane loads Q, K and V by TMA into rings of shared-memory stages while the
// consumer warpgroups (64 query rows each) run S = Q K^T and O += P V as
// warpgroup MMAs and the softmax between them. Producer and consumers meet at
// mbarriers (one full/empty pair per stage, cutlass::PipelineTmaAsync: a stage
// is full when its bytes landed); `setmaxnreg` hands the producer warpgroup's
// registers to the consumers. Everything else is the shared kernel's:
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
#include "flashattn/kernel/tma_loads.h"
#include "flashattn/kernel/utils.h"
#include "flashattn/kernel/wgmma.h"
#include "flashattn/params.h"

namespace flashattn {

using namespace cute;

// A tile as the producer decoded it for the consumers (index -1: no more
// tiles): they read it from the Q stage that carries it rather than repeat the
// divisions (and a varlen batch's search) at every tile's start, where nothing of
// theirs is on the tensor cores.
struct alignas(16) DecodedTile {
  int index, m_block, head, batch;
};

// kQStages Q tiles, kStages K and V tiles, the output tile where it fits
// beside them (else the output is staged in the tile's Q stage), and the
// pipelines' barriers. 1024-byte
// alignment: the period of the 128-byte swizzle, which the MMA descriptors
// assume for every tile's base.
template <typename Traits>
struct FwdWsTiles {
  using Element = typename Traits::Element;
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutQ>, 1024> q[Traits::kQStages];
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> k[Traits::kStages];
  cute::array_aligned<Element, cosize_v<typename Traits::SmemLayoutKV>, 1024> v[Traits::kStages];
  typename Traits::Pipeline::SharedStorage pipeline_k, pipeline_v;
  typename Traits::PipelineQ::SharedStorage pipeline_q;
  DecodedTile tile[Traits::kQStages];  // the tile of each Q stage, from the producer
};
template <typename Traits>
struct FwdWsTilesWithO : FwdWsTiles<Traits> {
  cute::array_aligned<typename Traits::Element, cosize_v<typename Traits::SmemLayoutO>, 1024> o;
};
// The TMA descriptors of Q, K and V (launch/fwd_sm90.h makes them per call):
// a kernel parameter, so that they sit in constant memory.
template <typename Traits>
struct FwdWsLoads {
  typename Traits::TmaQ q;
  typename Traits::TmaKV k, v;
};
template <typename Traits>
using FwdWsSharedStorage = std::conditional_t<sizeof(FwdWsTilesWithO<Traits>) <= Traits::kMaxSmemBytes,
                                              FwdWsTilesWithO<Traits>, FwdWsTiles<Traits>>;

// CTA c computes tiles c, c + gridDim.x, ...: one where the grid has a CTA per
// tile, several in a persistent grid (QueryTileScheduler::num_persistent_ctas).
// The producer runs ahead across tiles: the next tile's Q, K and V load while
// the consumers finish the last one's products and store its output. Q has a
// pipeline of its own (kQStages stages); the consumers release it after their last
// S = QK^T of the tile, or, where the output is staged in Q's place, after the
// output left shared memory.
//
// kDropout: dropout (kernel/dropout.h), the shared forward's template flag.
template <typename Traits, bool kScoreMods, bool kDropout = false>
__global__ void __launch_bounds__(Traits::kCtaThreads, 1)
    fwd_ws_kernel(const FwdParams params, const __grid_constant__ FwdWsLoads<Traits> loads) {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  using PipelineQ = typename Traits::PipelineQ;
  using SharedStorage = FwdWsSharedStorage<Traits>;
  constexpr bool kOwnOutputTile = std::is_same_v<SharedStorage, FwdWsTilesWithO<Traits>>;
  // Under causal and window masks each consumer warpgroup multiplies only the key
  // blocks its own 64 rows see (below). With three warpgroups a 192-row tile's
  // first skips up to two of the diagonal's blocks: d64 causal +7% at 512-1k
  // tokens and +3% at 2k (H200; non-causal -1%). With two, in 128 x 64 tiles
  // (d224/d256 below 2k keys under a mask) the first skips the diagonal's last
  // block: d256 causal +4% at 512-1k tokens, +3% at 1.5k, non-causal 0 (H100). A
  // 128 x 128 tile's warpgroups see the same blocks, and there the d128 loop lost
  // 4-9% to the extra loop state.
  constexpr bool kWarpgroupKeyRanges =
      Traits::kConsumerWarpgroups == 3 || (Traits::kConsumerWarpgroups == 2 && 2 * Traits::kBlockN == Traits::kBlockM);
  // Dropout in lane units under the softmax-P V overlap: a block's Philox words are
  // made with its exponentials, while the previous block's P V multiplies, and
  // only their compares wait for it (16 words per thread). Up to d64, and at d96
  // without score modifiers (whose kernel then spills in its loop); three
  // warpgroups do not overlap, so at d64 the two-warpgroup tile of short
  // sequences. Forward with dropout, H100: d64 +8%, d96 +2.8% (every length, ViT's
  // 197 tokens +3.6%); d128 0 (+1% to -1%), d256 -6% (spills; docs/perf-notes.md).
  // -DFLASHATTN_SM90_DROPOUT_WORDS_IN_PLACE makes them where they are used, to
  // compare.
#if defined(FLASHATTN_SM90_DROPOUT_WORDS_IN_PLACE)
  constexpr bool kDropoutWordsAhead = false;
#else
  constexpr bool kDropoutWordsAhead =
      kDropout && Dropout<Traits>::kLaneUnits && Traits::kOverlapSoftmax &&
      (Traits::kHeadDim <= 64 || (Traits::kHeadDim <= 96 && !kScoreMods));
#endif
  // Turns (pingpong) with dropout up to d64 (the two-warpgroup tile of short
  // sequences): the two consumer warpgroups take turns to issue their products, so
  // that one's stretch between a P V's wait and its next issue (P's conversion and
  // its dropout) runs under the other's products rather than beside the other's
  // stretch. Forward with dropout, H100: d64 +3% (every
  // length and mask), d128 0, d256 -4%. Without dropout 0.99 (d128 -2%, d256 ±1%;
  // H100, docs/perf-notes.md); -DFLASHATTN_SM90_PINGPONG turns them on in every
  // two-warpgroup kernel, to compare.
#if defined(FLASHATTN_SM90_NO_DROPOUT_PINGPONG)
  constexpr bool kPingpong = false;
#elif defined(FLASHATTN_SM90_PINGPONG)  // every two-warpgroup kernel, to compare
  // Not where the warpgroups have their own key ranges (d224/d256's 64-key
  // tile): under a causal mask one takes fewer turns, and the other would wait
  // for a turn forever.
  constexpr bool kPingpong = Traits::kConsumerWarpgroups == 2 && Traits::kOverlapSoftmax && !kWarpgroupKeyRanges;
#else
  constexpr bool kPingpong =
      kDropout && Traits::kConsumerWarpgroups == 2 && Traits::kOverlapSoftmax && Traits::kHeadDim <= 64;
#endif
  // Above d64 a row's running maximum moves only when a block's scores exceed it
  // by more than 2^8 in probability (OnlineSoftmax), and the output's rescale (64
  // multiplies per thread at d128, 128 at d256, where the tensor cores may wait)
  // runs only for a warp whose rows moved. H100, bf16 forward: d256 +4.4%, with
  // dropout d128 +2% and d256 +3.7%; d128 without dropout and d64 within noise,
  // d64 with dropout and its turns (below) -3%, so d64 keeps the exact maximum.
  // -DFLASHATTN_SM90_EXACT_MAX: every block's maximum everywhere, to compare.
#if defined(FLASHATTN_SM90_EXACT_MAX)
  constexpr int kMaxGrowthLog2 = 0;
#else
  constexpr int kMaxGrowthLog2 = Traits::kHeadDim > 64 ? 8 : 0;
#endif
  // Sm90FwdWsTraits::kQStages reserves the output's own tile beside a second Q stage.
  static_assert(Traits::kQStages == 1 || kOwnOutputTile);
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(1024) char ws_smem[];
  auto& storage = *reinterpret_cast<SharedStorage*>(ws_smem);
  const int num_tiles = int(QueryTileScheduler<kBlockM>::num_ctas(params));  // < 2^31 (host check)

  // Barriers: full (a stage's bytes landed; the producer thread arrives and
  // announces them) and empty (a stage was read; one arrival per consumer
  // warp), initialised by warp 0.
  const int lane = threadIdx.x % 32;
  const bool producer = threadIdx.x < Traits::kProducerThreads;
  Pipeline pipeline_k(storage.pipeline_k, tma_pipeline_params<Pipeline, Traits>(producer, Traits::kKVBytes), Shape<_1, _1, _1>{});
  Pipeline pipeline_v(storage.pipeline_v, tma_pipeline_params<Pipeline, Traits>(producer, Traits::kKVBytes), Shape<_1, _1, _1>{});
  // Q's stage also carries the decoded tile (and tiles without Q): the
  // producer announces Q's bytes itself where it loads Q.
  PipelineQ pipeline_q(storage.pipeline_q, tma_pipeline_params<PipelineQ, Traits>(producer, 0), Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised before anyone waits on them

  auto sQ_of = [&](int stage) {
    return make_tensor(make_smem_ptr(storage.q[stage].data()), typename Traits::SmemLayoutQ{});
  };
  // The Q stage of a pipeline state (0 where there is one stage).
  auto q_stage = [](const auto& state) { return Traits::kQStages == 1 ? 0 : int(state.index()); };

  if (producer) {
    // ---- producer: per tile Q, then K[n] and V[n] into stage (n_end - 1 - n) % kStages, last block first.
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    // Warp 0 follows the schedule (its lanes search varlen offsets together);
    // its lane 0 issues every load.
    if (threadIdx.x >= 32) return;
    const bool leader = lane == 0;
    auto state = cutlass::make_producer_start_state<Pipeline>();
    auto state_q = cutlass::make_producer_start_state<PipelineQ>();
    // The consumers learn each tile (and the end: index -1) from the Q stage
    // that carries it: the tile is written before the arrival that releases it,
    // and the arrival announces Q's bytes where Q loads.
    auto publish_q_stage = [&](const DecodedTile& tile, bool with_q) {
      if (leader) {
        while (pipeline_q.producer_try_acquire(state_q) != cutlass::BarrierStatus::WaitDone) {
        }
        storage.tile[q_stage(state_q)] = tile;
        if (with_q) pipeline_q.producer_expect_transaction(state_q, Traits::kQBytes);
        pipeline_q.producer_acquire(state_q, {cutlass::BarrierStatus::WaitDone});  // arrives
      }
    };
    // The (rows, head dim) view of one head of one sequence: a varlen
    // sequence is its rows of the packed tensor (the descriptor's batch is 1).
    auto rows_of = [&](auto const& tma, bool packed, int rows, int heads, int row0, int head, int batch) {
      Tensor m = tma.get_tma_tensor(make_shape(rows, params.head_dim, heads, packed ? 1 : params.batch));
      return domain_offset(make_coord(row0, 0), m(_, _, head, packed ? 0 : batch));
    };
    auto load_tile = [&](int index) {
      const QueryTileScheduler<kBlockM> tile(params, index);
      const DecodedTile decoded{index, tile.m_block, tile.head, tile.batch};
      const SeqlenInfo seq(params, tile.batch);
      const int m0 = tile.m_block * kBlockM;
      if (m0 >= seq.seqlen_q) return;  // a spare slot of the varlen grid: not published
      const AttentionMask mask(params, seq);
      int n_begin, n_end;
      mask.key_block_range(m0, kBlockM, kBlockN, n_begin, n_end);
      if (n_end <= n_begin) {  // no key visible: the consumers write zeros, without Q
        publish_q_stage(decoded, false);
        ++state_q;
        return;
      }
      const int head_k = tile.head / (params.heads / params.heads_k);
      const bool packed_q = params.cu_seqlens_q != nullptr, packed_k = params.cu_seqlens_k != nullptr;
      Tensor gQ = local_tile(rows_of(loads.q, packed_q, packed_q ? params.total_q : params.seqlen_q, params.heads,
                                     int(seq.row0_q), tile.head, tile.batch),
                             Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));
      const int rows_k = packed_k ? params.total_k : params.seqlen_k;
      Tensor gK = local_tile(rows_of(loads.k, packed_k, rows_k, params.heads_k, int(seq.row0_k), head_k, tile.batch),
                             Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));  // (N, d, blocks)
      Tensor gV = local_tile(rows_of(loads.v, packed_k, rows_k, params.heads_k, int(seq.row0_k), head_k, tile.batch),
                             Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
      auto tma_q = loads.q.get_slice(0);
      auto tma_k = loads.k.get_slice(0);
      auto tma_v = loads.v.get_slice(0);
      Tensor tKgK = tma_k.partition_S(gK);  // (TMA, TMA_N, TMA_D, blocks)
      Tensor tVgV = tma_v.partition_S(gV);
      auto load_q = [&] {
        publish_q_stage(decoded, true);
        if (leader) {
          copy(loads.q.with(*pipeline_q.producer_get_barrier(state_q)), tma_q.partition_S(gQ),
               tma_q.partition_D(sQ_of(q_stage(state_q))));
        }
        ++state_q;
      };
      // With several Q stages, the next tile's Q loads while this one runs:
      // first, it is the tile's longest wait (a Q tile is read once, from memory).
      if constexpr (Traits::kQStages > 1) load_q();

      for (int n_block = n_end - 1; n_block >= n_begin; --n_block) {
        Tensor sK = make_tensor(make_smem_ptr(storage.k[state.index()].data()), typename Traits::SmemLayoutKV{});
        Tensor sV = make_tensor(make_smem_ptr(storage.v[state.index()].data()), typename Traits::SmemLayoutKV{});
        if (leader) {
          pipeline_k.producer_acquire(state);
          copy(loads.k.with(*pipeline_k.producer_get_barrier(state)), tKgK(_, _, _, n_block), tma_k.partition_D(sK));
        }
        // One Q stage: Q after the tile's first K. Where the output is staged
        // in Q's place, Q frees only once the last tile's output left, and K
        // need not wait.
        if (Traits::kQStages == 1 && n_block == n_end - 1) load_q();
        if (leader) {
          pipeline_v.producer_acquire(state);
          copy(loads.v.with(*pipeline_v.producer_get_barrier(state)), tVgV(_, _, _, n_block), tma_v.partition_D(sV));
        }
        ++state;
      }
    };

    // With a tile counter, the next tile is taken once this one's loads are
    // issued (the producer runs a stage or two ahead of the consumers, which
    // hides the round trip).
    for (int index = blockIdx.x; index < num_tiles;) {
      load_tile(index);
      if (params.tile_counter != nullptr) {
        int next = 0;
        if (leader) next = atomicAdd(params.tile_counter, 1);
        index = __shfl_sync(0xffffffffu, next, 0) + int(gridDim.x);
      } else {
        index += int(gridDim.x);
      }
    }
    publish_q_stage(DecodedTile{-1, 0, 0, 0}, false);
    return;
  }

  // ---- consumers: warpgroup w computes query rows [64 w, 64 w + 64) of each tile.
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tidx = threadIdx.x - Traits::kProducerThreads;
  const int warpgroup = __shfl_sync(0xffffffffu, tidx / 128, 0);  // known to the compiler as warp-uniform
  if constexpr (kPingpong) first_turn(warpgroup);
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  typename Traits::TiledMmaPV tiled_mma_pv;
  auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tidx);
  // The descriptors' slices. Uniform (warpgroup_slice): forward +2.4% (d64 +5%)
  // on the bf16 grid. Not in the two-warpgroup kernels with dropout (d > 64), where
  // beside the Philox words ptxas spilled from d128 up and the dropout forward ran
  // 3% slower at d128, 6% at d256 (H100, docs/perf-notes.md).
  constexpr bool kThreadSlices = kDropout && Traits::kConsumerWarpgroups == 2;
  auto wg_mma = kThreadSlices ? thr_mma : warpgroup_slice(tiled_mma, tidx);
  auto wg_mma_pv = kThreadSlices ? thr_mma_pv : warpgroup_slice(tiled_mma_pv, tidx);
  Tensor tSrQ = wg_mma.partition_fragment_A(sQ_of(0));
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), Traits::rowcol(tScS.layout()));
  Tensor tScS0_rc = make_tensor(tScS0.data(), Traits::rowcol(tScS0.layout()));
  Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), Traits::rowcol(tOcO.layout()));

  typename Pipeline::PipelineState state;  // stage 0, phase 0: the producer's order
  typename PipelineQ::PipelineState state_q;
  for (;;) {
    pipeline_q.consumer_wait(state_q);
    const int q_index = q_stage(state_q);  // the Q stage of this tile
    const DecodedTile tile = storage.tile[q_index];
    if (tile.index < 0) break;
    const SeqlenInfo seq(params, tile.batch);
    const int m0 = tile.m_block * kBlockM;
    const AttentionMask mask(params, seq);
    int n_begin, n_end;
    mask.key_block_range(m0, kBlockM, kBlockN, n_begin, n_end);
    const int rows_left_q = seq.seqlen_q - m0;
    Tensor mO = make_tensor(
        make_gmem_ptr(static_cast<Element*>(params.out) +
                      seq.q_offset(params.out_batch_stride, params.out_row_stride, tile.batch) +
                      index_t(tile.head) * params.out_head_stride),
        make_layout(make_shape(seq.seqlen_q, Int<kHeadDim>{}), make_stride(params.out_row_stride, _1{})));
    Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, 0));

    using StageState = typename Pipeline::PipelineState;
    auto sV_of = [&](int stage) {
      return make_tensor(make_smem_ptr(storage.v[stage].data()), typename Traits::SmemLayoutKV{});
    };
    // Key block n_block's K was read (S landed in acc_s), and after the tile's
    // last block Q too (where the output has its own tile).
    auto release_k = [&](const StageState& stage, int n_block) {
      __syncwarp();
      if (lane == 0) pipeline_k.consumer_release(stage);
      if constexpr (kOwnOutputTile) {
        if (n_block == n_begin && lane == 0) pipeline_q.consumer_release(state_q);  // the tile's last read of Q
      }
    };
    // Waits for key block n_block's V. A varlen sequence's last block holds the
    // next sequence's rows past its end: their P is 0, but 0 * Inf is NaN, so
    // every consumer zeroes its share of them first (no sequence's values reach
    // another's output).
    auto wait_v = [&](const StageState& stage, int n_block) {
      pipeline_v.consumer_wait(stage);
      const int n0 = n_block * kBlockN;
      if (params.cu_seqlens_k != nullptr && n0 + kBlockN > seq.seqlen_k) {
        Tensor sV = sV_of(stage.index());
        zero_rows_from<Traits>(sV, seq.seqlen_k - n0, tidx);
        cutlass::arch::fence_view_async_shared();  // generic writes, read by wgmma
        consumers_sync<Traits>();
      }
    };
    auto release_v = [&](const StageState& stage) {
      __syncwarp();
      if (lane == 0) pipeline_v.consumer_release(stage);
    };

    // Key blocks [to, from) passed on without products (in the producer's
    // order, from the last).
    auto pass_stages = [&](int from, int to) {
      for (int n_block = from - 1; n_block >= to; --n_block, ++state) {
        pipeline_k.consumer_wait(state);
        release_k(state, n_block);
        wait_v(state, n_block);
        release_v(state);
      }
    };
    const bool tile_has_keys = n_end > n_begin;
    // A warpgroup whose 64 rows all lie past the sequence's end (the last tile
    // of a sequence) computes and stores nothing: it passes the stages on, and
    // its share of the tensor cores goes to the other warpgroups. Only where
    // each warpgroup stores its own output rows (no barrier across them).
    if (Traits::kSkipRowlessWarpgroups && kOwnOutputTile && m0 + 64 * warpgroup >= seq.seqlen_q) {
      pass_stages(n_end, n_begin);
      if (!tile_has_keys && lane == 0) pipeline_q.consumer_release(state_q);  // else with the last K
      ++state_q;
      continue;
    }
    // Under a causal or window mask a warpgroup's 64 rows may see fewer of the
    // tile's key blocks than the tile's rows do (the diagonal's last blocks, for
    // its first rows): where the traits say so, it passes those on and multiplies
    // [wg_begin, wg_end). None visible: its rows get the output of a row that sees
    // no key.
    int wg_begin = n_begin, wg_end = n_end;
    if (kWarpgroupKeyRanges && tile_has_keys && (params.window_left >= 0 || params.window_right >= 0)) {
      mask.key_block_range(m0 + 64 * warpgroup, 64, kBlockN, wg_begin, wg_end);
      wg_begin = max(wg_begin, n_begin);
      wg_end = min(wg_end, n_end);
      if (wg_end <= wg_begin) wg_begin = wg_end = n_begin;
    }
    pass_stages(n_end, wg_end);

    Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    Tensor acc_o_rc = make_tensor(acc_o.data(), Traits::rowcol(acc_o.layout()));
    constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
    float lse[kRows];
    const bool any_key = wg_end > wg_begin;
    if (any_key) {
      const float alibi_slope =
          !kScoreMods || params.alibi_slopes == nullptr
              ? 0.f
              : params.alibi_slopes[tile.batch * params.alibi_batch_stride + tile.head] / params.score_scale;

      clear(acc_o);
      // Built once per tile: its counter base is read from device memory (the
      // graph-safe RNG state), which inside the loop would be a load per block.
      const auto dropout = [&] {
        if constexpr (kDropout) return Dropout<Traits>(params, tile.batch, tile.head);
        else return 0;  // no RNG state to read
      }();
      // The first rounds of this thread's Philox calls, the same for all its blocks.
      using DropPrefix = std::conditional_t<kDropout, typename Dropout<Traits>::LanePrefix, int>;
      [[maybe_unused]] DropPrefix drop_prefixes[kRows / 2];
      if constexpr (kDropout) dropout.lane_prefixes(tScS_rc, tScS0_rc, m0, drop_prefixes);
      OnlineSoftmax<kRows, Traits::kRowShuffleMask, kMaxGrowthLog2> softmax;
      float correction[kRows];  // the output's rescale before the next P V adds to it
      Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor acc_s_rc = make_tensor(acc_s.data(), Traits::rowcol(acc_s.layout()));
      Tensor rP = make_tensor_like<Element>(acc_s);
      Tensor tOrP = make_tensor(rP.data(), Traits::c_to_a(rP.layout()));
      constexpr int kDropWords = decltype(size<0>(tScS0_rc))::value / 2 * (decltype(size<1>(tScS0_rc))::value / 2);
      uint32_t drop_words[kDropoutWordsAhead ? kDropWords : 1];  // of the block exponentiate made last
      // S = Q K^T of the key block in `stage`, issued into acc_s (waited: its K
      // was waited for already).
      auto issue_s = [&](const StageState& stage, bool waited = false) {
        if (!waited) pipeline_k.consumer_wait(stage);
        Tensor sK = make_tensor(make_smem_ptr(storage.k[stage.index()].data()), typename Traits::SmemLayoutKV{});
        if constexpr (Traits::kQStages == 1) {
          wgmma_issue<true>(tiled_mma, tSrQ, wg_mma.partition_fragment_B(sK), acc_s);
        } else {
          Tensor tSrQs = wg_mma.partition_fragment_A(sQ_of(q_index));
          wgmma_issue<true>(tiled_mma, tSrQs, wg_mma.partition_fragment_B(sK), acc_s);
        }
      };
      // acc_s of key block n_block: score modifiers and mask, then probabilities
      // (the output's correction for them in `correction`).
      auto exponentiate = [&](int n_block) {
        const int n0 = n_block * kBlockN;
        if constexpr (kScoreMods) {
          if (params.softcap > 0.f) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) acc_s(i) = params.softcap * tanh_exp2(acc_s(i) * params.softcap_prescale);
          }
          if (alibi_slope != 0.f) mask.add_alibi(acc_s, tScS, tScS0, m0, n0, alibi_slope);
        }
        // With three warpgroups, whether this one's 64 rows need the mask, not the
        // whole tile's: a 192-row tile's diagonal crosses two or three key blocks, a
        // warpgroup's one. (With two, both halves of a 128-row tile mostly need it.)
        const bool needs_mask = kWarpgroupKeyRanges ? mask.tile_needs_mask(m0 + 64 * warpgroup, 64, n0, kBlockN)
                                                    : mask.tile_needs_mask(m0, kBlockM, n0, kBlockN);
        if (needs_mask) mask.apply(acc_s, tScS, tScS0, m0, n0);
        softmax.exponentiate(acc_s_rc, params.score_scale_log2, correction);
        if constexpr (kDropoutWordsAhead) dropout.make_words(drop_prefixes, tScS_rc, tScS0_rc, n0, drop_words);
      };
      // The output rescaled, and acc_s's probabilities into rP, the 16-bit A
      // operand of O += P V (whole registers: an element-wise copy into a
      // fragment that lives across iterations shuffles halves), dropped where
      // dropout says so.
      auto to_operand = [&](int n_block) {
        if (kMaxGrowthLog2 == 0 || softmax.any_rescale(correction)) softmax.rescale(acc_o_rc, correction);
        convert_fragment_into(acc_s, rP);
        if constexpr (kDropoutWordsAhead) {
          dropout.drop_probabilities(make_tensor(rP.data(), Traits::rowcol(rP.layout())), tScS0_rc, drop_words);
        } else if constexpr (kDropout) {
          uint32_t words[kDropWords];
          dropout.make_words(drop_prefixes, tScS_rc, tScS0_rc, n_block * kBlockN, words);
          dropout.drop_probabilities(make_tensor(rP.data(), Traits::rowcol(rP.layout())), tScS0_rc, words);
        }
      };
      // O += P V of key block n_block, issued once its V landed.
      auto issue_pv = [&](const StageState& stage, int n_block, bool waited = false) {
        if (!waited) wait_v(stage, n_block);
        Tensor sVt = make_tensor(sV_of(stage.index()).data(), typename Traits::SmemLayoutVt{});
        wgmma_issue<false>(tiled_mma_pv, tOrP, wg_mma_pv.partition_fragment_B(sVt), acc_o);
      };

      // Key blocks from the last.
      if constexpr (Traits::kOverlapSoftmax) {
        // The loop rotated by half a block: an iteration issues S of block
        // n - 1, then P V of block n, and exponentiates n - 1 while P V
        // multiplies. The wait for that P V opens the next iteration (placed
        // after the softmax, ptxas moves the exponentials below it).
        // With turns (kPingpong), every wait for data comes before the turn: a
        // varlen sequence's last V is zeroed by all consumers at a barrier.
        [[maybe_unused]] const int wg = warpgroup;
        int n_block = wg_end - 1;
        if constexpr (kPingpong) {
          pipeline_k.consumer_wait(state);
          take_turn(wg);
          issue_s(state, true);
          pass_turn(wg);
        } else {
          issue_s(state);
        }
        wgmma_wait<0>(acc_s);
        release_k(state, n_block);
        exponentiate(n_block);
        StageState pv_state = state;  // the stage of the P V in flight
        for (; n_block > wg_begin; --n_block) {
          wgmma_wait<0>(acc_o, tOrP);
          if (n_block < wg_end - 1) release_v(pv_state);
          to_operand(n_block);
          StageState next = state;
          ++next;
          if constexpr (kPingpong) {
            pipeline_k.consumer_wait(next);
            wait_v(state, n_block);
            take_turn(wg);
            issue_s(next, true);
            issue_pv(state, n_block, true);
            pass_turn(wg);
          } else {
            issue_s(next);
            issue_pv(state, n_block);
          }
          wgmma_wait<1>(acc_s);
          release_k(next, n_block - 1);
          exponentiate(n_block - 1);
          pv_state = state;
          state = next;
        }
        wgmma_wait<0>(acc_o, tOrP);
        if (wg_begin < wg_end - 1) release_v(pv_state);
        to_operand(wg_begin);
        if constexpr (kPingpong) {
          wait_v(state, wg_begin);
          take_turn(wg);
          issue_pv(state, wg_begin, true);
          pass_turn(wg);
        } else {
          issue_pv(state, wg_begin);
        }
        wgmma_wait<0>(acc_o, tOrP);
        release_v(state);
        ++state;
      } else {
        for (int n_block = wg_end - 1; n_block >= wg_begin; --n_block, ++state) {
          issue_s(state);
          wgmma_wait<0>(acc_s);
          release_k(state, n_block);
          exponentiate(n_block);
          to_operand(n_block);
          issue_pv(state, n_block);
          wgmma_wait<0>(acc_o, tOrP);
          release_v(state);
        }
      }
      // With dropout, the kept P / (1 - p).
      softmax.finalize(acc_o_rc, params.score_scale_log2, lse, kDropout ? params.dropout_scale : 1.f);
    } else {
      // No key is visible to any row of this block: output 0, lse +inf.
      clear(acc_o);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) lse[r] = INFINITY;
    }
    // The first blocks, before the epilogue: the other warpgroups may still need
    // their stages refilled behind them (and the epilogue may wait for them).
    pass_stages(wg_begin, n_begin);

    float* lse_row0 = params.softmax_lse + seq.lse_offset(params, tile.batch, tile.head);
    if (get<1>(tOcO_rc(0, 0)) == 0) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = m0 + get<0>(tOcO_rc(r, 0));
        if (row < seq.seqlen_q) lse_row0[row] = lse[r];
      }
    }
    // Epilogue: O through shared memory for 16-byte global stores. Where O has
    // its own tile, each warpgroup stores its 64 rows alone: no barrier across
    // warpgroups, which stay out of step (one's softmax under the other's
    // products) from tile to tile. Where O is staged in Q's place, every
    // consumer must be done with Q (and the last output) first.
    if constexpr (kOwnOutputTile) {
      const int wg = warpgroup;
      Tensor sO = make_tensor(make_smem_ptr(storage.o.data()), typename Traits::SmemLayoutO{});
      Tensor sOw = local_tile(sO, Shape<_64, Int<kHeadDim>>{}, make_coord(wg, 0));
      Tensor gOw = local_tile(mO, Shape<_64, Int<kHeadDim>>{}, make_coord(tile.m_block * (kBlockM / 64) + wg, 0));
      warpgroup_sync(wg);  // its last tile's stores have read sOw
      stage_in_smem<typename Traits::SmemCopyAtomOut>(acc_o, tiled_mma_pv, sO, tidx);
      warpgroup_sync(wg);
      store_from_smem<typename Traits::GmemTiledCopyOWarpgroup>(sOw, gOw, rows_left_q - 64 * wg, params.head_dim,
                                                                 tidx % 128, NoRowOffset{},
                                                                 static_cast<typename Traits::SmemLoadAtomOut*>(nullptr));
    } else {
      Tensor sO = make_tensor(sQ_of(q_index).data(), typename Traits::SmemLayoutO{});
      consumers_sync<Traits>();
      store_through_smem<typename Traits::GmemTiledCopyO, typename Traits::SmemCopyAtomOut>(
          acc_o, tiled_mma_pv, sO, gO, rows_left_q, params.head_dim, tidx, NoRowOffset{},
          [] { consumers_sync<Traits>(); }, static_cast<typename Traits::SmemLoadAtomOut*>(nullptr));
    }
    if (!kOwnOutputTile || !tile_has_keys) {  // else released with the tile's last K
      // Where the output is staged in Q's place, every thread's accesses to it
      // come first: the next Q is loaded over it, through the async proxy.
      if constexpr (!kOwnOutputTile) {
        cutlass::arch::fence_view_async_shared();
        consumers_sync<Traits>();
      }
      if (lane == 0) pipeline_q.consumer_release(state_q);
    }
    ++state_q;
  }
}

}  // namespace flashattn
