// Online softmax over key blocks, in fp32 with exp2 and the log2(e)-prescaled
// softmax scale. Family-agnostic: the family traits supply the (row, column)
// view of the accumulator and the lanes that share a row.
#pragma once

#include <cute/tensor.hpp>

#include "flashattn/kernel/utils.h"

namespace flashattn {

// kMaxGrowthLog2 > 0: a row keeps its running maximum until a key block's scores
// exceed it by more than kMaxGrowthLog2 in log2 units. The probabilities are
// then relative to a maximum a little below the true one (up to 2^kMaxGrowthLog2,
// far from any 16-bit or fp32 limit) and the output's correction is exactly 1,
// so a kernel can skip the rescale (any_rescale). The result is the same: the
// lse is built from the maximum actually subtracted. 0: the exact maximum.
template <int kRows, unsigned kRowShuffleMask, int kMaxGrowthLog2 = 0>
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
      update_row(r, scores, scale_log2, [&](float correction) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction;
      });
    }
  }

  // update() without the output, for a kernel that multiplies the last block's
  // probabilities while it exponentiates the next: scores become probabilities,
  // and correction[r] is what the output so far must be scaled by (rescale())
  // before those probabilities add to it.
  template <typename Scores>
  __device__ void exponentiate(Scores& scores, float scale_log2, float (&correction)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      update_row(r, scores, scale_log2, [&](float c) { correction[r] = c; });
    }
  }

  // Row r: the new running maximum, the correction of the rows' state so far
  // (row_sum scaled; `with_correction` gets it before the exponentials, where
  // update() rescales the output), then the row's probabilities.
  template <typename Scores, typename WithCorrection>
  __device__ void update_row(int r, Scores& scores, float scale_log2, WithCorrection&& with_correction) {
    float m = row_max[r];
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) m = fmaxf(m, scores(r, c));
    m = lane_allreduce<kRowShuffleMask>(m, [](float a, float b) { return fmaxf(a, b); });
    if constexpr (kMaxGrowthLog2 > 0) {
      if (row_max[r] != -INFINITY && (m - row_max[r]) * scale_log2 <= float(kMaxGrowthLog2)) m = row_max[r];
    }
    // A row that has seen only masked keys keeps max -inf: use 0 so that
    // exp2(-inf - 0) = 0 instead of NaN.
    const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
    // The maxima's difference first, then the scale: exactly 1 when the maximum
    // did not move. (exp2(old * scale - m_scaled) carries m_scaled's rounding,
    // up to 1e-4 when scores are in the thousands, into every key block: a
    // systematic drift of row_sum, and so of the lse, by ~0.5% over 4k keys.)
    const float correction = row_max[r] == -INFINITY ? 0.f : exp2f((row_max[r] - m) * scale_log2);
    row_max[r] = m;
    row_sum[r] *= correction;
    with_correction(correction);
    float sum = 0.f;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      const float p = exp2f(fmaf(scores(r, c), scale_log2, -m_scaled));
      scores(r, c) = p;
      sum += p;
    }
    row_sum[r] += sum;
  }

  // Whether any lane of the warp has a row whose output needs its correction
  // (warp-uniform, for a branch around rescale()).
  __device__ static bool any_rescale(const float (&correction)[kRows]) {
    bool needed = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) needed |= correction[r] != 1.f;
    return __any_sync(0xffffffffu, needed);
  }

  template <typename Out>
  __device__ static void rescale(Out& out, const float (&correction)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction[r];
    }
  }

  // Normalises out and returns, per row, the log-sum-exp of the scaled
  // scores (natural log); +inf for a row that saw no key (its output is 0).
  // The lse is built from the very maximum update() subtracted (m * scale_log2,
  // the same fp32 product) plus log2(sum), and rounded once in effect: the
  // backward recomputes P = exp2(s * scale_log2 - lse * log2(e)), and with scores
  // in the thousands each extra fp32 rounding of the lse (~1e-4 there) would be
  // a relative error of P.
  template <typename Out>
  __device__ void finalize(Out& out, float scale_log2, float (&lse)[kRows]) {
    finalize_scaled<false>(out, scale_log2, lse, 1.f);
  }
  // The same with out scaled by out_scale on top (dropout's 1 / (1 - p)).
  template <typename Out>
  __device__ void finalize(Out& out, float scale_log2, float (&lse)[kRows], float out_scale) {
    finalize_scaled<true>(out, scale_log2, lse, out_scale);
  }

 private:
  // kScaled false: 1 / sum as written before out_scale existed (a constant 1 for
  // out_scale moves ptxas's register allocation in the families that never scale).
  template <bool kScaled, typename Out>
  __device__ void finalize_scaled(Out& out, float scale_log2, float (&lse)[kRows], float out_scale) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = lane_allreduce<kRowShuffleMask>(row_sum[r], [](float a, float b) { return a + b; });
      const bool empty = sum == 0.f || sum != sum;
      const float inv = empty ? 0.f : (kScaled ? out_scale : 1.f) / sum;
      const float m_scaled = row_max[r] * scale_log2;
      // (m_scaled + log2(sum)) * ln 2 within half an fp32 spacing, in float
      // arithmetic: the sum as an exact pair s + e (TwoSum), s * ln 2 as an exact
      // pair hi + FMA's remainder, the small terms added first. (Double
      // conversions cost the short-sequence sm90 forward ~2%, docs/perf-notes.md.)
      constexpr float kLn2 = 0.693147182464599609375f;   // ln 2 rounded to float
      constexpr float kLn2Lo = -1.904654299957768e-09f;  // ln 2 - kLn2
      const float log2_sum = __log2f(sum);
      const float s = m_scaled + log2_sum;
      const float s_m = s - m_scaled;
      const float e = (m_scaled - (s - s_m)) + (log2_sum - s_m);
      const float hi = s * kLn2;
      const float lo = fmaf(s, kLn2, -hi) + fmaf(e, kLn2, s * kLn2Lo);
      lse[r] = empty ? INFINITY : hi + lo;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= inv;
    }
  }
};

}  // namespace flashattn
