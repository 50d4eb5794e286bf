// The FlashAttention-2 forward pass, written once for every kernel family.
// One CTA computes kBlockM query rows of one (batch, head): it walks the key
// blocks it can see, from the last to the first, keeping an online softmax.
// Loads overlap compute: V[n] arrives while S = Q.K[n]^T is computed, and
// K[n-1] while the softmax and O += P.V[n] run (through cp.async, or through
// registers where there is none: StagedTileCopy). The KV cache kernel may keep
// K and V of several key blocks in flight instead (kKvStages).
#pragma once

#include <cute/tensor.hpp>

#include "flashattn/kernel/dropout.h"
#include "flashattn/kernel/grid_dependency.h"
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

// Tile row r of the key block at row n0 of a KV cache sequence sits this many
// elements after the sequence's row 0 (contiguous cache) or after the head's
// origin (paged cache: the page that holds the sequence's row first_row + n0 + r).
// kStagedPages: the CTA staged each row's offsets (less r rows) in shared memory
// (`staged`), else the row's page is read from the table.
template <bool kStagedPages>
struct KeyRowAddress {
  const int* table;         // this sequence's block-table row; nullptr: contiguous
  const PagedRow* staged;   // the block's rows
  int which;                // 0: K's offsets, 1: V's
  int page_size, first_row, n0;
  index_t page_stride, row_stride;

  __device__ __forceinline__ int64_t operator()(int r) const {
    if (table == nullptr) return int64_t(n0) * row_stride;
    if constexpr (kStagedPages) {
      return staged[r].offset[which];
    } else {
      const int row = first_row + n0 + r;
      return int64_t(__ldg(table + row / page_size)) * page_stride + int64_t(row % page_size - r) * row_stride;
    }
  }
};

// Packed GQA rows (params.pack_gqa = g > 1): packed row m0 + r of the tile is
// query (m0 + r) / g of query head head_k * g + (m0 + r) % g. Their q/out rows
// are not one stride apart: this is each one's offset (0 when g is 1).
struct PackedRowAddress {
  int m0, group;
  index_t row_stride, head_stride;

  __device__ __forceinline__ int64_t operator()(int r) const {
    if (group == 1) return 0;
    const int row = m0 + r;
    return int64_t(row / group) * row_stride + int64_t(row % group) * head_stride;
  }
};

// kScoreMods: softcap and ALiBi. A template flag, not a runtime one: as a
// runtime branch ptxas predicated the modifiers into the plain loop and cost
// 20-40% with the features off (docs/perf-notes.md, v3/v4).
// kDropout: dropout (params.rng_state; kernel/dropout.h), a template flag for the
// same reason: as a runtime branch in the plain kernel it cost that kernel 6-9% at
// d64 and d256 with dropout off (ptxas could no longer schedule the softmax into
// P . V), and in its own kernel the mask's Philox calls schedule with the loop's
// other work (docs/perf-notes.md, dropout).
// kKvCache: the KV cache kernel (params.h): paged K/V, split-KV, per-sequence
// key ranges (seqused_k, leftpad, cache batch index), as runtime features; the
// host runs it with kScoreMods on. Its own instance, so that none of this
// stands in the plain kernel's loop.
// kKvStages > 1 (the KV cache kernel, cp.async): K and V of that many key blocks
// in flight. Decode is memory-bound, and one tile in flight per CTA (V[n] during
// S, K[n-1] during the softmax) leaves a DRAM round trip per tile on every
// CTA's path.
template <typename Traits, bool kScoreMods, bool kKvCache = false, bool kDropout = false, int kKvStages = 1>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(const FwdParams params) {
  static_assert(!(kKvCache && kDropout), "the KV cache kernel is an inference forward");
  static_assert(kKvStages == 1 || (kKvCache && !Traits::kRegisterPrefetch), "stages: the KV cache kernel, cp.async");
  constexpr bool kStaged = kKvStages > 1;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  extern __shared__ __align__(128) char smem[];
  if constexpr (kKvCache) {
    // Launched as a dependent of the stream's previous kernel (the append, or
    // whatever wrote q and the cache): no memory is touched before this.
    wait_for_previous_kernel();
  }
  const int tidx = threadIdx.x;
  const QueryTileScheduler<kBlockM, kKvCache> tile(params);
  const SeqlenInfo seq(params, tile.batch, kKvCache);
  const int m_block = tile.m_block;
  const int m0 = m_block * kBlockM;
  // Past the sequence's end: a spare slot of the varlen grid.
  if (m0 >= seq.seqlen_q) return;
  const int head_k = tile.head / (params.heads / params.heads_k);
  // Packed GQA rows (the cache kernel only): g query heads per row group.
  const int group = kKvCache ? params.pack_gqa : 1;
  const AttentionMask mask(params, seq, group);

  // Global tensors of this (sequence, head): (seqlen, head_dim), 64-bit strides.
  auto gmem = [](const void* base, index_t offset, int rows, index_t row_stride) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + offset),
                       make_layout(make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{})));
  };
  // Packed rows are addressed one by one (PackedRowAddress): their tensors' row stride is 0.
  const index_t q_row_stride = group > 1 ? 0 : params.q_row_stride;
  const index_t out_row_stride = group > 1 ? 0 : params.out_row_stride;
  Tensor mQ = gmem(params.q, seq.q_offset(params.q_batch_stride, params.q_row_stride, tile.batch) +
                                 index_t(tile.head) * group * params.q_head_stride,
                   seq.seqlen_q, q_row_stride);                                 // (s_q, d)
  // A paged cache's rows are found per tile (KeyRowAddress): K/V start at the head.
  const bool paged = kKvCache && params.block_table != nullptr;
  Tensor mK = gmem(params.k, (paged ? 0 : seq.k_offset(params.k_batch_stride, params.k_row_stride, tile.batch)) +
                                 head_k * params.k_head_stride,
                   seq.seqlen_k, params.k_row_stride);                          // (s_k, d)
  Tensor mV = gmem(params.v, (paged ? 0 : seq.k_offset(params.v_batch_stride, params.v_row_stride, tile.batch)) +
                                 head_k * params.v_head_stride,
                   seq.seqlen_k, params.v_row_stride);                          // (s_k, d)
  Tensor mO = make_tensor(
      make_gmem_ptr(static_cast<Element*>(params.out) +
                    seq.q_offset(params.out_batch_stride, params.out_row_stride, tile.batch) +
                    index_t(tile.head) * group * params.out_head_stride),
      make_layout(make_shape(seq.seqlen_q, Int<kHeadDim>{}), make_stride(out_row_stride, _1{})));
  Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));  // (M, d)
  Tensor gO = local_tile(mO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));  // (M, d)
  // K and V start at the last visible key block and step back one block per
  // iteration: one moving pointer each, not one address per block. The KV cache
  // kernel addresses each block from block 0 instead (KeyRowAddress).
  // The tile's queries: rows [m0, m0 + kBlockM), or with packed rows queries
  // [q_first, q_first + q_count).
  const int q_first = m0 / group;
  const int q_count = group > 1 ? (min(m0 + kBlockM, seq.seqlen_q) - 1) / group - q_first + 1 : kBlockM;
  int n_begin, n_end;
  mask.key_block_range(q_first, q_count, kBlockN, n_begin, n_end);
  if constexpr (kKvCache) {
    if (params.num_splits > 1) split_key_blocks(tile.split, params.num_splits, n_begin, n_end);
  }
  const int n_start = kKvCache ? 0 : max(n_end - 1, 0);
  Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_start, 0));  // (N, d)
  Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_start, 0));  // (N, d)
  const index_t k_block_step = -index_t(kBlockN) * params.k_row_stride;
  const index_t v_block_step = -index_t(kBlockN) * params.v_row_stride;
  const int* block_table = paged ? params.block_table + tile.batch * params.block_table_batch_stride : nullptr;
  // Paged: the K and V offsets of each row of a key block (PagedRow), staged in
  // shared memory (shared_storage.h KvSharedStorage: block n in slot n % 2) one
  // step before the loads that need them, so that no load waits on a block-table
  // read. Thread t looks up row t: the read is issued before a product, the
  // offsets made and stored after it.
  PagedRow* page_slots = nullptr;
  if constexpr (kKvCache && kv_stages_pages<Traits, kKvStages>) {
    static_assert(kBlockN <= Traits::kNThreads, "one row of a key block per thread");
    if (paged) page_slots = reinterpret_cast<KvSharedStorage<Traits, kKvStages>*>(smem)->pages;
  }
  // Row t's page and row within it (kept as a pair from the read to the store).
  auto fetch_page = [&](int n_block) {
    const int row = n_block * kBlockN + tidx;
    if (page_slots == nullptr || tidx >= kBlockN || row >= seq.seqlen_k) return make_int2(0, 0);
    const int key = int(seq.row0_k) + row;
    return make_int2(__ldg(block_table + key / params.page_size), key % params.page_size);
  };
  auto store_page = [&](int n_block, int2 page) {
    if (page_slots != nullptr && tidx < kBlockN) {
      page_slots[(n_block & 1) * kBlockN + tidx] =
          PagedRow{{int64_t(page.x) * params.k_batch_stride + int64_t(page.y - tidx) * params.k_row_stride,
                    int64_t(page.x) * params.v_batch_stride + int64_t(page.y - tidx) * params.v_row_stride}};
    }
  };
  constexpr bool kStagedPages = kKvCache && kv_stages_pages<Traits, kKvStages>;
  auto staged = [&](int n0) -> const PagedRow* {
    return page_slots == nullptr ? nullptr : page_slots + ((n0 / kBlockN) & 1) * kBlockN;
  };
  auto k_rows = [&](int n0) {
    return KeyRowAddress<kStagedPages>{block_table, staged(n0), 0, params.page_size, int(seq.row0_k), n0,
                                       params.k_batch_stride, params.k_row_stride};
  };
  auto v_rows = [&](int n0) {
    return KeyRowAddress<kStagedPages>{block_table, staged(n0), 1, params.page_size, int(seq.row0_k), n0,
                                       params.v_batch_stride, params.v_row_stride};
  };
  float* lse_row0 = params.softmax_lse + seq.lse_offset(params, tile.batch, tile.head * group);
  // Packed row -> its lse entry (query, head).
  auto lse_index = [&](int row) { return group > 1 ? (row % group) * params.lse_head_stride + row / group : index_t(row); };

  auto& storage = *reinterpret_cast<FwdSharedStorage<Traits, kKvStages>*>(smem);
  // Stage s of K (V) lies kStageElems * s elements after stage 0.
  constexpr int kStageElems = int(cosize_v<typename Traits::SmemLayoutKV>);
  static_assert(sizeof(storage.k[0]) == kStageElems * sizeof(Element));
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});      // (M, d)
  Tensor sK = make_tensor(make_smem_ptr(storage.k[0].data()), typename Traits::SmemLayoutKV{});  // (N, d)
  Tensor sV = make_tensor(make_smem_ptr(storage.v[0].data()), typename Traits::SmemLayoutKV{});  // (N, d)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Traits::SmemLayoutVtNoSwizzle{});
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});

  // Global <-> shared partitions and their predicates: the head dim inside
  // its bucket (columns) and the sequence tails (rows).
  static_assert(Traits::kBlockN % (Traits::kNThreads / Traits::kGmemThreadsPerRow) == 0,
                "K/V tile smaller than one copy pass");
  typename Traits::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tidx);
  Tensor tQgQ = gmem_thr.partition_S(gQ);
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D)
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

  const int rows_left_q = seq.seqlen_q - m0;

  // Accumulator coordinates and rows, for the lse and the masks. O += P V has
  // its own mma (Volta reads V with a differently laid out atom; Hopper's
  // warpgroup mma spans the whole head dim).
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
    // Q and the last visible K block.
    if constexpr (kKvCache) {
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tQgQ, tQsQ, tQcQ, tQpQ, rows_left_q,
                                        PackedRowAddress{m0, group, params.q_row_stride, params.q_head_stride});
    } else {
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tQgQ, tQsQ, tQcQ, tQpQ, rows_left_q);
    }
    int n_block = n_end - 1;
    // K and V of the key block at n_block into stage `stage` (the KV cache kernel).
    auto load_kv = [&](int n_block, int stage) {
      const int n0 = n_block * kBlockN;
      Tensor tKsK_stage = make_tensor(tKsK.data() + stage * kStageElems, tKsK.layout());
      Tensor tVsV_stage = make_tensor(tVsV.data() + stage * kStageElems, tVsV.layout());
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tKgK, tKsK_stage, tKcK, tKpK, seq.seqlen_k - n0, k_rows(n0));
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tVgV, tVsV_stage, tKcK, tKpK, seq.seqlen_k - n0, v_rows(n0));
    };
    if constexpr (kStaged) {
      // The first kKvStages blocks, one cp.async group each (Q in the first),
      // empty groups past the CTA's range: the loop counts groups as blocks.
      CUTE_UNROLL
      for (int stage = 0; stage < kKvStages; ++stage) {
        if (n_block - stage >= n_begin) {
          store_page(n_block - stage, fetch_page(n_block - stage));
          __syncthreads();  // the block's pages staged (two slots: one barrier per block)
          load_kv(n_block - stage, stage);
        }
        cp_async_fence();
      }
    } else if constexpr (kKvCache) {
      // A cache kernel's CTA sees few key blocks (one or two under split-KV): the
      // first block's V loads beside its K instead of after it.
      store_page(n_block, fetch_page(n_block));
      __syncthreads();
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tKgK, tKsK, tKcK, tKpK, seq.seqlen_k - n_block * kBlockN,
                                        k_rows(n_block * kBlockN));
      cp_async_fence();
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tVgV, tVsV, tKcK, tKpK, seq.seqlen_k - n_block * kBlockN,
                                        v_rows(n_block * kBlockN));
      cp_async_fence();
    } else {
      copy_tile<Traits::kCopyZeroFills>(gmem_copy, tKgK, tKsK, tKcK, tKpK, seq.seqlen_k - n_block * kBlockN);
      cp_async_fence();
    }

    // The two products, S = Q K[n]^T and O += P V[n], per kind of mma: wgmma reads
    // both operands of S and V from shared memory through descriptors; mma.sync
    // loads them into registers (ldmatrix), the next k-slice during the current
    // mma; Volta's P goes through shared memory (its accumulator layout is no
    // operand layout), each warp its own rows. The offsets: K's and V's stage
    // (kKvStages), in elements.
    auto product_qk = [&] {
      if constexpr (kUsesWgmma<Traits>) {
        auto wg_mma = warpgroup_slice(tiled_mma, tidx);
        return [tiled_mma, wg_mma, sK, tSrQ = wg_mma.partition_fragment_A(sQ)](auto& acc_s,
                                                                              int k_offset = 0) mutable {
          Tensor tSrK = wg_mma.partition_fragment_B(make_tensor(sK.data() + k_offset, sK.layout()));
          wgmma_gemm<true>(tiled_mma, tSrQ, tSrK, acc_s);
        };
      } else {
        auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
        auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtomB{}, tiled_mma);
        return [tiled_mma, smem_copy_q, smem_copy_k, tSrQ = thr_mma.partition_fragment_A(sQ),
                tSrK = thr_mma.partition_fragment_B(sK), tSsQ = smem_copy_q.get_thread_slice(tidx).partition_S(sQ),
                tSsK = smem_copy_k.get_thread_slice(tidx).partition_S(sK)](auto& acc_s, int k_offset = 0) mutable {
          clear(acc_s);
          gemm_smem_smem(acc_s, tSrQ, tSrK, tSsQ, make_tensor(tSsK.data() + k_offset, tSsK.layout()), tiled_mma,
                         smem_copy_q, smem_copy_k);
        };
      }
    }();
    auto product_pv = [&] {
      if constexpr (kUsesWgmma<Traits>) {
        return [tiled_mma_pv, wg_mma_pv = warpgroup_slice(tiled_mma_pv, tidx), sVt](auto& acc_o, auto& rP,
                                                                                 int v_offset = 0) mutable {
          Tensor tOrP = make_tensor(rP.data(), Traits::c_to_a(rP.layout()));
          Tensor tOrVt = wg_mma_pv.partition_fragment_B(make_tensor(sVt.data() + v_offset, sVt.layout()));
          wgmma_gemm<false>(tiled_mma_pv, tOrP, tOrVt, acc_o);
        };
      } else {
        auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposedB{}, tiled_mma_pv);
        return [tiled_mma, tiled_mma_pv, smem_copy_v, tidx, &storage, tOrVt = thr_mma_pv.partition_fragment_B(sVtNoSwizzle),
                tOsVt = smem_copy_v.get_thread_slice(tidx).partition_S(sVt)](auto& acc_o, auto& rP,
                                                                             int v_offset = 0) mutable {
          if constexpr (Traits::kPThroughSmem) {
            auto thr_mma_pv = tiled_mma_pv.get_thread_slice(tidx);
            Tensor sP = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutP{});  // (M, N)
            auto smem_copy_c = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
            copy(smem_copy_c, make_tensor(rP.data(), smem_copy_c.retile(rP.layout())),
                 smem_copy_c.get_thread_slice(tidx).partition_D(sP));
            __syncwarp();
            auto smem_copy_p = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma_pv);
            Tensor tOrP = thr_mma_pv.partition_fragment_A(sP);
            gemm_smem_smem(acc_o, tOrP, tOrVt, smem_copy_p.get_thread_slice(tidx).partition_S(sP),
                           make_tensor(tOsVt.data() + v_offset, tOsVt.layout()), tiled_mma_pv, smem_copy_p,
                           smem_copy_v);
          } else {
            Tensor tOrP = make_tensor(rP.data(), Traits::c_to_a(rP.layout()));
            gemm_reg_smem(acc_o, tOrP, tOrVt, make_tensor(tOsVt.data() + v_offset, tOsVt.layout()), tiled_mma_pv,
                          smem_copy_v);
          }
        };
      }
    }();
    Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor tScS = thr_mma.partition_C(cS);
    Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
    Tensor tScS_rc = make_tensor(tScS.data(), Traits::rowcol(tScS.layout()));
    Tensor tScS0_rc = make_tensor(tScS0.data(), Traits::rowcol(tScS0.layout()));
    // Packed rows: each of this thread's accumulator rows' query.
    int row_query[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_query[r] = (m0 + int(get<0>(tScS_rc(r, 0)))) / group;

    clear(acc_o);
    OnlineSoftmax<kRows, Traits::kRowShuffleMask> softmax;
    // V[n] loads during S = Q K[n]^T, K[n-1] during the softmax and O += P V[n].
    using Staged = StagedTileCopy<Traits::kRegisterPrefetch, Traits::kCopyZeroFills, Element, decltype(tKsK)>;
    Staged load_v, load_k;
    // ALiBi slope of this (batch, head), in kernel-score units; 0 when off.
    const float alibi_slope =
        !kScoreMods || params.alibi_slopes == nullptr
            ? 0.f
            : params.alibi_slopes[tile.batch * params.alibi_batch_stride + tile.head] / params.score_scale;

    // Built once per tile: its counter base is read from device memory.
    const auto dropout = [&] {
      if constexpr (kDropout) return Dropout<Traits>(params, tile.batch, tile.head);
      else return 0;  // no RNG state to read
    }();

    // S = Q K^T of the key block at n0 (K at k_offset in shared memory), with the
    // score modifiers and the mask.
    auto scores = [&](auto& acc_s, int n0, int k_offset) {
      product_qk(acc_s, k_offset);
      if constexpr (kScoreMods) {
        if (params.softcap > 0.f) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) acc_s(i) = params.softcap * tanh_exp2(acc_s(i) * params.softcap_prescale);
        }
        if (alibi_slope != 0.f) mask.add_alibi(acc_s, tScS, tScS0, m0, n0, alibi_slope);
      }
      if (group > 1) {
        if (mask.tile_needs_mask(q_first, q_count, n0, kBlockN)) {
          Tensor acc_s_rows = make_tensor(acc_s.data(), Traits::rowcol(acc_s.layout()));
          mask.apply_queries(acc_s_rows, tScS_rc, n0, row_query);
        }
      } else if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) {
        mask.apply(acc_s, tScS, tScS0, m0, n0);
      }
    };
    // The online softmax of S, and O += P V (V at v_offset).
    auto accumulate = [&](auto& acc_s, int n0, int v_offset) {
      Tensor acc_s_rc = make_tensor(acc_s.data(), Traits::rowcol(acc_s.layout()));
      softmax.update(acc_s_rc, acc_o_rc, params.score_scale_log2);
      Tensor rP = convert_fragment<Element>(acc_s);
      if constexpr (kDropout) {
        dropout.drop_probabilities(make_tensor(rP.data(), Traits::rowcol(rP.layout())), tScS_rc, tScS0_rc, m0, n0);
      }
      product_pv(acc_o, rP, v_offset);
    };

    if constexpr (kStaged) {
      // Block n in stage `stage`; its stage refilled with block n - kKvStages once
      // every warp is done with it. Paged: that block's entries were read from the
      // block table an iteration earlier (one block's compute did not cover the read).
      int stage = 0;
      int2 next_page = n_block - kKvStages >= n_begin ? fetch_page(n_block - kKvStages) : make_int2(0, 0);
      for (; n_block >= n_begin; --n_block) {
        const int n0 = n_block * kBlockN;
        const int ahead = n_block - kKvStages;
        cp_async_wait<kKvStages - 1>();
        publish_smem_to_mma<Traits>();
        __syncthreads();  // K[n] and V[n] (and Q) landed
        const int2 ahead_page = next_page;
        next_page = ahead - 1 >= n_begin ? fetch_page(ahead - 1) : make_int2(0, 0);
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        scores(acc_s, n0, stage * kStageElems);
        accumulate(acc_s, n0, stage * kStageElems);
        if (ahead >= n_begin) store_page(ahead, ahead_page);
        __syncthreads();  // everyone is done with this stage; the pages of `ahead` staged
        if (ahead >= n_begin) load_kv(ahead, stage);
        cp_async_fence();
        stage = stage + 1 == kKvStages ? 0 : stage + 1;
      }
    } else {
      for (; n_block >= n_begin; --n_block) {
        const int n0 = n_block * kBlockN;
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        const bool v_in_flight = kKvCache && n_block == n_end - 1;  // loaded in the prologue
        if (v_in_flight) {
          cp_async_wait<1>();
          publish_smem_to_mma<Traits>();
          __syncthreads();  // K[n] (and Q) landed
        } else {
          cp_async_wait<0>();
          publish_smem_to_mma<Traits>();
          __syncthreads();  // K[n] (and Q) landed; everyone is done with V[n+1]
          if constexpr (kKvCache) {
            load_v.issue(gmem_copy, tVgV, tVsV, tKcK, tKpK, seq.seqlen_k - n0, v_rows(n0));
          } else {
            load_v.issue(gmem_copy, tVgV, tVsV, tKcK, tKpK, seq.seqlen_k - n0);
            tVgV.data() = tVgV.data() + v_block_step;
          }
          cp_async_fence();
        }

        int2 next_page = make_int2(0, 0);  // of block n - 1, for K[n-1]'s load after the next barrier
        if constexpr (kKvCache) {
          if (n_block > n_begin) next_page = fetch_page(n_block - 1);
        }
        scores(acc_s, n0, 0);
        if constexpr (kKvCache) {
          if (n_block > n_begin) store_page(n_block - 1, next_page);
        }

        if (!v_in_flight) load_v.commit(gmem_copy, tVsV);
        cp_async_wait<0>();
        publish_smem_to_mma<Traits>();
        __syncthreads();  // V[n] landed; everyone is done with K[n]
        if (n_block > n_begin) {
          if constexpr (kKvCache) {
            load_k.issue(gmem_copy, tKgK, tKsK, tKcK, tKpK, seq.seqlen_k - n0 + kBlockN, k_rows(n0 - kBlockN));
          } else {
            tKgK.data() = tKgK.data() + k_block_step;
            load_k.issue(gmem_copy, tKgK, tKsK, tKcK, tKpK, seq.seqlen_k - n0 + kBlockN);
          }
          cp_async_fence();
        }

        accumulate(acc_s, n0, 0);
        if (n_block > n_begin) load_k.commit(gmem_copy, tKsK);  // read after the next barrier
      }
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

  if constexpr (kKvCache) {
    // The merge of the splits may put its CTAs on the SMs now. Not earlier: let
    // in at the kernel's start, they held b = 8, 1k-key decode back by 13%.
    allow_next_kernel_to_start();
    if (params.num_splits > 1) {
      // This split's fp32 partial output and lse (-inf: it saw no key), straight
      // from the registers: a few rows, merged by the combine kernel.
      const index_t row0 = ((index_t(tile.split) * params.batch + tile.batch) * params.heads + tile.head) *
                           params.seqlen_q;
      float* out_part = params.out_accum + row0 * params.head_dim;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = m0 + get<0>(tOcO_rc(r, 0));
        if (row >= seq.seqlen_q) continue;
        if (get<1>(tOcO_rc(0, 0)) == 0) params.lse_accum[row0 + row] = lse[r] == INFINITY ? -INFINITY : lse[r];
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_o_rc); ++c) {
          const int col = get<1>(tOcO_rc(r, c));
          if (col < params.head_dim) out_part[index_t(row) * params.head_dim + col] = acc_o_rc(r, c);
        }
      }
      return;
    }
  }

  // lse: the lane holding column 0 of a row writes it.
  if (get<1>(tOcO_rc(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = m0 + get<0>(tOcO_rc(r, 0));
      if (row < seq.seqlen_q) lse_row0[lse_index(row)] = lse[r];
    }
  }
  // Epilogue: O through shared memory (where Q was) for 16-byte global stores.
  __syncthreads();  // every warp is done reading Q from shared memory
  if constexpr (kKvCache) {
    store_through_smem<typename Traits::GmemTiledCopyO, typename Traits::SmemCopyAtomO>(
        acc_o, tiled_mma_pv, sO, gO, rows_left_q, params.head_dim, tidx,
        PackedRowAddress{m0, group, params.out_row_stride, params.out_head_stride});
  } else {
    store_through_smem<typename Traits::GmemTiledCopyO, typename Traits::SmemCopyAtomO>(
        acc_o, tiled_mma_pv, sO, gO, rows_left_q, params.head_dim, tidx);
  }
}

}  // namespace flashattn
