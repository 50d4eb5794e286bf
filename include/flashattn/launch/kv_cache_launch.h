// Host side of the KV cache's small kernels (kernel/kv_cache.h), compiled once
// (cpp/kv_cache.cu), not per family and head dim.
#pragma once

#include <cuda_runtime.h>

#include "flashattn/params.h"

namespace flashattn {

// Merges params.num_splits partial results into params.out and softmax_lse.
void launch_combine_splits(const FwdParams& params, cudaStream_t stream);

// flash_attn_with_kvcache's in-place append and rotary embedding.
void launch_kv_append(const KvAppendParams& params, cudaStream_t stream);

}  // namespace flashattn
