// Tile scheduling: which work tile a CTA computes, and the grid that covers
// every tile. One place for it, so that another schedule (split-KV, persistent
// CTAs) plugs in beside this one without touching the main loops.
//
// The grid is 1-D (no 65535 limit on heads or batch). A fixed-length batch has
// ceil(seqlen / kBlock) tiles per (head, sequence). A varlen batch numbers the
// tiles of all its sequences compactly (varlen_sequence_of), so that the grid
// follows the total token count, not batch x the longest sequence: a batch of
// short sequences beside a long one launches no CTAs for tiles that do not exist.
#pragma once

#include <cstdint>

#include "flashattn/params.h"

namespace flashattn {

// Varlen tile numbering, per head: sequence b's tiles start at slot
// cu[b] / kBlock + b. The starts increase with b and leave room for all of b's
// tiles (with cu[b] = a * kBlock + r: ceil(s_b / kBlock) <= floor((r + s_b) /
// kBlock) + 1), so total / kBlock + batch slots hold every tile, at most `batch`
// of them spare. Returns the sequence whose slots hold `slot`: the last b with
// start(b) <= slot, found by each warp on its own, 32 probes per round (a batch
// of up to 1024 sequences takes two rounds of cached loads); -1 if cu[0] > 0.
template <int kBlock>
__device__ __forceinline__ int varlen_sequence_of(const int* cu, int batch, int slot) {
  const int lane = threadIdx.x % 32;
  int lo = 0, n = batch;  // the answer is in [lo, lo + n)
  while (n > 1) {
    const int step = (n + 31) / 32;
    const int probe = lo + lane * step;
    const bool at_or_before = lane * step < n && __ldg(cu + probe) / kBlock + probe <= slot;
    const unsigned ballot = __ballot_sync(0xffffffffu, at_or_before);
    if (ballot == 0) return -1;
    const int last = 31 - __clz(ballot);
    lo += last * step;
    n = min(step, n - last * step);
  }
  return cu[lo] / kBlock + lo <= slot ? lo : -1;
}

template <int kBlock>
__host__ __device__ inline int varlen_num_slots(int total, int batch) {
  return total / kBlock + batch;
}

// A block index past every sequence's end: the CTA of a spare varlen slot gets
// it and returns at its first length check (block * kBlock >= seqlen).
template <int kBlock>
constexpr int kSpareBlock = (1 << 30) / kBlock;

struct VarlenTile {
  int batch, block;
};

// The (sequence, block) of a varlen slot: the block in launch order, reversed
// within the sequence when `reverse`; kSpareBlock for a spare slot.
template <int kBlock>
__device__ __forceinline__ VarlenTile varlen_tile(const int* cu, int batch_count, int slot, bool reverse) {
  VarlenTile t{varlen_sequence_of<kBlock>(cu, batch_count, slot), kSpareBlock<kBlock>};
  if (t.batch >= 0) {
    const int block = slot - (cu[t.batch] / kBlock + t.batch);
    const int num_blocks = (cu[t.batch + 1] - cu[t.batch] + kBlock - 1) / kBlock;
    if (block < num_blocks) t.block = reverse ? num_blocks - 1 - block : block;
  }
  t.batch = max(t.batch, 0);
  return t;
}

// Heaviest tiles first (under a causal or right-window mask) means the tiles
// of one block index across many (head, sequence) pairs run together, and each
// pair's shared operands (for the backward: Q, dO and the dQ accumulator) are
// read again from memory by every wave. L2 sections bound that: the order runs
// one section of pairs after the other, a section holding as many pairs as half
// the L2 keeps (bytes_per_pair each), heaviest block first within it. Returns
// the block's rank by weight (0: heaviest) and the pair.
//
// Except in a grid of one to four waves (num_sms < tiles <= 4 num_sms) whose
// pairs' operands come to at most three L2s: there the grid is one section.
// There a triangular mask's heaviest tile is at least half an SM's share of the
// work, and the last section's heaviest tiles would start only once the other
// sections were done, then run on alone. A GQA group's heads in one CTA make
// such grids: b4, 4 kv heads, 2k tokens, d128 is 256 tiles of up to 128
// iterations and 134 MB of operands; one section made its backward 16% faster
// on an H100 (d64: 37%). With more operands (the same shape at d256, 268 MB)
// the sections' reuse of L2 counted for more: one section was 23% slower.
struct SectionedTile {
  int rank;
  int64_t pair;
};
__device__ __forceinline__ SectionedTile sectioned_tile(int64_t index, int num_blocks, int64_t num_pairs,
                                                        int64_t bytes_per_pair, int l2_bytes, int num_sms) {
  int64_t section = int64_t(l2_bytes) / 2 / (bytes_per_pair > 0 ? bytes_per_pair : 1);
  const int64_t tiles = num_pairs * num_blocks;
  if (tiles > num_sms && tiles <= 4 * int64_t(num_sms) && num_pairs * bytes_per_pair <= 3 * int64_t(l2_bytes))
    section = num_pairs;
  section = section < 1 ? 1 : section > num_pairs ? num_pairs : section;
  const int64_t first = index / (section * num_blocks) * section;
  const int64_t width = num_pairs - first < section ? num_pairs - first : section;
  const int64_t r = index - first * num_blocks;
  return {int(r / width), first + r % width};
}

// Forward (and the backward's row kernels): (query block, head, sequence).
// Fixed-length: query block fastest, then head, then sequence. Varlen: the
// compact slots of one head, then the next head. Under a causal or window mask
// the last query blocks of a sequence see the most keys: they start first, so
// that the longest CTAs do not run last.
//
// kSplits (the KV cache kernel): params.num_splits CTAs side by side share one
// query tile, each taking its share of the key blocks (split_key_blocks).
template <int kBlockM, bool kSplits = false>
struct QueryTileScheduler {
  int m_block, head, batch;
  int split = 0;

  __host__ __device__ static int num_m_blocks(int seqlen) { return (seqlen + kBlockM - 1) / kBlockM; }
  // < 2^31 CTAs: checked on the host (more would need more memory than exists).
  // Also the number of tiles, which a persistent grid's CTAs share out.
  __host__ __device__ static unsigned num_ctas(const FwdParams& p) {
    const int64_t per_head = p.cu_seqlens_q == nullptr ? int64_t(num_m_blocks(p.seqlen_q)) * p.batch
                                                       : varlen_num_slots<kBlockM>(p.total_q, p.batch);
    return unsigned(per_head * p.heads * (kSplits ? p.num_splits : 1));
  }

  // A persistent grid: one CTA per SM (a CTA fills one). Its CTA c starts with
  // tile c; then, where every tile weighs alike (a fixed-length batch without a
  // causal or right-window mask), it steps through the tiles by the grid size,
  // else it takes the next tile in order (heaviest first within a sequence) from
  // p.tile_counter, as soon as it is free. Without a counter where tiles differ,
  // one CTA per tile: the GPU hands each to whichever SM is free.
  static unsigned num_persistent_ctas(const FwdParams& p) {
    const unsigned tiles = num_ctas(p);
    const bool even = p.cu_seqlens_q == nullptr && p.window_right < 0;
    const bool persistent = !kSplits && p.num_sms > 0 && (even || p.tile_counter != nullptr);
    return persistent && tiles > unsigned(p.num_sms) ? unsigned(p.num_sms) : tiles;
  }

  __device__ explicit QueryTileScheduler(const FwdParams& p) : QueryTileScheduler(p, blockIdx.x) {}

  // Tile `index` of the grid.
  __device__ QueryTileScheduler(const FwdParams& p, int64_t index) {
    const bool reverse = p.window_right >= 0;
    int64_t bid = index;
    if constexpr (kSplits) {
      split = int(bid % p.num_splits);
      bid /= p.num_splits;
    }
    if (p.cu_seqlens_q == nullptr) {
      const int num_m = num_m_blocks(p.seqlen_q);
      const int m = int(bid % num_m);
      const int64_t bh = bid / num_m;
      m_block = reverse ? num_m - 1 - m : m;
      head = int(bh % p.heads);
      batch = int(bh / p.heads);
    } else {
      const int slots = varlen_num_slots<kBlockM>(p.total_q, p.batch);
      head = int(bid / slots);
      const VarlenTile t = varlen_tile<kBlockM>(p.cu_seqlens_q, p.batch, int(bid % slots), reverse);
      batch = t.batch;
      m_block = t.block;
    }
  }
};

// Key blocks [n_begin, n_end) of a query tile shared out among num_splits CTAs:
// this split's share, as even as whole blocks allow (empty only when there are
// fewer blocks than splits).
__device__ __forceinline__ void split_key_blocks(int split, int num_splits, int& n_begin, int& n_end) {
  const int blocks = max(n_end - n_begin, 0);
  const int first = n_begin;
  n_begin = first + int(int64_t(blocks) * split / num_splits);
  n_end = first + int(int64_t(blocks) * (split + 1) / num_splits);
}

// Backward: (key block, kv head, sequence). Key block fastest, so that CTAs
// running together share Q and dO in L2. Fixed-length under a causal mask the
// first key blocks are seen by the most queries: there block 0 of every (kv
// head, sequence) of an L2 section starts first, then block 1, ... Varlen:
// compact slots per kv head, key blocks in order. Either way a smaller key block
// of the same (head, sequence) has a smaller index: in deterministic mode a CTA
// waits only for those.
template <int kBlockN>
struct KeyTileScheduler {
  int n_block, head_k, batch;

  __host__ __device__ static int num_n_blocks(int seqlen) { return (seqlen + kBlockN - 1) / kBlockN; }
  static unsigned num_ctas(const FwdParams& p) {
    const int64_t per_head = p.cu_seqlens_k == nullptr ? int64_t(num_n_blocks(p.seqlen_k)) * p.batch
                                                       : varlen_num_slots<kBlockN>(p.total_k, p.batch);
    return unsigned(per_head * p.heads_k);
  }

  __device__ explicit KeyTileScheduler(const FwdParams& p) {
    if (p.cu_seqlens_k == nullptr) {
      const int num_n = num_n_blocks(p.seqlen_k);
      int64_t bhk = blockIdx.x / num_n;
      n_block = int(blockIdx.x % num_n);
      if (p.window_right >= 0) {  // heavy first: Q, dO (16-bit) and the fp32 dQ sum of a kv head's group
        const int64_t bytes = int64_t(p.seqlen_q) * (p.heads / p.heads_k) * p.head_dim * (2 + 2 + 4);
        const SectionedTile t =
            sectioned_tile(blockIdx.x, num_n, int64_t(p.heads_k) * p.batch, bytes, p.l2_bytes, p.num_sms);
        n_block = t.rank;
        bhk = t.pair;
      }
      head_k = int(bhk % p.heads_k);
      batch = int(bhk / p.heads_k);
    } else {
      const int slots = varlen_num_slots<kBlockN>(p.total_k, p.batch);
      head_k = int(blockIdx.x / slots);
      const VarlenTile t = varlen_tile<kBlockN>(p.cu_seqlens_k, p.batch, int(blockIdx.x % slots), false);
      batch = t.batch;
      n_block = t.block;
    }
  }
};

}  // namespace flashattn
