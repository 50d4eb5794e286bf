// Plain structs handed from the host to the kernels. No torch, no CuTe.
#pragma once

#include <cstdint>

namespace flashattn {

using index_t = int64_t;  // every offset is 64-bit: tensors may exceed 2^31 elements

// Forward problem: q (b, s_q, h, d), k/v (b, s_k, h_k, d), out like q,
// softmax_lse (b, h, s_q) fp32 contiguous. Strides are in elements; the last
// dim is contiguous. A stride may be anything else (views of packed qkv).
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
  // Workspaces, (b, h, seqlen_q_rounded, ...) so that every query block of
  // every kernel is whole: dq_accum fp32 (.., head-dim bucket), softmax_d fp32
  // rowsum(dout * out), dq_semaphore int32 (.., seqlen_q_rounded / 16) counters
  // that order the dq additions in deterministic mode (nullptr otherwise).
  float* __restrict__ dq_accum = nullptr;
  float* __restrict__ softmax_d = nullptr;
  int* __restrict__ dq_semaphore = nullptr;
  int seqlen_q_rounded = 0;  // multiple of kBwdSeqlenQRounding

  index_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  index_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  index_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  index_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;
};

constexpr int kBwdSeqlenQRounding = 128;  // >= every backward kBlockM
constexpr int kBwdSemaphoreRows = 16;     // <= every backward kBlockM

}  // namespace flashattn
