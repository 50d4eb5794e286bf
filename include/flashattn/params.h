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

  float dropout_p = 0.f;
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;

  bool is_bf16 = false;
  int num_sms = 0;  // of the device, for grid heuristics
  int device = 0;   // CUDA device index (host side: the once-per-device shared-memory opt-in)
};

// Backward problem: the forward's inputs plus dout/out/lse, producing dq/dk/dv.
// dk/dv are (b, s_k, h_k, d): GQA groups are reduced inside the kernel.
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
};

constexpr int kBwdSeqlenQRounding = 128;  // >= every backward kBlockM
constexpr int kBwdSemaphoreRows = 16;     // <= every backward kBlockM

}  // namespace flashattn
