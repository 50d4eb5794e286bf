// The KV cache's two small kernels, beside the attention kernel: the in-place
// append of new keys/values (with the rotary embedding), and the merge of the
// split-KV partial results. Element-wise, no tensor cores: written once for
// every GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashattn/kernel/grid_dependency.h"
#include "flashattn/params.h"

namespace flashattn {

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// Eight consecutive elements: one 16-byte load or store.
template <typename T>
struct alignas(16) Vec8 {
  T v[8];
};

// ---- split-KV: merge the partial results -----------------------------------
//
// One warp per (sequence, head, query row), in the attention kernel's (packed)
// coordinates: lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s,
// written to the caller's (query, head). A row that no split saw a key of gets
// out 0 and lse +inf, as without splits.
template <typename Element>
__global__ void __launch_bounds__(128) combine_splits_kernel(const FwdParams p) {
  wait_for_previous_kernel();  // the splits' results (launched as a dependent: kv_cache.cu)
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen_q;
  const int64_t id = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // ((b * h) + head) * s_q + row
  if (id >= rows) return;
  const int row = int(id % p.seqlen_q);
  const int head = int(id / p.seqlen_q % p.heads);
  const int batch = int(id / p.seqlen_q / p.heads);
  const float* lse_part = p.lse_accum + id;  // split s at s * rows
  const int splits = p.num_splits;

  // Packed GQA rows: packed row `row` of KV head `head` is query row / g of head head * g + row % g.
  const int group = p.pack_gqa;
  const int query = row / group, query_head = head * group + row % group;

  // Each lane holds the lse of splits lane, lane + 32, ... (at most 128 splits).
  float part[4];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = lane + 32 * i;
    part[i] = s < splits ? lse_part[s * rows] : -INFINITY;
    m = fmaxf(m, part[i]);
  }
  for (int bit = 16; bit > 0; bit /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, bit));
  const bool empty = m == -INFINITY;
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) sum += empty ? 0.f : expf(part[i] - m);
  for (int bit = 16; bit > 0; bit /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, bit);
  // In double, rounded once: the backward recomputes P from this lse (softmax.h).
  const float lse = empty ? INFINITY : float(double(m) + log(double(sum)));

  // The splits' weights, through shared memory to every lane; then the weighted
  // sum, unrolled so that several splits' loads are in flight at once.
  __shared__ float weights[4][128];
  float* w = weights[threadIdx.x / 32];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[lane + 32 * i] = empty ? 0.f : expf(part[i] - lse);
  __syncwarp();
  Element* out = static_cast<Element*>(p.out) + batch * p.out_batch_stride + query * p.out_row_stride +
                 query_head * p.out_head_stride;
  const float* out_part = p.out_accum + id * p.head_dim;  // split s at s * rows * head_dim
  for (int c = lane * 4; c < p.head_dim; c += 128) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      const float ws = w[s];
      const float4 o = *reinterpret_cast<const float4*>(out_part + s * rows * p.head_dim + c);
      acc[0] = fmaf(ws, o.x, acc[0]);
      acc[1] = fmaf(ws, o.y, acc[1]);
      acc[2] = fmaf(ws, o.z, acc[2]);
      acc[3] = fmaf(ws, o.w, acc[3]);
    }
    struct alignas(8) {
      Element v[4];
    } packed;
    for (int i = 0; i < 4; ++i) packed.v[i] = from_float<Element>(acc[i]);
    *reinterpret_cast<decltype(packed)*>(out + c) = packed;
  }
  if (lane == 0) p.softmax_lse[batch * p.lse_batch_stride + query_head * p.lse_head_stride + query] = lse;
}

// ---- flash_attn_with_kvcache's append and rotary embedding -----------------
//
// One thread per 8 columns of one row of one head: first the new k/v rows
// (b, s_new, h_k), then, with a rotary embedding, the q rows (b, s_q, h). A
// rotated pair is (2i, 2i + 1) (interleaved) or (i, i + rotary_dim / 2): with
// rotary_dim % 16 == 0 the 8 columns of a thread never split a pair, and in the
// second case the thread of the first half rotates the second half's columns too.

// Cache row `row` of sequence `batch`: its offset from the head's origin.
__device__ __forceinline__ int64_t cache_row_offset(const KvAppendParams& p, int batch, int row,
                                                    index_t batch_stride, index_t row_stride) {
  if (p.block_table != nullptr) {
    const int page = p.block_table[batch * p.block_table_batch_stride + row / p.page_size];
    return int64_t(page) * batch_stride + int64_t(row % p.page_size) * row_stride;
  }
  const int cache_batch = p.kv_batch_idx != nullptr ? p.kv_batch_idx[batch] : batch;
  return int64_t(cache_batch) * batch_stride + int64_t(row) * row_stride;
}

// Rotates 8 columns at position `pos` (and, non-interleaved, their partner 8
// columns rotary_dim / 2 on) and stores them. Columns at or past rotary_dim copy,
// and so do rows whose position the tables do not hold: a q row past the cache's
// end under a causal or local mask, which the host refuses where it can see the
// sizes (it cannot inside a CUDA graph) — never a read past the tables.
template <typename Element>
__device__ __forceinline__ void rotate_store(const KvAppendParams& p, const Element* src, Element* dst, int col,
                                             int pos) {
  Vec8<Element> x = *reinterpret_cast<const Vec8<Element>*>(src + col);
  if (col >= p.rotary_dim || pos >= p.rotary_rows) {
    *reinterpret_cast<Vec8<Element>*>(dst + col) = x;
    return;
  }
  const int half = p.rotary_dim / 2;
  const Element* cos_row = static_cast<const Element*>(p.rotary_cos) + int64_t(pos) * half;
  const Element* sin_row = static_cast<const Element*>(p.rotary_sin) + int64_t(pos) * half;
  if (p.rotary_interleaved) {
    Vec8<Element> y;
    for (int i = 0; i < 4; ++i) {
      const float c = to_float(cos_row[col / 2 + i]), s = to_float(sin_row[col / 2 + i]);
      const float a = to_float(x.v[2 * i]), b = to_float(x.v[2 * i + 1]);
      y.v[2 * i] = from_float<Element>(a * c - b * s);
      y.v[2 * i + 1] = from_float<Element>(a * s + b * c);
    }
    *reinterpret_cast<Vec8<Element>*>(dst + col) = y;
    return;
  }
  if (col >= half) return;  // the second half: rotated by the thread of its first half
  const Vec8<Element> x2 = *reinterpret_cast<const Vec8<Element>*>(src + col + half);
  Vec8<Element> y, y2;
  for (int i = 0; i < 8; ++i) {
    const float c = to_float(cos_row[col + i]), s = to_float(sin_row[col + i]);
    const float a = to_float(x.v[i]), b = to_float(x2.v[i]);
    y.v[i] = from_float<Element>(a * c - b * s);
    y2.v[i] = from_float<Element>(a * s + b * c);
  }
  *reinterpret_cast<Vec8<Element>*>(dst + col) = y;
  *reinterpret_cast<Vec8<Element>*>(dst + col + half) = y2;
}

template <typename Element>
__global__ void __launch_bounds__(256) kv_append_kernel(const KvAppendParams p) {
  const int chunks = p.head_dim / 8;
  const int64_t kv_units = p.k_new == nullptr ? 0 : int64_t(p.batch) * p.seqlen_new * p.heads_k * chunks;
  const int64_t q_units = p.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.heads * chunks : 0;
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= kv_units + q_units) return;
  auto first_row = [&](int b) { return p.cache_seqlens != nullptr ? p.cache_seqlens[b] : p.cache_seqlen; };
  if (unit < kv_units) {
    const int col = int(unit % chunks) * 8;
    const int head = int(unit / chunks % p.heads_k);
    const int j = int(unit / chunks / p.heads_k % p.seqlen_new);
    const int b = int(unit / chunks / p.heads_k / p.seqlen_new);
    const int row = first_row(b) + j;
    const Element* k_src = static_cast<const Element*>(p.k_new) + b * p.k_new_batch_stride +
                           j * p.k_new_row_stride + head * p.k_new_head_stride;
    const Element* v_src = static_cast<const Element*>(p.v_new) + b * p.v_new_batch_stride +
                           j * p.v_new_row_stride + head * p.v_new_head_stride;
    Element* k_dst = static_cast<Element*>(p.k_cache) +
                     cache_row_offset(p, b, row, p.k_batch_stride, p.k_row_stride) + head * p.k_head_stride;
    Element* v_dst = static_cast<Element*>(p.v_cache) +
                     cache_row_offset(p, b, row, p.v_batch_stride, p.v_row_stride) + head * p.v_head_stride;
    rotate_store(p, k_src, k_dst, col, row);
    *reinterpret_cast<Vec8<Element>*>(v_dst + col) = *reinterpret_cast<const Vec8<Element>*>(v_src + col);
    return;
  }
  const int64_t u = unit - kv_units;
  const int col = int(u % chunks) * 8;
  const int head = int(u / chunks % p.heads);
  const int i = int(u / chunks / p.heads % p.seqlen_q);
  const int b = int(u / chunks / p.heads / p.seqlen_q);
  const int pos = first_row(b) + (p.q_positions_per_row ? i : 0);
  const Element* q_src = static_cast<const Element*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride +
                         head * p.q_head_stride;
  Element* q_dst = static_cast<Element*>(p.q_rot) + ((int64_t(b) * p.seqlen_q + i) * p.heads + head) * p.head_dim;
  rotate_store(p, q_src, q_dst, col, pos);
}

}  // namespace flashattn
