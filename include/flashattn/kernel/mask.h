// Which keys a query row may see: bottom-right aligned causal / sliding-window
// masks and the sequence tail, from one sequence's lengths (SeqlenInfo: a
// varlen sequence is aligned to its own bottom-right). Written against tile
// coordinates, so it holds for every family's accumulator layout.
#pragma once

#include <cute/tensor.hpp>

#include "flashattn/kernel/seqlen.h"
#include "flashattn/params.h"

namespace flashattn {

struct AttentionMask {
  int seqlen_q, seqlen_k;
  int window_left, window_right;  // -1: unbounded
  int64_t diag_offset;            // s_k - s_q: row i's diagonal is column i + s_k - s_q

  // rows_per_query: packed GQA rows (params.pack_gqa), seq.seqlen_q / rows_per_query queries.
  __device__ AttentionMask(const FwdParams& p, const SeqlenInfo& seq, int rows_per_query = 1)
      : seqlen_q(seq.seqlen_q / rows_per_query), seqlen_k(seq.seqlen_k), window_left(p.window_left),
        window_right(p.window_right), diag_offset(int64_t(seq.seqlen_k) - seqlen_q) {}

  // Key blocks [n_begin, n_end) that rows [m0, m0 + block_m) can see.
  __device__ void key_block_range(int m0, int block_m, int block_n, int& n_begin, int& n_end) const {
    const int64_t last_row = min(int64_t(m0) + block_m, int64_t(seqlen_q)) - 1;
    int64_t col_end = seqlen_k;
    if (window_right >= 0) col_end = min(col_end, last_row + diag_offset + window_right + 1);
    int64_t col_begin = 0;
    if (window_left >= 0) col_begin = max(col_begin, int64_t(m0) + diag_offset - window_left);
    n_end = col_end <= 0 ? 0 : int((col_end + block_n - 1) / block_n);
    n_begin = int(col_begin / block_n);
  }

  // Query blocks [m_begin, m_end) whose key_block_range() holds key block
  // n0 / block_n: its exact inverse, so that the backward's key-stationary CTAs
  // visit exactly the (query, key) tiles the forward computed.
  __device__ void query_block_range(int n0, int block_n, int block_m, int& m_begin, int& m_end) const {
    int64_t lo = 0, hi = (int64_t(seqlen_q) + block_m - 1) / block_m;
    if (window_right >= 0) {
      // n < n_end  <=>  last_row >= n0 - diag - window_right, last_row = min(m0 + bm, s_q) - 1
      const int64_t t = int64_t(n0) - diag_offset - window_right;
      if (t > int64_t(seqlen_q) - 1) hi = 0;
      lo = t <= 0 ? 0 : t / block_m;
    }
    if (window_left >= 0) {
      // n >= n_begin  <=>  m0 + diag - window_left < n0 + block_n
      const int64_t u = int64_t(n0) + block_n - diag_offset + window_left;
      hi = min(hi, u <= 0 ? int64_t(0) : (u + block_m - 1) / block_m);
    }
    m_begin = int(lo);
    m_end = int(max(lo, hi));
  }

  // True when some element of the tile (rows m0.., columns n0..) is masked.
  __device__ bool tile_needs_mask(int m0, int block_m, int n0, int block_n) const {
    if (n0 + block_n > seqlen_k) return true;
    if (window_right >= 0 && int64_t(n0) + block_n - 1 > int64_t(m0) + diag_offset + window_right) return true;
    if (window_left >= 0 && int64_t(n0) < int64_t(m0) + block_m - 1 + diag_offset - window_left) return true;
    return false;
  }

  // Adds the ALiBi bias -slope * |row + s_k - s_q - col| (slope in kernel-score
  // units), with the same compile-time-offset scheme as apply() below.
  template <typename Fragment, typename Coords, typename Coords0>
  __device__ void add_alibi(Fragment& scores, const Coords& coords, const Coords0& coords0, int m0, int n0,
                            float slope) const {
    // distance = |(c - r) - diag|, diag = row_base - col_base + s_k - s_q
    const float diag = float(int64_t(m0 + int(cute::get<0>(coords(0)))) + diag_offset -
                             (n0 + int(cute::get<1>(coords(0)))));
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      const float c_minus_r = float(int(cute::get<1>(coords0(i))) - int(cute::get<0>(coords0(i))));
      scores(i) = fmaf(-slope, fabsf(c_minus_r - diag), scores(i));
    }
  }

  // Packed GQA rows (the KV cache kernel): row r of the (row, column) views
  // `scores` and `coords` is query query[r]. Element by element: those tiles are
  // memory-bound.
  template <typename Scores, typename Coords, int kRows>
  __device__ void apply_queries(Scores& scores, const Coords& coords, int n0, const int (&query)[kRows]) const {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t diag = int64_t(query[r]) + diag_offset;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        const int64_t col = n0 + int(cute::get<1>(coords(r, c)));
        if (col >= seqlen_k || (window_right >= 0 && col > diag + window_right) ||
            (window_left >= 0 && col < diag - window_left))
          scores(r, c) = -INFINITY;
      }
    }
  }

  // Sets masked scores of the fragment to -inf. `coords` maps each fragment
  // element to its (row, column) inside the tile, `coords0` the same for
  // thread 0. Layouts are linear, so an element's coordinate is this thread's
  // base plus thread 0's (compile-time) coordinate: comparing compile-time
  // offsets with per-tile scalars keeps the compiler from hoisting one
  // register per element out of the key loop.
  template <typename Fragment, typename Coords, typename Coords0>
  __device__ void apply(Fragment& scores, const Coords& coords, const Coords0& coords0, int m0, int n0) const {
    constexpr int kUnbounded = 1 << 30;
    const int row_base = m0 + int(cute::get<0>(coords(0)));
    const int col_base = n0 + int(cute::get<1>(coords(0)));
    auto clamp = [](int64_t x) { return int(max(int64_t(-kUnbounded), min(int64_t(kUnbounded), x))); };
    // Element (r, c) of thread 0's pattern is visible iff c < cols_end and
    // lo <= c - r <= hi.
    const int cols_end = clamp(int64_t(seqlen_k) - col_base);
    const int64_t diag = int64_t(row_base) + diag_offset - col_base;
    const int hi = window_right >= 0 ? clamp(diag + window_right) : kUnbounded;
    const int lo = window_left >= 0 ? clamp(diag - window_left) : -kUnbounded;
    // The common blocks test one bound per element, not three (a compare and a
    // select instead of three compares and a select): a causal or right-window
    // block whose keys all exist for this thread, and the sequence's last block
    // without a window.
    int last_col = 0;  // of thread 0's pattern: a compile-time constant
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) last_col = max(last_col, int(cute::get<1>(coords0(i))));
    if (window_left < 0 && last_col < cols_end) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(scores); ++i) {
        if (int(cute::get<1>(coords0(i))) - int(cute::get<0>(coords0(i))) > hi) scores(i) = -INFINITY;
      }
    } else if (window_left < 0 && window_right < 0) {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(scores); ++i) {
        if (int(cute::get<1>(coords0(i))) >= cols_end) scores(i) = -INFINITY;
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < cute::size(scores); ++i) {
        const int r = int(cute::get<0>(coords0(i)));
        const int c = int(cute::get<1>(coords0(i)));
        if (c >= cols_end || c - r > hi || c - r < lo) scores(i) = -INFINITY;
      }
    }
  }
};

}  // namespace flashattn
