// The forward's choice of query tile that the host must know too: ops.cpp
// counts a persistent grid's tiles by it (zeroed_tile_counter).
#pragma once

#include "flashattn/params.h"

namespace flashattn {

// Whether an sm90 forward whose tile has three consumer warpgroups (192 rows, up
// to d64; the kernels whose warpgroups skip rows past a sequence's end) runs two
// (128 rows) instead: where 128-row tiles are no more per head (s_q <= 128, or
// 193 to 256), each then has rows for both its warpgroups, where the last of two
// 192-row tiles has them for one. d64 bf16 on an H100: b256 s197 -5% time (causal
// -9%), s77 -2 to -3.5%; at s300 the 192-row tiles are 32% faster, at 512 14%
// (docs/perf-notes.md). Fixed-length batches only: a varlen batch's lengths vary.
inline bool use_short_query_tiles(const FwdParams& p) {
  return p.cu_seqlens_q == nullptr && (p.seqlen_q <= 128 || (p.seqlen_q > 192 && p.seqlen_q <= 256));
}

}  // namespace flashattn
