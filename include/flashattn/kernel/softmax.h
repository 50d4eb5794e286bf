// Online softmax over key blocks, in fp32 with exp2 and the log2(e)-prescaled
// softmax scale. Family-agnostic: the family traits supply the (row, column)
// view of the accumulator and the lanes that share a row.
#pragma once

#include <cute/tensor.hpp>

#include "flashattn/kernel/utils.h"

namespace flashattn {

template <int kRows, unsigned kRowShuffleMask>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // partial per thread until finalize()

  __device__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;
  }

  // scores (rows, cols) of one key block become unnormalised probabilities;
  // out (rows, head_dim) is rescaled to the new running maximum.
  template <typename Scores, typename Out>
  __device__ void update(Scores& scores, Out& out, float scale_log2) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) m = fmaxf(m, scores(r, c));
      m = lane_allreduce<kRowShuffleMask>(m, [](float a, float b) { return fmaxf(a, b); });
      // A row that has seen only masked keys keeps max -inf: use 0 so that
      // exp2(-inf - 0) = 0 instead of NaN.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      const float correction = row_max[r] == -INFINITY ? 0.f : exp2f(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      row_sum[r] *= correction;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float p = exp2f(fmaf(scores(r, c), scale_log2, -m_scaled));
        scores(r, c) = p;
        sum += p;
      }
      row_sum[r] += sum;
    }
  }

  // Normalises out and returns, per row, the log-sum-exp of the scaled
  // scores; +inf for a row that saw no key (its output is 0).
  template <typename Out>
  __device__ void finalize(Out& out, float scale, float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = lane_allreduce<kRowShuffleMask>(row_sum[r], [](float a, float b) { return a + b; });
      const bool empty = sum == 0.f || sum != sum;
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? INFINITY : row_max[r] * scale + __logf(sum);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= inv;
    }
  }
};

}  // namespace flashattn
