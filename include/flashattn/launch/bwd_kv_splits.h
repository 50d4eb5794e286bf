// Host side of the backward's kv-split sum (cpp/bwd_kv_splits.cu), compiled
// once, not per family and head dim.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashattn {

// part: the kernel's contiguous (batch * rows, heads_k * splits, head_dim)
// partial gradients, a kv head's splits side by side; out: dk or dv, (batch,
// rows, heads_k, head_dim) with the last dim contiguous (varlen: batch 1, rows
// the packed keys, out_batch_stride 0).
struct KvSplitSumParams {
  const void* part = nullptr;
  void* out = nullptr;
  int batch = 0, heads_k = 0, splits = 0, head_dim = 0;
  int64_t rows = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  bool is_bf16 = false;
};

void launch_sum_kv_splits(const KvSplitSumParams& params, cudaStream_t stream);

}  // namespace flashattn
