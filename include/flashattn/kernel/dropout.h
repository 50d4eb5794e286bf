// Attention dropout with a counter-based generator: every element's keep bit is a
// pure function of (rng_state, batch, head, row, column), so the backward
// regenerates the forward's mask without storing it, in any tile order, and a CUDA
// graph replays it with the seed and offset it finds in device memory (an eager
// call passes their sum as a parameter: FwdParams::rng_seed_offset).
//
// The mask (python/flashattn/reference.py dropout_keep_mask implements the same):
// element (i, j) of query head h of sequence b, with s = the family's
// kPairedRowStride (8 for 16x8 mma atoms, 2 for Volta's 8x8x4):
//   g, r     = j / 8, (i / 2s) * s + i % s           (column group, row pair)
//   x        = Philox4x32-7 with key 0 of the counter
//              (g, r, lo, hi of rng_state[0] + rng_state[1] + b * heads + h)
//   k        = (j % 8 / 2) * 4 + (i / s % 2) * 2 + j % 2
//   kept     = byte k of x (little-endian) < t_lo + (k < n_hi)
// and in families with lane units (kDropoutLaneUnits: sm75, sm80, sm90), whose
// lanes hold their rows' columns in runs of 32 (or of 16 or 8: the sm75 and sm80
// backwards' smallest tiles, whose lanes make a unit for the half or the quarter
// they hold):
//   g        = j / 32 * 4 + j % 8 / 2                (32-column span, lane)
//   x        = Philox4x32-7 with key 0 of the counter (lo, g, hi, r), lo and hi
//              the halves of rng_state[0] + rng_state[1] + b * heads + h
//   k        = (j / 8 % 4) * 4 + (i / s % 2) * 2 + j % 2
// with t_lo + n_hi / 16 = round((1 - p) * 4096) / 16: 16 bytes of a call compare
// with t_lo or t_lo + 1, so that the keep rate is 1 - p within 2^-13 (a byte alone
// would give it in steps of 1/256). Kept probabilities are scaled by 1 / (1 - p).
//
// One call (7 rounds, as FlashAttention-2 and PyTorch's fused attention use; a
// fixed key makes every round key an immediate) gives the 16 elements of rows
// {i, i + s} x 8 columns: in every family's accumulator layout they are held by the
// lanes that differ in kUnitLanes (0x3: 4 lanes of 4 elements; sm70 0x2: 2
// lanes of 8), in the forward's and the backward's tiles alike. Those lanes each
// compute one call of L neighbouring units and swap words in log2(L) butterfly
// rounds. With lane units a call gives one lane's 16 elements (rows {i, i + s} x
// its 2 columns of 4 neighbouring 8-column groups): no swaps, which cost as many
// instructions per element as the compares. Their counter puts the seed in the
// words the first round multiplies and the coordinates in the words it only
// XORs: the first round is the same for every call of a head, and a thread whose
// calls differ in one coordinate (the forward's column group, the backward's row
// pair) multiplies it first in the second round, one round fewer on the path to
// its mask (sm90 forward with dropout +2.7%, d128 +4%; H100, docs/perf-notes.md).
// The bytes compare as fp16 numbers (all finite and non-negative), two per
// instruction.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "flashattn/params.h"

namespace flashattn {

using namespace cute;

// The low and high words of a * b. Written as a 64-bit product in C++, ptxas
// kept adding the product's zero upper words (about 11 more integer adds per
// call); mul.lo and mul.hi of the same operands become one IMAD.WIDE.U32.
__device__ __forceinline__ void mul_wide_u32(uint32_t a, uint32_t b, uint32_t& lo, uint32_t& hi) {
  asm("mul.lo.u32 %0, %2, %3;\n\tmul.hi.u32 %1, %2, %3;" : "=r"(lo), "=r"(hi) : "r"(a), "r"(b));
}

// Philox4x32's round `round` (0-based) with key 0 and its schedule.
__device__ __forceinline__ uint4 philox_round(uint4 c, int round) {
  const uint32_t k0 = 0x9E3779B9u * round, k1 = 0xBB67AE85u * round;
  uint32_t lo0, hi0, lo1, hi1;
  mul_wide_u32(0xD2511F53u, c.x, lo0, hi0);
  mul_wide_u32(0xCD9E8D57u, c.z, lo1, hi1);
  return make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
}

__device__ __forceinline__ uint4 philox4x32_7(uint4 c) {
  CUTE_UNROLL
  for (int round = 0; round < 7; ++round) c = philox_round(c, round);
  return c;
}

// 0xFFFF in each half of the result whose byte (bytes `selector` of `word`, spread
// to the two halves) is below the threshold in that half of `threshold2`.
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t keep_halves(uint32_t word, uint32_t threshold2) {
  uint32_t halves, mask;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(halves) : "r"(word), "n"(kSelector));
  asm("set.lt.u32.f16x2 %0, %1, %2;" : "=r"(mask) : "r"(halves), "r"(threshold2));
  return mask;
}

template <typename Traits, typename = void>
struct DropoutLaneUnits : std::false_type {};
template <typename Traits>
struct DropoutLaneUnits<Traits, std::void_t<decltype(Traits::kDropoutLaneUnits)>>
    : std::bool_constant<Traits::kDropoutLaneUnits> {};
// Lane units: the 8-column groups a lane holds in a row (4: runs of 32 columns;
// 2: runs of 16, the half of a unit its warp holds; 1: single groups, a quarter;
// kDropoutGroupRun where set).
template <typename Traits, typename = void>
struct DropoutGroupRun : std::integral_constant<int, 4> {};
template <typename Traits>
struct DropoutGroupRun<Traits, std::void_t<decltype(Traits::kDropoutGroupRun)>>
    : std::integral_constant<int, Traits::kDropoutGroupRun> {};

// Traits: the family's accumulator facts (kPairedRowStride, kUnitLanes,
// kDropoutLaneUnits where set).
template <typename Traits>
struct Dropout {
  static constexpr bool kLaneUnits = DropoutLaneUnits<Traits>::value;
  static constexpr int kGroupRun = DropoutGroupRun<Traits>::value;
  static_assert(kGroupRun == 4 || kGroupRun == 2 || kGroupRun == 1);
  static constexpr int kRowStride = Traits::kPairedRowStride;
  static constexpr unsigned kLaneMask = Traits::kUnitLanes;
  static constexpr int kLanes = kLaneMask == 0x3 ? 4 : 2;  // lanes sharing a unit
  static constexpr int kPairsPerGroup = 4 / kLanes;        // column pairs a lane holds of 8 columns
  uint64_t counter_base;
  uint32_t threshold, dither;
  uint32_t thresholds2[kLaneUnits ? 8 : 1];  // lane units: FwdParams::dropout_thresholds2

  __device__ Dropout(const FwdParams& p, int batch, int head)
      : threshold(p.dropout_threshold), dither(p.dropout_dither) {
    CUTE_UNROLL
    for (int i = 0; i < (kLaneUnits ? 8 : 1); ++i) thresholds2[i] = p.dropout_thresholds2[i];
    set_head(p, batch, head);
  }

  __device__ void set_head(const FwdParams& p, int batch, int head) { counter_base = counter_of(p, batch, head); }
  // The counter base of a head, for code that keeps only the counter (the sm90
  // backward's mask-making warps).
  __device__ static uint64_t counter_of(const FwdParams& p, int batch, int head) {
    const uint64_t seed_offset =
        p.rng_state != nullptr ? uint64_t(p.rng_state[0]) + uint64_t(p.rng_state[1]) : p.rng_seed_offset;
    return seed_offset + uint64_t(batch) * uint64_t(p.heads) + uint64_t(head);
  }

  // Lane units: the call of column group `group` and row pair `row_pair`, of the
  // head whose counter_base is `counter` (the static form: for code that keeps
  // only the counter, as the backward's mask-making warps do).
  __device__ __forceinline__ static uint4 lane_call(uint64_t counter, uint32_t group, uint32_t row_pair) {
    static_assert(kLaneUnits);
    return philox4x32_7(make_uint4(uint32_t(counter), group, uint32_t(counter >> 32), row_pair));
  }
  __device__ __forceinline__ uint4 lane_call(uint32_t group, uint32_t row_pair) const {
    return lane_call(counter_base, group, row_pair);
  }

  // Lane units: what a call's first three rounds compute from the seed and the row
  // pair alone. The column group enters the counter's second word, which the
  // first round only XORs into the word the second multiplies, so a row pair's
  // calls share the first round's products, the second's of the fourth word and
  // the third's of the first (the forward makes them once per tile: +1-2% with
  // dropout; H100, docs/perf-notes.md). lane_call(prefix, g) equals lane_call(g, r).
  struct LanePrefix {
    uint32_t x1_seed;  // round 1's first word but the group's XOR
    uint32_t w1_key;   // round 1's fourth word, XORed with round 2's key
    uint32_t y2_key;   // round 2's second word, XORed with round 3's key
    uint32_t z3_seed;  // round 3's product of the first word, high half XOR its key
    uint32_t w3;       // round 3's fourth word
  };
  __device__ __forceinline__ LanePrefix lane_prefix(uint32_t row_pair) const {
    constexpr uint32_t kKey0 = 0x9E3779B9u, kKey1 = 0xBB67AE85u;
    uint32_t lo0, hi0, lo1, hi1;
    mul_wide_u32(0xD2511F53u, uint32_t(counter_base), lo0, hi0);  // round 1 (key 0)
    mul_wide_u32(0xCD9E8D57u, uint32_t(counter_base >> 32), lo1, hi1);
    LanePrefix p;
    p.x1_seed = hi1;
    p.w1_key = lo0 ^ kKey1;
    mul_wide_u32(0xCD9E8D57u, hi0 ^ row_pair, lo0, hi0);  // round 2: z1 = hi0 ^ row_pair
    const uint32_t x2 = hi0 ^ lo1 ^ kKey0;
    p.y2_key = lo0 ^ (2 * kKey0);
    mul_wide_u32(0xD2511F53u, x2, lo0, hi0);  // round 3
    p.z3_seed = hi0 ^ (2 * kKey1);
    p.w3 = lo0;
    return p;
  }
  __device__ __forceinline__ static uint4 lane_call(const LanePrefix& p, uint32_t group) {
    uint32_t lo0, hi0, lo1, hi1;
    mul_wide_u32(0xD2511F53u, p.x1_seed ^ group, lo0, hi0);  // round 2
    const uint32_t z2 = hi0 ^ p.w1_key, w2 = lo0;
    mul_wide_u32(0xCD9E8D57u, z2, lo1, hi1);  // round 3
    uint4 c = make_uint4(hi1 ^ p.y2_key, lo1, p.z3_seed ^ w2, p.w3);
    CUTE_UNROLL
    for (int round = 3; round < 7; ++round) c = philox_round(c, round);
    return c;
  }
  // Lane units: the same split with the column group fixed, for code whose calls
  // share a group and differ in the row pair (the sm90 backward's mask-making
  // warps, whose keys stay while the query blocks pass): the first round and the
  // group's products of the second and third. lane_call(group_prefix(counter, g), r)
  // equals lane_call(counter, g, r).
  struct GroupPrefix {
    uint32_t z1_seed;  // round 1's third word but the row pair's XOR
    uint32_t y1_key;   // round 1's second word, XORed with round 2's key
    uint32_t w2_key;   // round 2's fourth word, XORed with round 3's key
    uint32_t x3_part;  // round 3's first word but the row pair's part (round 2's second word)
    uint32_t y3;       // round 3's second word
  };
  __device__ __forceinline__ static GroupPrefix group_prefix(uint64_t counter, uint32_t group) {
    constexpr uint32_t kKey0 = 0x9E3779B9u, kKey1 = 0xBB67AE85u;
    uint32_t lo0, hi0, lo1, hi1;
    mul_wide_u32(0xD2511F53u, uint32_t(counter), lo0, hi0);  // round 1 (key 0)
    mul_wide_u32(0xCD9E8D57u, uint32_t(counter >> 32), lo1, hi1);
    GroupPrefix p;
    p.z1_seed = hi0;
    p.y1_key = lo1 ^ kKey0;
    const uint32_t w1 = lo0;
    mul_wide_u32(0xD2511F53u, hi1 ^ group, lo0, hi0);  // round 2: x1 = hi1 ^ group
    p.w2_key = lo0 ^ (2 * kKey1);
    mul_wide_u32(0xCD9E8D57u, hi0 ^ w1 ^ kKey1, lo1, hi1);  // round 3: z2
    p.x3_part = hi1 ^ (2 * kKey0);
    p.y3 = lo1;
    return p;
  }
  __device__ __forceinline__ static uint4 lane_call(const GroupPrefix& p, uint32_t row_pair) {
    uint32_t lo0, hi0, lo1, hi1;
    mul_wide_u32(0xCD9E8D57u, p.z1_seed ^ row_pair, lo1, hi1);  // round 2
    const uint32_t x2 = hi1 ^ p.y1_key, y2 = lo1;
    mul_wide_u32(0xD2511F53u, x2, lo0, hi0);  // round 3
    uint4 c = make_uint4(p.x3_part ^ y2, p.y3, hi0 ^ p.w2_key, lo0);
    CUTE_UNROLL
    for (int round = 3; round < 7; ++round) c = philox_round(c, round);
    return c;
  }

  // The prefixes of this lane's row pairs in the (rows, cols) view of a tile whose
  // first row is m0 (for_each_mask's coords and coords0).
  template <typename Coords, typename Coords0, int kPairs>
  __device__ __forceinline__ void lane_prefixes(const Coords& coords, const Coords0& coords0, int m0,
                                                LanePrefix (&prefixes)[kPairs]) const {
    static_assert(kPairs * 2 == decltype(size<0>(coords0))::value);
    const uint32_t row = uint32_t(m0 + int(get<0>(coords(0, 0))));
    const uint32_t row_pair0 = row / (2 * kRowStride) * kRowStride + row % kRowStride;
    CUTE_UNROLL
    for (int p = 0; p < kPairs; ++p) prefixes[p] = lane_prefix(row_pair0 + uint32_t(get<0>(coords0(2 * p, 0))) / 2);
  }

  // Lane units: the Philox words of this lane's elements of the (rows, cols) view
  // (for_each_mask's arguments), word p * G + g of row pair p and 8-column group g
  // (G groups; the lane holds 2 columns of each: kWords = rows / 2 * cols / 2).
  // Made ahead of their compares (for_each_mask_of_words): they depend on
  // coordinates only, so they can be made while the tensor cores multiply.
  template <typename Coords, typename Coords0, int kWords>
  __device__ __forceinline__ void make_words(const Coords& coords, const Coords0& coords0, int m0, int n0,
                                             uint32_t (&words)[kWords]) const {
    LanePrefix prefixes[decltype(size<0>(coords0))::value / 2];
    lane_prefixes(coords, coords0, m0, prefixes);
    make_words(prefixes, coords, coords0, n0, words);
  }
  // The same with the row pairs' prefixes made already (lane_prefixes).
  template <int kPairs, typename Coords, typename Coords0, int kWords>
  __device__ __forceinline__ void make_words(const LanePrefix (&prefixes)[kPairs], const Coords& coords,
                                             const Coords0& coords0, int n0, uint32_t (&words)[kWords]) const {
    constexpr int kRows = decltype(size<0>(coords0))::value;
    constexpr int kGroups = decltype(size<1>(coords0))::value / 2;
    static_assert(kLaneUnits && kWords == kRows / 2 * kGroups && kPairs == kRows / 2);
    // A lane's groups come in runs of kGroupRun consecutive ones starting at a
    // multiple of kGroupRun (its warp's runs of columns), so run u of row pair p is
    // groups kGroupRun u.. of the lane's. Runs of 4 are spans: word c of the call
    // is group 4u + c. A run of 2 is half a span: the call's words 0-1 or 2-3; a
    // run of 1 a quarter: word group % 4.
    static_assert(kLanes == 4 && kGroups % kGroupRun == 0, "lane units need runs of 8, 16 or 32 columns per lane");
    const uint32_t group0 = uint32_t(n0 + int(get<1>(coords(0, 0)))) >> 3;
    const uint32_t q = threadIdx.x % 4;
    CUTE_UNROLL
    for (int p = 0; p < kRows / 2; ++p) {
      CUTE_UNROLL
      for (int u = 0; u < kGroups / kGroupRun; ++u) {
        const uint32_t group = group0 + uint32_t(get<1>(coords0(0, 2 * kGroupRun * u))) / 8;
        uint32_t* run = words + p * kGroups + kGroupRun * u;
        if constexpr (kGroupRun == 4) {
          const uint4 x = lane_call(prefixes[p], group + q);
          run[0] = x.x, run[1] = x.y, run[2] = x.z, run[3] = x.w;
        } else if constexpr (kGroupRun == 2) {
          const uint4 x = lane_call(prefixes[p], (group & ~3u) + q);
          const bool upper = group & 2u;
          run[0] = upper ? x.z : x.x, run[1] = upper ? x.w : x.y;
        } else {
          const uint4 x = lane_call(prefixes[p], (group & ~3u) + q);
          const uint32_t place = group & 3u;
          run[0] = place == 0 ? x.x : place == 1 ? x.y : place == 2 ? x.z : x.w;
        }
      }
    }
  }

  // Lane units: for_each_mask's calls of fn from the words make_words made.
  // upper_half: runs of 2 groups, the lane's runs are its spans' second halves
  // (the words' bytes 8-15 of their calls); quarter: runs of 1, the place (0-3)
  // in its span of every group of the lane (a warp's groups repeat every span).
  template <typename Coords0, int kWords, typename Fn>
  __device__ __forceinline__ void for_each_mask_of_words(const Coords0& coords0, const uint32_t (&words)[kWords],
                                                         Fn&& fn, bool upper_half = false, uint32_t quarter = 0) const {
    constexpr int kRows = decltype(size<0>(coords0))::value;
    constexpr int kGroups = decltype(size<1>(coords0))::value / 2;
    // Runs of 1: the lane's two threshold pairs, picked once (selects: an index
    // by quarter would put thresholds2 in local memory).
    uint32_t quarter_thresholds[2] = {thresholds2[0], thresholds2[1]};
    if constexpr (kGroupRun == 1) {
      CUTE_UNROLL
      for (int c = 1; c < 4; ++c) {
        quarter_thresholds[0] = quarter == uint32_t(c) ? thresholds2[2 * c] : quarter_thresholds[0];
        quarter_thresholds[1] = quarter == uint32_t(c) ? thresholds2[2 * c + 1] : quarter_thresholds[1];
      }
    }
    // The threshold pair of threshold slot i of a word's place in its run.
    auto threshold = [&](int i) {
      if constexpr (kGroupRun == 4) return thresholds2[i];
      else if constexpr (kGroupRun == 2) return upper_half ? thresholds2[i + 4] : thresholds2[i];
      else return quarter_thresholds[i];
    };
    CUTE_UNROLL
    for (int p = 0; p < kRows / 2; ++p) {
      CUTE_UNROLL
      for (int g = 0; g < kGroups; ++g) {
        const uint32_t w = words[p * kGroups + g];
        fn(2 * p, 2 * g, keep_halves<0x4140>(w, threshold(2 * (g % kGroupRun))));
        fn(2 * p + 1, 2 * g, keep_halves<0x4342>(w, threshold(2 * (g % kGroupRun) + 1)));
      }
    }
  }

  // Calls fn(r, c, mask) for every pair of elements (r, c), (r, c + 1), c even, of
  // a (rows, cols) accumulator view: mask's low half is 0xFFFF if (r, c) is kept,
  // its high half if (r, c + 1) is. coords / coords0: the (rows, cols) views of
  // this thread's and thread 0's tile coordinates; m0, n0: the tile's first row
  // and column in the sequence. Every lane of the warp must call it.
  template <typename Coords, typename Coords0, typename Fn>
  __device__ __forceinline__ void for_each_mask(const Coords& coords, const Coords0& coords0, int m0, int n0,
                                                Fn&& fn) const {
    constexpr int kRows = decltype(size<0>(coords0))::value;
    constexpr int kCols = decltype(size<1>(coords0))::value;
    constexpr int kGroupCols = 2 * kPairsPerGroup;  // a lane's columns of one 8-column group
    static_assert(kRows % 2 == 0 && kCols % kGroupCols == 0, "rows come in pairs (i, i + s), columns in groups");
    constexpr int kGroups = kCols / kGroupCols;
    constexpr int kUnits = kRows / 2 * kGroups;  // (row pair, 8-column group) units of this lane
    if constexpr (kLaneUnits) {
      uint32_t words[kUnits];
      make_words(coords, coords0, m0, n0, words);
      // Runs start at multiples of their length (key blocks are multiples of 32
      // columns), so the first group's place in its span is every run's.
      const uint32_t group0 = uint32_t(n0 + int(get<1>(coords(0, 0)))) >> 3;
      const bool upper_half = kGroupRun == 2 && (group0 & 2u);
      for_each_mask_of_words(coords0, words, fn, upper_half, kGroupRun == 1 ? group0 & 3u : 0u);
      return;
    }
    // A lane's first row is the lower of a pair and its first column in its group's
    // first 8: thread 0's offsets (multiples of 2s rows and of 8 columns) then step
    // the row pair and the group linearly.
    const uint32_t row = uint32_t(m0 + int(get<0>(coords(0, 0))));
    const uint32_t row_pair0 = row / (2 * kRowStride) * kRowStride + row % kRowStride;
    const uint32_t group0 = uint32_t(n0 + int(get<1>(coords(0, 0)))) >> 3;
    auto row_pair = [&](int u) { return row_pair0 + uint32_t(get<0>(coords0(2 * (u / kGroups), 0))) / 2; };
    auto group = [&](int u) { return group0 + uint32_t(get<1>(coords0(0, kGroupCols * (u % kGroups)))) / 8; };
    const int lane = threadIdx.x % 32;
    auto call = [&](uint32_t g, uint32_t r) {
      return philox4x32_7(make_uint4(g, r, uint32_t(counter_base), uint32_t(counter_base >> 32)));
    };
    const int rank = kLanes == 4 ? lane & 3 : (lane >> 1) & 1;  // this lane's place in its unit's lanes
    // The unit a lane computes in block b is b * L + rank, of row pair (b * L +
    // rank) / kGroups and group (b * L + rank) % kGroups (L and kGroups are powers
    // of two). Row pairs and groups step evenly (an mma tiling repeats evenly), so
    // the rank's share is added once here.
    static_assert(kGroups % kLanes == 0 || kLanes % kGroups == 0);
    const uint32_t rank_row_pairs = kGroups % kLanes == 0 ? 0 : rank / kGroups;
    const uint32_t rank_groups = kGroups % kLanes == 0 ? rank : rank % kGroups;
    const uint32_t rank_row_pair = kRows > 2 ? rank_row_pairs * (row_pair(kGroups) - row_pair(0)) : 0;
    const uint32_t rank_group = kGroups > 1 ? rank_groups * (group(1) - group(0)) : 0;
    // Thresholds of this lane's bytes: byte k of a call is kept below threshold +
    // (k < dither). Word rank + L * pair holds the lane's bytes of pair `pair`.
    uint32_t threshold2[kPairsPerGroup][2];
    CUTE_UNROLL
    for (int pair = 0; pair < kPairsPerGroup; ++pair) {
      const uint32_t k = 4u * uint32_t(rank + kLanes * pair);
      CUTE_UNROLL
      for (int half = 0; half < 2; ++half) {
        const uint32_t b = k + 2 * half;
        threshold2[pair][half] = (threshold + (b < dither)) | ((threshold + (b + 1 < dither)) << 16);
      }
    }
    auto apply = [&](int u, int pair, uint32_t word) {
      const int r = 2 * (u / kGroups), c = kGroupCols * (u % kGroups) + 2 * pair;
      fn(r, c, keep_halves<0x4140>(word, threshold2[pair][0]));
      fn(r + 1, c, keep_halves<0x4342>(word, threshold2[pair][1]));
    };
    constexpr int kBlocks = kUnits / kLanes;
    CUTE_UNROLL
    for (int b = 0; b < kBlocks; ++b) {
      // This lane computes unit b * L + rank; a butterfly over the unit's lanes
      // then leaves slot q + L * pair holding this lane's word `pair` of unit
      // b * L + q (word rank + L * pair of that call).
      const uint4 x = call(group(b * kLanes) + rank_group, row_pair(b * kLanes) + rank_row_pair);
      uint32_t slot[4] = {x.x, x.y, x.z, x.w};
      CUTE_UNROLL
      for (int bit = 1; bit < kLanes; bit <<= 1) {
        // Give the partner the slots whose rank bit is not ours; take its.
        const bool mine_high = rank & bit;
        const unsigned lane_bit = kLanes == 4 ? unsigned(bit) : 2u;
        CUTE_UNROLL
        for (int s = 0; s < 4; ++s) {
          if (s & bit) continue;
          const int hi = s | bit;
          const uint32_t got = __shfl_xor_sync(0xffffffffu, mine_high ? slot[s] : slot[hi], lane_bit);
          if (mine_high) slot[s] = got; else slot[hi] = got;
        }
      }
      CUTE_UNROLL
      for (int q = 0; q < kLanes; ++q) {
        CUTE_UNROLL
        for (int pair = 0; pair < kPairsPerGroup; ++pair) apply(b * kLanes + q, pair, slot[q + kLanes * pair]);
      }
    }
    // Units left over (a tile with fewer units than lanes): every lane computes them
    // and picks its words with selects (indexing by the runtime rank would put the
    // words in local memory).
    CUTE_UNROLL
    for (int u = kBlocks * kLanes; u < kUnits; ++u) {
      const uint4 x = call(group(u), row_pair(u));
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
      CUTE_UNROLL
      for (int pair = 0; pair < kPairsPerGroup; ++pair) {
        uint32_t word = w[kLanes * pair];
        CUTE_UNROLL
        for (int q = 1; q < kLanes; ++q) word = rank == q ? w[q + kLanes * pair] : word;
        apply(u, pair, word);
      }
    }
  }

  // The forward's dropout: zeroes the dropped entries of P (its 16-bit values in
  // the accumulator layout, as a (rows, cols) view) in place. The softmax's row
  // sums keep them: dropped probabilities leave P . V only; the output is scaled
  // by 1 / (1 - p) once, at the end.
  template <typename ProbsRowCol, typename Coords, typename Coords0>
  __device__ __forceinline__ void drop_probabilities(ProbsRowCol&& p_rc, const Coords& coords, const Coords0& coords0,
                                                     int m0, int n0) const {
    for_each_mask(coords, coords0, m0, n0,
                  [&](int r, int c, uint32_t keep) { reinterpret_cast<uint32_t&>(p_rc(r, c)) &= keep; });
  }
  // The same with the words make_words made (lane units).
  template <typename ProbsRowCol, typename Coords0, int kWords>
  __device__ __forceinline__ void drop_probabilities(ProbsRowCol&& p_rc, const Coords0& coords0,
                                                     const uint32_t (&words)[kWords]) const {
    for_each_mask_of_words(coords0, words,
                           [&](int r, int c, uint32_t keep) { reinterpret_cast<uint32_t&>(p_rc(r, c)) &= keep; });
  }
};

}  // namespace flashattn
