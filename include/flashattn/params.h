// Plain structs handed from the host to the kernels. No torch, no CuTe.
#pragma once

#include <cstdint>

namespace flashattn {

using index_t = int64_t;  // every offset is 64-bit: tensors may exceed 2^31 elements

// Forward problem: q (b, s_q, h, d), k/v (b, s_k, h_k, d), out like q,
// softmax_lse (b, h, s_q) fp32. Strides are in elements; the last dim is
// contiguous. A stride may be anything else (views of packed qkv).
// Varlen: q (total_q, h, d), k/v (total_k, h_k, d), sequence b at rows
// [cu_seqlens[b], cu_seqlens[b + 1]), softmax_lse (h, total_q); seqlen_q/k are
// the maxima and the batch strides 0 (kernel/seqlen.h).
struct FwdParams {
  const void* __restrict__ q = nullptr;
  const void* __restrict__ k = nullptr;
  const void* __restrict__ v = nullptr;
  void* __restrict__ out = nullptr;
  float* __restrict__ softmax_lse = nullptr;

  index_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  index_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  index_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  index_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  int batch = 0;
  int heads = 0;       // query heads
  int heads_k = 0;     // key/value heads; heads % heads_k == 0
  int seqlen_q = 0;
  int seqlen_k = 0;
  int head_dim = 0;    // actual head dim (multiple of 8), <= the kernel's bucket

  // Varlen: int32 (batch + 1) prefix sums of the sequence lengths; nullptr for a
  // fixed-length batch.
  const int* __restrict__ cu_seqlens_q = nullptr;
  const int* __restrict__ cu_seqlens_k = nullptr;
  int total_q = 0, total_k = 0;  // varlen: rows of q and of k/v
  index_t lse_batch_stride = 0, lse_head_stride = 0;  // softmax_lse, in floats

  float softmax_scale = 1.f;  // applied to q.k

  // The kernel's scores are raw q.k, or with softcap already scaled and capped.
  // score_scale turns a kernel score into a scaled score (for lse and ALiBi);
  // score_scale_log2 = score_scale * log2(e), for exp2.
  float score_scale = 1.f;
  float score_scale_log2 = 1.f;

  // Masking. Query row i may see key column j iff
  //   j <= i + (s_k - s_q) + window_right  (when window_right >= 0) and
  //   j >= i + (s_k - s_q) - window_left   (when window_left >= 0),
  // i.e. aligned to the bottom-right; causal means window_right = 0.
  bool is_causal = false;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded

  float softcap = 0.f;  // 0: off; else scaled scores s -> softcap * tanh(s / softcap)
  float softcap_prescale = 0.f;  // softmax_scale / softcap

  const float* alibi_slopes = nullptr;  // (h) or (b, h) fp32; nullptr: off
  index_t alibi_batch_stride = 0;       // 0 when the slopes are (h)

  // Dropout (kernel/dropout.h): on when `dropout` is set. The mask is a function
  // of seed + offset: rng_state, int64 [seed, offset] in device memory, where it
  // is set (read by the kernels, so that a CUDA graph replays with the values of
  // each replay), else rng_seed_offset (an eager call's draw, from the host). An
  // element is kept when its random byte is below dropout_threshold (+1 for
  // dropout_dither of every 16 positions): dropout_threshold * 16 +
  // dropout_dither = round((1 - p) 4096). Kept probabilities are scaled by
  // dropout_scale = 1 / (1 - p).
  bool dropout = false;
  const int64_t* __restrict__ rng_state = nullptr;
  uint64_t rng_seed_offset = 0;
  float dropout_p = 0.f;
  uint32_t dropout_threshold = 0;
  uint32_t dropout_dither = 0;
  // The same as the compares of lane units take them (kernel/dropout.h): entry
  // 2c + half holds the thresholds of bytes 4c + 2 half and 4c + 2 half + 1 in
  // its low and high 16 bits.
  uint32_t dropout_thresholds2[8] = {};
  // The same as 16-bit addends (kernel/bwd_sm90.h, KeepExchange::make): entry
  // 2c + b holds 256 - the thresholds of bytes 4c + b and 4c + b + 2 in its low
  // and high 16 bits, so that a byte plus its addend reaches 256 where it is dropped.
  uint32_t dropout_drop_addends[8] = {};
  float dropout_scale = 1.f;

  bool is_bf16 = false;
  int num_sms = 0;  // of the device, for grid heuristics
  int l2_bytes = 0;  // of the device: the tile order's L2 sections (tile_scheduler.h)
  // A zeroed int32 from which a persistent forward's CTAs take their next tile
  // (QueryTileScheduler::num_persistent_ctas); nullptr: each CTA steps through the
  // tiles by the grid size.
  int* __restrict__ tile_counter = nullptr;
  int device = 0;   // CUDA device index (host side: the once-per-device shared-memory opt-in)
  int max_smem = 0;  // shared memory a CTA may ask for (the device's, or FLASHATTN_MAX_SMEM_KB)

  // KV cache: read only by the cache kernel (fwd_kernel<..., kKvCache = true>),
  // which the host runs for flash_attn_with_kvcache, for a paged or split forward,
  // and for few query rows. Key row j of sequence b (the rows at or after its
  // first key row) is visible iff kv_leftpad[b] <= j < seqused_k[b].
  bool kv_cache = false;                        // run the cache kernel
  const int* __restrict__ seqused_k = nullptr;  // (b,) end of each sequence's keys; nullptr: seqlen_k (or cu_seqlens_k)
  int seqlen_new = 0;  // keys appended after seqused_k[b] (flash_attn_with_kvcache's k/v)
  const int* __restrict__ kv_leftpad = nullptr;  // (b,) first key row; nullptr: 0
  const int* __restrict__ kv_batch_idx = nullptr;  // (b,) cache row of sequence b; nullptr: b
  // Paged K/V: k/v are (num_pages, page_size, h_k, d), k/v_batch_stride the page
  // stride, and key row j of sequence b is row j % page_size of page
  // block_table[b * block_table_batch_stride + j / page_size]. nullptr: contiguous.
  const int* __restrict__ block_table = nullptr;
  index_t block_table_batch_stride = 0;
  int page_size = 0;
  // Split-KV: num_splits CTAs share the key blocks of one query tile and write
  // fp32 partial results, normalised per split: out_accum (splits, b, h, s_q, d)
  // and lse_accum (splits, b, h, s_q), -inf where a split saw no key; the combine
  // kernel merges them into out and softmax_lse. 1: no split.
  int num_splits = 1;
  float* __restrict__ out_accum = nullptr;
  float* __restrict__ lse_accum = nullptr;
  // GQA packing: the pack_gqa = h / h_k query heads of a KV head share the rows of
  // one tile, so that K/V are read once per group. Packed row R is query R / g of
  // query head head_k * g + R % g; seqlen_q and heads are then the packed ones
  // (s_q * g rows, h_k heads), the q/out/lse strides the caller's. 1: off.
  int pack_gqa = 1;
};

// The in-place append of flash_attn_with_kvcache, run before the cache kernel:
// new k/v rows (b, s_new, h_k, d) written into the cache at rows cache_seqlens[b]..,
// k (and q, into q_rot) rotated by the rotary embedding at their positions.
struct KvAppendParams {
  const void* q = nullptr;  // (b, s_q, h, d); rotated into q_rot when rotary_dim > 0
  void* q_rot = nullptr;    // contiguous (b, s_q, h, d)
  const void* k_new = nullptr;  // (b, s_new, h_k, d) or nullptr
  const void* v_new = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* rotary_cos = nullptr;  // (seqlen_ro, rotary_dim / 2), contiguous
  const void* rotary_sin = nullptr;
  index_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  index_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  index_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  index_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;  // the cache (page stride when paged)
  index_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  const int* cache_seqlens = nullptr;  // (b,); nullptr: cache_seqlen for every sequence
  int cache_seqlen = 0;
  const int* kv_batch_idx = nullptr;
  const int* block_table = nullptr;
  index_t block_table_batch_stride = 0;
  int page_size = 0;
  int batch = 0, seqlen_q = 0, seqlen_new = 0, heads = 0, heads_k = 0, head_dim = 0;
  int rotary_dim = 0;         // 0: no rotary
  int rotary_rows = 0;        // seqlen_ro: positions at or past it are left unrotated
  bool rotary_interleaved = true;
  bool q_positions_per_row = false;  // q row i at cache_seqlens[b] + i (causal/local), else all at cache_seqlens[b]
  bool is_bf16 = false;
};

// Backward problem: the forward's inputs plus dout/out/lse, producing dq/dk/dv.
// dk/dv are (b, s_k, h_k, d): GQA groups are reduced inside the kernel, or, with
// kv_head_splits = S > 1, by the host: a group's heads are then shared out over
// S CTAs per key block, heads_k is S x the kv heads (CTA head_k reads K and V
// of kv head head_k / S) and dk/dv point to (b, s_k, h_k, d) partial sums that
// the host adds up.
struct BwdParams : FwdParams {
  const void* __restrict__ dout = nullptr;
  void* __restrict__ dq = nullptr;
  void* __restrict__ dk = nullptr;
  void* __restrict__ dv = nullptr;
  // Workspaces, in rows that hold every query block of every kernel whole:
  // (b, h, seqlen_q_rounded) for a fixed-length batch; (h, total_q + b * 128)
  // for varlen, sequence b from row cu_seqlens_q[b] + b * 128 (bwd_workspace_row0).
  // dq_accum fp32 (rows, head-dim bucket), softmax_d fp32 (rows) rowsum(dout *
  // out), dq_semaphore int32 (rows / 16) counters that order the dq additions
  // in deterministic mode (nullptr otherwise; zeroed by the host).
  float* __restrict__ dq_accum = nullptr;
  float* __restrict__ softmax_d = nullptr;
  int* __restrict__ dq_semaphore = nullptr;
  int seqlen_q_rounded = 0;  // round_up(seqlen_q, kBwdSeqlenQRounding); seqlen_q is the maximum for varlen
  index_t ws_batch_stride = 0, ws_head_stride = 0;  // workspace rows

  index_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  index_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  index_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  index_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;
  int kv_head_splits = 1;
};

constexpr int kBwdSeqlenQRounding = 128;  // >= every backward kBlockM
constexpr int kBwdSemaphoreRows = 16;     // <= every backward kBlockM

}  // namespace flashattn
