// The backward's sum of a GQA group's partial dk, dv (params.h kv_head_splits):
// an element-wise kernel compiled once, not per family and head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "flashattn/launch/bwd_kv_splits.h"

namespace flashattn {

// One thread per output element: out[b, r, kh, i] = sum over s of
// part[b * rows + r, kh * splits + s, i], added in fp32 in split order.
template <typename Element>
__global__ void sum_kv_splits_kernel(KvSplitSumParams p) {
  const int64_t n = int64_t(p.batch) * p.rows * p.heads_k * p.head_dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(e % p.head_dim);
    const int64_t t = e / p.head_dim;
    const int kh = int(t % p.heads_k);
    const int64_t row = t / p.heads_k;  // batch * rows + r
    const Element* src = static_cast<const Element*>(p.part) + (row * p.heads_k + kh) * p.splits * p.head_dim + i;
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += float(src[s * p.head_dim]);
    const int64_t b = row / p.rows, r = row % p.rows;
    static_cast<Element*>(p.out)[b * p.out_batch_stride + r * p.out_row_stride + kh * p.out_head_stride + i] =
        Element(sum);
  }
}

void launch_sum_kv_splits(const KvSplitSumParams& p, cudaStream_t stream) {
  const int64_t n = int64_t(p.batch) * p.rows * p.heads_k * p.head_dim;
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65536));
  if (p.is_bf16) {
    sum_kv_splits_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p);
  } else {
    sum_kv_splits_kernel<__half><<<blocks, 256, 0, stream>>>(p);
  }
}

}  // namespace flashattn
