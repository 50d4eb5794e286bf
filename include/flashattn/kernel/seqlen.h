// Where a CTA's sequence lives and how long it is: the one place the kernels
// read sequence lengths and batch offsets.
//
// Fixed-length batch: sequence b is q[b], k[b], v[b], every one params.seqlen_q
// by params.seqlen_k long, at b * batch_stride.
// Varlen (params.cu_seqlens_q != nullptr): the sequences are packed along the
// rows, sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of q (and of
// k/v with cu_seqlens_k); params.seqlen_q/k are then the maxima, which size the
// grid, and the host sets the batch strides to 0.
// Either way an element of sequence b sits at
//   b * batch_stride + (row0 + row) * row_stride + head * head_stride.
#pragma once

#include "flashattn/params.h"

namespace flashattn {

struct SeqlenInfo {
  int seqlen_q = 0, seqlen_k = 0;  // this sequence's lengths
  index_t row0_q = 0, row0_k = 0;  // its first row in the packed tensors (0 for a fixed-length batch)
  int batch_k = 0;                 // its batch index in k/v (a KV cache row may differ from q's)

  // kv_cache: also read the cache's per-sequence fields (params.h); a constant
  // false at the call site compiles them out of the other kernels.
  __device__ SeqlenInfo(const FwdParams& p, int batch, bool kv_cache = false) : batch_k(batch) {
    if (p.cu_seqlens_q == nullptr) {
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
    } else {
      row0_q = p.cu_seqlens_q[batch];
      seqlen_q = max(p.cu_seqlens_q[batch + 1] - int(row0_q), 0);
    }
    if (p.cu_seqlens_k != nullptr) {
      row0_k = p.cu_seqlens_k[batch];
      // A decreasing cu_seqlens (bad input) gives an empty sequence, not a negative length.
      seqlen_k = max(p.cu_seqlens_k[batch + 1] - int(row0_k), 0);
    }
    if (kv_cache) {
      if (p.seqused_k != nullptr) seqlen_k = p.seqused_k[batch] + p.seqlen_new;
      if (p.block_table != nullptr) row0_k = 0;  // pages are addressed through the block table
      if (p.kv_batch_idx != nullptr) batch_k = p.kv_batch_idx[batch];
      if (p.kv_leftpad != nullptr) {
        const int pad = p.kv_leftpad[batch];
        row0_k += pad;
        seqlen_k -= pad;
      }
      seqlen_k = max(seqlen_k, 0);
    }
  }

  // Offset of row 0 of this sequence (head 0) in a tensor with these strides.
  __device__ index_t q_offset(index_t batch_stride, index_t row_stride, int batch) const {
    return batch * batch_stride + row0_q * row_stride;
  }
  __device__ index_t k_offset(index_t batch_stride, index_t row_stride, int /*batch*/) const {
    return batch_k * batch_stride + row0_k * row_stride;
  }
  // Index of (head, row 0) in softmax_lse: (b, h, s_q), or (h, total_q) for varlen.
  __device__ index_t lse_offset(const FwdParams& p, int batch, int head) const {
    return batch * p.lse_batch_stride + head * p.lse_head_stride + row0_q;
  }
  // Row of (head, query row 0) in the backward's workspaces (params.h): a
  // varlen sequence starts b * kBwdSeqlenQRounding rows after its packed row,
  // so that its last query block stays whole and apart from the next sequence.
  __device__ index_t workspace_row(const BwdParams& p, int batch, int head) const {
    const index_t row0 = p.cu_seqlens_q == nullptr ? 0 : row0_q + index_t(batch) * kBwdSeqlenQRounding;
    return batch * p.ws_batch_stride + head * p.ws_head_stride + row0;
  }
};

}  // namespace flashattn
