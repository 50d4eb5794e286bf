// The KV cache's element-wise kernels, for every dtype (kernel/kv_cache.h).
#include "flashattn/kernel/grid_dependency.h"
#include "flashattn/kernel/kv_cache.h"
#include "flashattn/launch/kv_cache_launch.h"

namespace flashattn {

void launch_combine_splits(const FwdParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen_q;
  const unsigned blocks = unsigned((rows + 3) / 4);
  if (p.is_bf16) {
    launch_after_previous_kernel<&combine_splits_kernel<__nv_bfloat16>>(blocks, 128, 0, stream, p.device, p);
  } else {
    launch_after_previous_kernel<&combine_splits_kernel<__half>>(blocks, 128, 0, stream, p.device, p);
  }
}

void launch_kv_append(const KvAppendParams& p, cudaStream_t stream) {
  const int chunks = p.head_dim / 8;
  const int64_t units = (p.k_new == nullptr ? 0 : int64_t(p.batch) * p.seqlen_new * p.heads_k * chunks) +
                        (p.rotary_dim > 0 ? int64_t(p.batch) * p.seqlen_q * p.heads * chunks : 0);
  if (units == 0) return;
  const unsigned blocks = unsigned((units + 255) / 256);
  if (p.is_bf16) {
    kv_append_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p);
  } else {
    kv_append_kernel<__half><<<blocks, 256, 0, stream>>>(p);
  }
}

}  // namespace flashattn
