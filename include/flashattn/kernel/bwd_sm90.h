// The sm90 family's warp-specialised backward (Hopper, sm_90a): the shared
// backward's algorithm (kernel/bwd.h: one CTA per key block walks the query
// blocks of its GQA group) with its loads taken off the consumers' path. One
// producer warpgroup copies Q, dO, lse and D of the next (query head, query
// block) into a ring of shared-memory stages (Q and dO by TMA from one lane, lse
// and D by its warp) while two consumer warpgroups run the five products as
// warpgroup MMAs. Two loops:
// - keys as rows (d <= 128): S^T = K Q^T, dP^T = V dO^T, P^T and dS^T
//   (p_and_ds), dV += P^T dO and dK += dS^T Q from registers, dQ = dS K from dS^T
//   in shared memory, added into the fp32 accumulator (add_dq). Each warpgroup's
//   rows are its own keys, so only dQ waits for both: the consumers meet once per
//   iteration, after dV is issued. Dropout's keep masks follow the forward's
//   rows: the warpgroups exchange them through shared memory (KeepExchange).
// - queries as rows (d > 128, where the warpgroups split the head dim of dK and
//   dV): S = Q K^T, dP = dO V^T, P and dS through shared memory (double-buffered),
//   dV += P^T dO, dK += dS^T Q, dQ = dS K; the consumers meet once per iteration,
//   after writing P and dS.
// Producer and consumers meet at mbarriers (a full/empty pair per stage for Q +
// lse and for dO + D, cutlass::PipelineTmaAsync). `setmaxnreg` hands the
// producer's registers to the consumers. Masks, score modifiers, dropout, GQA,
// varlen and deterministic dQ are the shared kernel's code.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "flashattn/kernel/bwd.h"
#include "flashattn/kernel/tma_loads.h"

namespace flashattn {

using namespace cute;

// Keys as the rows of S and dP (bwd_ws_kernel's first loop), where the tile
// allows it (d <= 128). -DFLASHATTN_SM90_BWD_QUERIES_AS_ROWS: queries as rows
// everywhere, -DFLASHATTN_SM90_BWD_DROPOUT_QUERIES_AS_ROWS: with dropout, to
// compare.
template <typename Traits, bool kDropout>
constexpr bool bwd_keys_as_rows() {
#if defined(FLASHATTN_SM90_BWD_QUERIES_AS_ROWS)
  return false;
#elif defined(FLASHATTN_SM90_BWD_DROPOUT_QUERIES_AS_ROWS)
  return Traits::kKeysAsRowsFits && !kDropout;
#else
  return Traits::kKeysAsRowsFits;
#endif
}

// Dropout with keys as rows: the keep masks' Philox calls made by the producer
// warpgroup's idle warps (KeepExchange::make) rather than by the consumers
// (KeepExchange::publish). The makers also compare the bytes with their
// thresholds, so that the consumers load their drop bits and gather nothing. The
// backward with dropout, H100: d64 1.6-3.5% faster in every cell of the grid with
// the calls alone, 0.8-3.2% more with the compares; d128 1.5-5.4% faster on every
// shape timed (with the calls alone it lost 3-8% at 8k tokens causal); H200: d32
// 5.9-7.6%, d96 3.2-4.1%, d128 3.4-5.2% (docs/perf-notes.md).
// -DFLASHATTN_SM90_BWD_KEEP_BY_CONSUMERS builds the consumers' calls everywhere,
// to compare.
template <typename Traits, bool kDropout>
constexpr bool bwd_keep_by_makers() {
#if defined(FLASHATTN_SM90_BWD_KEEP_BY_CONSUMERS)
  return false;
#else
  return bwd_keys_as_rows<Traits, kDropout>() && kDropout;
#endif
}

// N tiles of one layout back to back (none for N = 0: data() is null then).
template <typename Element, typename Layout, int N>
struct SmemTileRing {
  cute::array_aligned<Element, cosize_v<Layout>, 1024> tiles[N];
  static constexpr int kTileElems = int(sizeof(tiles[0]) / sizeof(Element));  // whole KB each
  __device__ Element* data() { return tiles[0].data(); }
};
template <typename Element, typename Layout>
struct SmemTileRing<Element, Layout, 0> {
  __device__ Element* data() { return nullptr; }
};

// Every tile 1024-byte aligned (the 128-byte swizzle's period, which the MMA
// descriptors assume for each tile's base). dK and dV are staged at the end
// where the Q and dO stages were. P goes through shared memory only where the
// queries are the rows of S.
// Dropout with keys as rows: the keep masks' Philox calls of a tile, made once
// and read by the consumer threads that hold their elements (KeepExchange). Made
// by the consumers, in one buffer: per call (row pair p, column group g of the
// tile; see kernel/dropout.h, lane units), its words 0-1 and 2-3 (8-column
// groups 0-1 and 2-3 of its 32-column span) as two 8-byte halves, g swizzled by
// p so that a warp's gathers hit every bank once. Made by the producer's warps,
// in two: the drop decisions, 4 bytes per consumer thread and call.
template <int kBlockM, int kGroups, int kBuffers>
struct KeepExchangeStorage {
  uint2 words[kBuffers][kBlockM / 2][2][kGroups];
};
template <int kBlockM, int kGroups>
struct KeepExchangeStorage<kBlockM, kGroups, 0> {};
// Made by the producer's warps (two buffers): each consumer thread's drop bits,
// word j of thread t at bits[j][t ^ 4 (j % 2)] (KeepExchange::make, load_bits).
template <int kBlockM, int kGroups>
struct KeepExchangeStorage<kBlockM, kGroups, 2> {
  uint32_t bits[2][kBlockM / 8][32 * kGroups / 2];
};

template <typename Traits, bool kKeysAsRows, int kKeepBuffers = 0>
struct BwdWsSharedStorage {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  template <typename Layout>
  using Tile = cute::array_aligned<Element, cosize_v<Layout>, 1024>;
  Tile<typename Traits::SmemLayoutQdO> q[Traits::kStages];
  Tile<typename Traits::SmemLayoutQdO> d_o[Traits::kStages];
  Tile<typename Traits::SmemLayoutKV> k;
  Tile<typename Traits::SmemLayoutKV> v;
  SmemTileRing<Element, typename Traits::SmemLayoutPdS, Traits::kPdSBuffers> ds;
  SmemTileRing<Element, typename Traits::SmemLayoutPdS, kKeysAsRows ? 0 : Traits::kPdSBuffers> p;
  // lse in log2 units as hi + lo (lse_to_log2; +inf past the sequence's end), D.
  float lse_hi[Traits::kStages][Traits::kBlockM];
  float lse_lo[Traits::kStages][Traits::kBlockM];
  float d[Traits::kStages][Traits::kBlockM];
  KeepExchangeStorage<Traits::kBlockM, Traits::kBlockN / 8, kKeepBuffers> keep;
  typename Pipeline::SharedStorage pipeline_q, pipeline_do;
};

// The storage of the kernel variant (kDropout: with dropout).
template <typename Traits, bool kDropout>
using BwdWsStorageFor =
    BwdWsSharedStorage<Traits, bwd_keys_as_rows<Traits, kDropout>(),
                       !(bwd_keys_as_rows<Traits, kDropout>() && kDropout) ? 0
                       : bwd_keep_by_makers<Traits, kDropout>()            ? 2
                                                                           : 1>;

// The TMA descriptors of Q and dO (launch/bwd_sm90.h makes them per call).
template <typename Traits>
struct BwdWsLoads {
  typename Traits::TmaQdO q, d_o;
};

// lse and D of the keys-as-rows tile's columns (its queries), read from the
// stage's shared-memory copy where they are used: held in registers, the 16
// columns of a thread would take 48. hi, lo, d point at the thread's first
// query; coords0: thread 0's (query, key) of each element of the (rows, cols) view.
template <typename CoordsRc0>
struct QueryColumnStats {
  const float *hi, *lo, *d;
  CoordsRc0 coords0;
  __device__ __forceinline__ int query(int c) const { return int(get<0>(coords0(0, c))); }
  __device__ __forceinline__ float lse_hi(int, int c) const { return hi[query(c)]; }
  __device__ __forceinline__ float lse_lo(int, int c) const { return lo[query(c)]; }
  __device__ __forceinline__ float d_of(int, int c) const { return d[query(c)]; }
};

// The keys-as-rows tile's keep masks (dropout). The masks are defined on the
// forward's rows (kernel/dropout.h): one Philox call gives a lane of the forward
// rows {i, i + 8} x its 8 columns of a 32-column span, of which a thread holding
// keys as rows has 4 (keys {k, k + 8} x queries {i, i + 8}), and two warps hold
// the rest. So each call is made once into shared memory. By default the
// producer warpgroup's warps 1-3 make them a tile ahead into two buffers,
// compared already (make; bwd_keep_by_makers), and each consumer thread loads
// its drop bits (load_bits). Built with FLASHATTN_SM90_BWD_KEEP_BY_CONSUMERS,
// each consumer warpgroup makes the calls for its 64 keys (publish; kBlockM / 32
// a thread), then a barrier of the warpgroup, and each consumer thread gathers
// its masks (gather): one 8-byte load gives the bytes of its 2 keys x 2 queries
// of one call.
//
// 0xFFFF in each half of the result whose 16-bit number (a byte, zero-extended)
// is below the threshold in that half of `threshold2` (as kernel/dropout.h's
// keep_halves, whose bytes come from one word).
__device__ __forceinline__ uint32_t keep_below(uint32_t halves, uint32_t threshold2) {
  uint32_t mask;
  asm("set.lt.u32.f16x2 %0, %1, %2;" : "=r"(mask) : "r"(halves), "r"(threshold2));
  return mask;
}

// A consumer thread's drop bits as the producer's warps made them
// (KeepExchange::make): element (r, c) of p_and_ds's (keys, queries) view, key row
// r and query 8 (c / 2) + 2 (lane % 4) + c % 2, is bit 8 (2r + c / 2 % 2) of word
// 2 (c / 4) + c % 2 (its call's row pair p has p / 8 = c / 4, p % 2 = c % 2).
template <int kWords>
struct MadeDropBits {
  uint32_t words[kWords];
  __device__ __forceinline__ bool kept(int r, int c) const {
    return ((words[2 * (c / 4) + c % 2] >> (8 * (2 * r + c / 2 % 2))) & 1u) == 0;
  }
};

template <typename Traits>
struct KeepExchange {
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kGroups = Traits::kBlockN / 8;  // calls across the tile's keys: 4 lanes x 32-column spans
  static_assert(Traits::kBlockN == 128 && kBlockM % 32 == 0, "two warpgroups of 64 keys, whole calls per thread");
  static constexpr bool kByMakers = bwd_keep_by_makers<Traits, true>();
  using Storage = KeepExchangeStorage<kBlockM, kGroups, kByMakers ? 2 : 1>;
  // Made by the producer's warps 1-3: buffer b is full for consumer warpgroup w
  // at named barrier 1 + 2 w + b and free again (read by both) at 5 + b. The
  // consumers' own barrier is 0; warpgroup_sync's 1 and 2 are publish's.
  static constexpr int kMakerWarps = 3;
  static constexpr uint32_t kFullThreads = 32 * kMakerWarps + 128;
  static constexpr uint32_t kFreeThreads = 32 * kMakerWarps + Traits::kConsumerThreads;
  Storage& storage;

  // Byte offset of (row pair, half, group)'s slot: row pairs 2j and 2j + 1 share
  // the swizzle, so a thread's slots lie at immediate offsets from one address.
  __device__ static uint32_t offset(int pair, int half, int group) {
    return uint32_t(((pair * 2 + half) * kGroups + (group + 4 * (pair / 2 % 4)) % kGroups) * sizeof(uint2));
  }
  static constexpr uint32_t kPairBytes = 2 * kGroups * sizeof(uint2);
  __device__ uint32_t base(int buffer) const { return cast_smem_ptr_to_uint(&storage.words[buffer][0][0][0]); }
  __device__ static void store(uint32_t address, uint32_t lo, uint32_t hi) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(address), "r"(lo), "r"(hi));
  }
  __device__ static uint2 load(uint32_t address) {
    uint2 v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(address));
    return v;
  }
  __device__ static void wait_full(int wg, int buffer) {
    cutlass::arch::NamedBarrier::sync(kFullThreads, 1 + 2 * wg + buffer);
  }
  __device__ static void mark_full(int buffer) {
    cutlass::arch::NamedBarrier::arrive(kFullThreads, 1 + buffer);
    cutlass::arch::NamedBarrier::arrive(kFullThreads, 3 + buffer);
  }
  __device__ static void wait_free(int buffer) { cutlass::arch::NamedBarrier::sync(kFreeThreads, 5 + buffer); }
  __device__ static void mark_free(int buffer) { cutlass::arch::NamedBarrier::arrive(kFreeThreads, 5 + buffer); }

  // Made by the producer's warps 1-3 (kByMakers): the tile's drop decisions, so
  // that a consumer thread loads its 32 with 8 loads and nothing else (the
  // gather below costs 3 instructions a pair of elements). A call's 16 elements
  // belong to 4 consumer threads, 4 each: its maker compares the bytes with their
  // thresholds and stores one word per thread, byte 2r + q of which holds (bit 0)
  // whether the element of key row r and query half q (gather's terms) is dropped.
  // The tile at (m0, n0), with the counter of its query head
  // (Dropout::counter_base), into `buffer`, by maker warp `warp` (0-2), in steps
  // of 32 calls: lane l of step s makes column group 4 (s % 4) + l % 4 of row
  // pair 8 (s / 4) + l / 4, so that each of its 4 stores hits 32 banks (thread t's
  // word j at bits[j][t ^ 4 (j % 2)]). Thread t is consumer warpgroup g / 8's,
  // warp 2 (g % 8 / 4) + a, lane 4 (2 (g % 4) + b) + p % 8 / 2 (for the elements in
  // words 2a, 2a + 1 of call (p, g), bytes b, b + 2), and the call is its word
  // 2 (p / 8) + p % 2. Maker warp w makes the steps of column groups 4 w + l % 4
  // (s % 4 = w), whose calls share their first rounds (Dropout::GroupPrefix: a
  // lane's group stays while the row pairs change), and a third of those of groups
  // 12-15 (s % 4 = 3) in full. Against calls in full everywhere (75 instructions
  // a call; 52 from the prefix, 59 in full with the steps' offsets in unsigned
  // arithmetic), the backward with dropout, H200: d64 +1.2-2.2%, d128 0 (docs/perf-notes.md).
  __device__ __forceinline__ void make(const BwdParams& params, uint64_t counter, int m0, int n0, int buffer,
                                       int warp) const {
    static_assert(kGroups == 16 && kBlockM % 64 == 0, "steps of 32 calls: 4 column groups of 8 row pairs");
    static_assert(kMakerWarps == 3, "three warps with groups of their own, the fourth's shared");
    constexpr int kSteps = kBlockM / 4;
    const uint32_t lane = threadIdx.x % 32, odd_pair = lane / 4 % 2;
    const uint32_t lane_word = 256 * odd_pair + 8 * (lane % 4) + lane / 8;
    const uint32_t base = cast_smem_ptr_to_uint(&storage.bits[buffer][0][0]);
    const uint32_t address0 = base + 4 * (lane_word + 4 * odd_pair);        // bytes 0, 2 of a word
    const uint32_t address1 = base + 4 * (lane_word + 4 * (1 - odd_pair));  // bytes 1, 3
    // Step 4 quad + j's words lie 4 (512 quad + 128 (j / 2) + 64 (j % 2)) bytes in.
    auto store_call = [&](uint32_t quad, uint32_t j, const uint4& x) {
      const uint32_t step_bytes = 2048 * quad + 512 * (j / 2) + 256 * (j % 2);
      const uint32_t* add = params.dropout_drop_addends;
      store_word(address0 + step_bytes, drop_bits<0x4240>(x.x, x.y, add[0], add[2]));
      store_word(address1 + step_bytes, drop_bits<0x4341>(x.x, x.y, add[1], add[3]));
      store_word(address0 + step_bytes + 128, drop_bits<0x4240>(x.z, x.w, add[4], add[6]));
      store_word(address1 + step_bytes + 128, drop_bits<0x4341>(x.z, x.w, add[5], add[7]));
    };
    const uint32_t pair0 = uint32_t(m0 / 2) + lane / 4;
#pragma unroll 1
    for (uint32_t quad = warp; quad < kSteps / 4; quad += kMakerWarps) {  // step 4 quad + 3
      const uint32_t group = uint32_t(n0 / 8) + 12 + lane % 4;
      store_call(quad, 3, Dropout<Traits>::lane_call(counter, group, pair0 + 8 * quad));
    }
    // Made here rather than kept across the tile's iterations: the makers'
    // 24 registers would spill them into their loops.
    const auto prefix = Dropout<Traits>::group_prefix(counter, uint32_t(n0 / 8 + 4 * warp) + lane % 4);
#pragma unroll 1
    for (uint32_t quad = 0; quad < kSteps / 4; ++quad)  // step 4 quad + warp: row pairs 8 quad + l / 4
      store_call(quad, uint32_t(warp), Dropout<Traits>::lane_call(prefix, pair0 + 8 * quad));
  }
  // Bytes b and b + 2 of words lo and hi (kSelector spreads them to 16-bit
  // halves) plus their addends: bit 8 of each half is set where the byte reaches
  // its threshold (dropped); those bits to bit 0 of bytes 0-1 (lo's) and 2-3.
  template <uint32_t kSelector>
  __device__ __forceinline__ static uint32_t drop_bits(uint32_t lo, uint32_t hi, uint32_t add_lo, uint32_t add_hi) {
    uint32_t a, b, bits;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(a) : "r"(lo), "n"(kSelector));
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(b) : "r"(hi), "n"(kSelector));
    asm("prmt.b32 %0, %1, %2, 0x7531;" : "=r"(bits) : "r"(a + add_lo), "r"(b + add_hi));
    return bits;
  }
  __device__ static void store_word(uint32_t address, uint32_t word) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(word));
  }
  // Consumer thread tidx's (0-255) drop bits of the tile in `buffer` (make).
  __device__ __forceinline__ void load_bits(uint32_t (&bits)[kBlockM / 8], int buffer, int tidx) const {
    const uint32_t base = cast_smem_ptr_to_uint(&storage.bits[buffer][0][0]);
    CUTE_UNROLL
    for (int j = 0; j < kBlockM / 8; ++j) {
      const uint32_t address = base + 4 * uint32_t(j * 32 * kGroups / 2 + (tidx ^ (4 * (j % 2))));
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(bits[j]) : "r"(address));
    }
  }

  // Consumer warpgroup wg's calls of the tile at (m0, n0) of query head `head`:
  // thread t makes column group 8 wg + t % 8 of row pairs 2 (t / 8) and the next.
  __device__ __forceinline__ void publish(const BwdParams& params, int batch, int head, int m0, int n0, int wg,
                                          int wg_tidx) const {
    const Dropout<Traits> drop(params, batch, head);
    constexpr int kCalls = kBlockM / 32;
    static_assert(kCalls == 2, "a thread's two row pairs share the swizzle");
    const int group = 8 * wg + wg_tidx % 8, pair0 = kCalls * (wg_tidx / 8);
    const uint32_t address = base(0) + offset(pair0, 0, group);
    CUTE_UNROLL
    for (int e = 0; e < kCalls; ++e) {
      const uint4 x = drop.lane_call(uint32_t(n0 / 8 + group), uint32_t(m0 / 2 + pair0 + e));
      store(address + e * kPairBytes, x.x, x.y);
      store(address + e * kPairBytes + kPairBytes / 2, x.z, x.w);
    }
  }

  // keep[r][j]: p_and_ds's mask word of the elements (r, 2j), (r, 2j + 1) of the
  // (keys, queries) view: keys k0 + 8r, queries 8j + 2 (lane % 4) + {0, 1}, with
  // k0 = 16 warp + lane / 4 of the warpgroup's keys. Query i is in row pair
  // i / 16 * 8 + i % 8, byte 2 (i / 8 % 2) + k % 2 of word k / 8 % 4 of the call.
  // wg, wg_tidx: this thread's consumer warpgroup and its index there.
  template <int kPairs>
  __device__ __forceinline__ void gather(uint32_t (&keep)[2][kPairs], const BwdParams& params, int buffer, int wg,
                                         int wg_tidx) const {
    static_assert(kPairs == kBlockM / 8);
    const int lane = wg_tidx % 32, warp = wg_tidx / 32;
    const int key8 = lane / 4;                              // k0 % 8
    const int group = 8 * wg + 4 * (warp / 2) + key8 / 2;  // k0 / 32 * 4 + k0 % 8 / 2
    const int half = warp % 2;                              // k0 / 16 % 2: words 2 half, 2 half + 1
    const uint32_t parity = uint32_t(key8 % 2);
    // Byte b of the first word to the low half, of the second to the high half.
    const uint32_t select[2] = {0x4400u + 0x1111u * parity, 0x4400u + 0x1111u * (parity + 2)};
    uint32_t threshold2[2][2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      CUTE_UNROLL
      for (int s = 0; s < 2; ++s) {
        const uint32_t byte = 4u * uint32_t(2 * half + r) + 2u * uint32_t(s) + parity;
        const uint32_t t = params.dropout_threshold + (byte < params.dropout_dither);
        threshold2[r][s] = t | (t << 16);
      }
    }
    const uint32_t address = base(buffer) + offset(2 * (lane % 4), half, group);
    CUTE_UNROLL
    for (int h = 0; h < kBlockM / 16; ++h) {
      // Row pairs 8h + 2 (lane % 4) and the next.
      const uint2 even = load(address + 8 * h * kPairBytes), odd = load(address + (8 * h + 1) * kPairBytes);
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTE_UNROLL
        for (int s = 0; s < 2; ++s) {
          uint32_t halves;
          asm("prmt.b32 %0, %1, %2, %3;" : "=r"(halves) : "r"(r ? even.y : even.x), "r"(r ? odd.y : odd.x),
              "r"(select[s]));
          keep[r][2 * h + s] = keep_below(halves & 0x00FF00FFu, threshold2[r][s]);
        }
      }
    }
  }
};

template <typename Traits, bool kScoreMods, bool kDropout = false>
__global__ void __launch_bounds__(Traits::kCtaThreads, 1)
    bwd_ws_kernel(const BwdParams params, const __grid_constant__ BwdWsLoads<Traits> loads) {
  using Element = typename Traits::Element;
  using Pipeline = typename Traits::Pipeline;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr bool kKeysAsRows = bwd_keys_as_rows<Traits, kDropout>();
  using Storage = BwdWsStorageFor<Traits, kDropout>;
  static_assert(sizeof(Storage::q) >= sizeof(Storage::k) && sizeof(Storage::d_o) >= sizeof(Storage::v),
                "dK and dV are staged where the Q and dO stages were");

  extern __shared__ __align__(1024) char ws_smem[];
  auto& storage = *reinterpret_cast<Storage*>(ws_smem);
  const KeyTileScheduler<kBlockN> tile(params);
  const int head_k = tile.head_k, batch = tile.batch;
  const SeqlenInfo seq(params, batch);
  const int n_block = tile.n_block;
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.seqlen_k) return;  // a spare slot of the varlen grid: the whole CTA leaves
  const int group = params.heads / params.heads_k;
  const int head0 = head_k * group;
  const int kv_head = head_k / params.kv_head_splits;  // of K and V (params.h)
  const AttentionMask mask(params, seq);
  int m_begin, m_end;
  mask.query_block_range(n0, kBlockN, kBlockM, m_begin, m_end);
  const int num_iters = (m_end - m_begin) * group;  // (query head, query block) pairs, head-major

  const int lane = threadIdx.x % 32;
  const bool producer = threadIdx.x < Traits::kProducerThreads;
  const auto pipe_params = tma_pipeline_params<Pipeline, Traits>(producer, Traits::kQdOBytes);
  Pipeline pipeline_q(storage.pipeline_q, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipeline_do(storage.pipeline_do, pipe_params, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised before anyone waits on them

  auto gmem_tile = [](const void* base, index_t offset, index_t row_stride, auto rows) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + offset),
                       make_layout(make_shape(rows, Int<kHeadDim>{}), make_stride(row_stride, _1{})));
  };

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (bwd_keep_by_makers<Traits, kDropout>()) {
      // Warps 1-3: the keep masks of iteration `it` into buffer it % 2, once
      // the consumers have read what it held two iterations before.
      if (threadIdx.x >= 32) {
        const KeepExchange<Traits> keeps{storage.keep};
        uint64_t counter = Dropout<Traits>::counter_of(params, batch, head0);  // of the query head
        int m_block = m_begin;
        for (int it = 0; it < num_iters; ++it) {
          if (it >= 2) keeps.wait_free(it % 2);
          keeps.make(params, counter, m_block * kBlockM, n0, it % 2, threadIdx.x / 32 - 1);
          keeps.mark_full(it % 2);
          if (++m_block == m_end) m_block = m_begin, ++counter;
        }
        return;
      }
    }
    // ---- producer: Q + lse, then dO + D, of iteration `it` into stage it % kStages.
    // Warp 0 writes lse (in log2 units) and D, two rows a lane; its lane 0 issues
    // the TMA loads.
    if (threadIdx.x >= 32) return;
    const bool leader = lane == 0;
    const bool packed = params.cu_seqlens_q != nullptr;
    // The (rows, head dim) view of one query head of this sequence (a varlen
    // sequence: its rows of the packed tensor, whose descriptor has one batch).
    using TmaQdO = typename Traits::TmaQdO;
    auto rows_of = [&](TmaQdO const& tma, int head) {
      Tensor m = tma.get_tma_tensor(make_shape(packed ? params.total_q : params.seqlen_q, params.head_dim,
                                               params.heads, packed ? 1 : params.batch));
      return domain_offset(make_coord(int(seq.row0_q), 0), m(_, _, head, packed ? 0 : batch));
    };
    constexpr int kRowsPerLane = (kBlockM + 31) / 32;
    const cutlass::ProducerToken free_stage{cutlass::BarrierStatus::WaitDone};  // waited for above

    auto state = cutlass::make_producer_start_state<Pipeline>();
    int head = head0, m_block = m_begin;
    for (int it = 0; it < num_iters; ++it) {
      const int m0 = m_block * kBlockM;
      const int rows_left = seq.seqlen_q - m0;
      // lse and D of this lane's rows, loaded before the stage is free.
      float lse[kRowsPerLane], d[kRowsPerLane];
      CUTE_UNROLL
      for (int i = 0; i < kRowsPerLane; ++i) {
        const int row = lane + 32 * i;
        lse[i] = row < rows_left ? params.softmax_lse[seq.lse_offset(params, batch, head) + m0 + row] : INFINITY;
        d[i] = row < kBlockM ? params.softmax_d[seq.workspace_row(params, batch, head) + m0 + row] : 0.f;  // 0 past the end
      }
      const int stage = state.index();
      // A stage's lse (D) is written once its consumers released it, and before
      // the arrival that publishes it with Q's (dO's) bytes.
      auto fill = [&](Pipeline& pipeline, auto&& write_rows, TmaQdO const& tma, Element* tile) {
        if (leader) {
          while (pipeline.producer_try_acquire(state) != cutlass::BarrierStatus::WaitDone) {
          }
        }
        __syncwarp();
        CUTE_UNROLL
        for (int i = 0; i < kRowsPerLane; ++i) {
          if (lane + 32 * i < kBlockM) write_rows(i, lane + 32 * i);
        }
        __syncwarp();
        if (leader) {
          pipeline.producer_acquire(state, free_stage);  // arrives, announcing the bytes
          auto slice = tma.get_slice(0);
          Tensor g = local_tile(rows_of(tma, head), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
          copy(tma.with(*pipeline.producer_get_barrier(state)), slice.partition_S(g),
               slice.partition_D(make_tensor(make_smem_ptr(tile), typename Traits::SmemLayoutQdO{})));
        }
      };
      auto write_lse = [&](int i, int row) {
        lse_to_log2(lse[i], storage.lse_hi[stage][row], storage.lse_lo[stage][row]);
      };
      fill(pipeline_q, write_lse, loads.q, storage.q[stage].data());
      fill(pipeline_do, [&](int i, int row) { storage.d[stage][row] = d[i]; }, loads.d_o, storage.d_o[stage].data());
      ++state;
      if (++m_block == m_end) m_block = m_begin, ++head;
    }
    return;
  }

  // ---- consumers
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tidx = threadIdx.x - Traits::kProducerThreads;
  Tensor sQ = make_tensor(make_smem_ptr(storage.q[0].data()), typename Traits::SmemLayoutQdO{});     // (M, d), stage 0
  Tensor sdO = make_tensor(make_smem_ptr(storage.d_o[0].data()), typename Traits::SmemLayoutQdO{});  // (M, d), stage 0
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKV{});         // (N, d)
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKV{});         // (N, d)
  Tensor sP = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutPdS{});     // (M, N), buffer 0
  Tensor sdS = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPdS{});   // (M, N), buffer 0
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQdOt{});    // (d, M)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQdOt{});  // (d, M)
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});      // (d, N)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});    // (N, M)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});  // (N, M)
  // Element offsets of stage s (Q, dO) and buffer b (P, dS): the tiles of a ring
  // follow one another (whole KB each).
  constexpr int kQdOElems = int(sizeof(Storage::q[0]) / sizeof(Element));
  constexpr int kPdSElems = decltype(storage.ds)::kTileElems;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto product_s = smem_product<Traits, false, false>(mma_sdp, sQ, sK, tidx);
  auto product_dp = smem_product<Traits, false, false>(mma_sdp, sdO, sV, tidx);
  auto product_dv = smem_product<Traits, true, true>(mma_dkv, sPt, sdOt, tidx);
  auto product_dk = smem_product<Traits, true, true>(mma_dkv, sdSt, sQt, tidx);
  auto product_dq = smem_product<Traits, false, true>(mma_dq, sdS, sKt, tidx);

  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), Traits::rowcol(tScS.layout()));
  Tensor tScS0_rc = make_tensor(tScS0.data(), Traits::rowcol(tScS0.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  constexpr int kPairs = decltype(size<1>(tScS_rc))::value / 2;
  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
  Tensor tPsP = copy_pds.get_thread_slice(tidx).partition_D(sP);
  Tensor tdSsdS = copy_pds.get_thread_slice(tidx).partition_D(sdS);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(acc_dk);
  clear(acc_dv);

  if (num_iters > 0) {
    // K and V, loaded by the consumers while the producer starts on Q.
    typename Traits::GmemTiledCopyQKV gmem_copy;
    auto thr = gmem_copy.get_thread_slice(tidx);
    Tensor tKcK = thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tKpK = make_tensor<bool>(make_shape(size<2>(tKcK)));
    CUTE_UNROLL
    for (int k = 0; k < size(tKpK); ++k) tKpK(k) = get<1>(tKcK(0, 0, k)) < params.head_dim;
    Tensor gK = gmem_tile(params.k, seq.k_offset(params.k_batch_stride, params.k_row_stride, batch) +
                                        kv_head * params.k_head_stride + n0 * params.k_row_stride,
                          params.k_row_stride, Int<kBlockN>{});
    Tensor gV = gmem_tile(params.v, seq.k_offset(params.v_batch_stride, params.v_row_stride, batch) +
                                        kv_head * params.v_head_stride + n0 * params.v_row_stride,
                          params.v_row_stride, Int<kBlockN>{});
    Tensor tKsK = thr.partition_D(sK);
    Tensor tVsV = thr.partition_D(sV);
    copy_tile<true>(gmem_copy, thr.partition_S(gK), tKsK, tKcK, tKpK, seq.seqlen_k - n0);
    copy_tile<true>(gmem_copy, thr.partition_S(gV), tVsV, tKcK, tKpK, seq.seqlen_k - n0);
    cp_async_fence();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    consumers_sync<Traits>();
  }

  typename Pipeline::PipelineState state;  // stage 0, phase 0: the producer's order
  int head = head0, m_block = m_begin;
  // Each iteration's start: its stage's Q landed. In a varlen sequence's last
  // query block TMA read the next sequence's rows past its end: their P and dS
  // are 0, but 0 * Inf is NaN in dV and dK, so those rows of the stage's Q and dO
  // are zeroed (both warpgroups' rows; dO waited for here then).
  auto wait_q = [&](typename Pipeline::PipelineState const& s, int q_offset, int m0) {
    pipeline_q.consumer_wait(s);
    if (params.cu_seqlens_q != nullptr && m0 + kBlockM > seq.seqlen_q) {
      Tensor sQs = make_tensor(sQ.data() + q_offset, sQ.layout());
      Tensor sdOs = make_tensor(sdO.data() + q_offset, sdO.layout());
      pipeline_do.consumer_wait(s);
      zero_rows_from<Traits>(sQs, seq.seqlen_q - m0, tidx);
      zero_rows_from<Traits>(sdOs, seq.seqlen_q - m0, tidx);
      cutlass::arch::fence_view_async_shared();  // generic writes, read by wgmma
      consumers_sync<Traits>();
    }
  };
  if constexpr (kKeysAsRows) {
    // S^T = K Q^T and dP^T = V dO^T: warpgroup w's rows are keys 64w..64w + 63,
    // its rows of dK and dV too, so P^T and dS^T are the register A operands of
    // dV += P^T dO and dK += dS^T Q. Only dQ = dS K needs both warpgroups' dS^T:
    // they meet once, after dV is issued and dS^T stored.
    typename Traits::TiledMmaSdPt mma_sdpt;
    typename Traits::TiledMmadKVFromRegisters mma_dkv_rs;
    typename Traits::TiledMmadQFromKeyRows mma_dq_t;
    static_assert(std::is_same_v<decltype(mma_dkv_rs.get_layoutC_TV()), decltype(mma_dkv.get_layoutC_TV())> &&
                      std::is_same_v<decltype(mma_dq_t.get_layoutC_TV()), decltype(mma_dq.get_layoutC_TV())>,
                  "dK, dV and dQ keep the accumulator layouts their epilogues (and dQ's scratch) assume");
    Tensor sdSk = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutdSKeyRows{});  // (N, M)
    Tensor sdSq = make_tensor(sdSk.data(), typename Traits::SmemLayoutdSKeyRowsT{});                          // (M, N)
    // Zero-initialised products at 64 query rows: an accumulator cleared in
    // registers is an input of the MMA, and with dK in flight ptxas then waited
    // for every product before dP^T (forward + backward +2% at d128, H100). With
    // 128 rows (d64) ptxas found too few registers for it and serialized every
    // product: there the accumulators are cleared.
    constexpr bool kZeroInit = kBlockM == 64;
    auto product_st = smem_product<Traits, false, false, kZeroInit>(mma_sdpt, sK, sQ, tidx);
    auto product_dpt = smem_product<Traits, false, false, kZeroInit>(mma_sdpt, sV, sdO, tidx);
    auto product_dq_t = smem_product<Traits, true, true, kZeroInit>(mma_dq_t, sdSq, sKt, tidx);
    auto thr_dkv = mma_dkv_rs.get_thread_slice(tidx);  // at the thread: see smem_product
    auto b_operand = [&](const auto& tile, int offset) {
      return thr_dkv.partition_fragment_B(make_tensor(tile.data() + offset, tile.layout()));
    };
    // (key, query) -> its (query, key) coordinate: the masks take them in that order.
    Tensor cSt = make_coord_tensor(make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, make_stride(E<1>{}, E<0>{})));
    auto thr_sdpt = mma_sdpt.get_thread_slice(tidx);
    Tensor tStcSt = thr_sdpt.partition_C(cSt);
    Tensor tStcSt0 = mma_sdpt.get_thread_slice(0).partition_C(cSt);
    Tensor tStcSt_rc = make_tensor(tStcSt.data(), Traits::rowcol(tStcSt.layout()));
    Tensor tStcSt0_rc = make_tensor(tStcSt0.data(), Traits::rowcol(tStcSt0.layout()));
    const int query0 = get<0>(tStcSt_rc(0, 0));  // this thread's first query column
    auto copy_ds = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdpt);
    Tensor tdSsdSk = copy_ds.get_thread_slice(tidx).partition_D(sdSk);
    // dK issued last and waited for under the next iteration's S^T and dP^T, dQ
    // added while dK multiplies: forward + backward +3% at d64 and d128 (H100).
    // -DFLASHATTN_SM90_BWD_DK_IN_PLACE: dK issued before the barrier and
    // everything waited for within the iteration, to compare.
#if defined(FLASHATTN_SM90_BWD_DK_IN_PLACE)
    constexpr bool kDkAcross = false;
#else
    constexpr bool kDkAcross = true;
#endif
    // dS^T, dK's register operand until its product is waited for.
    Tensor rdS = make_tensor<Element>(partition_fragment_C(mma_sdpt, Shape<Int<kBlockN>, Int<kBlockM>>{}).layout());
    Tensor tdKrdS = make_tensor(rdS.data(), Traits::c_to_a(rdS.layout()));
    // Dropout: the tile's keep masks, made under its S^T and dP^T and gathered
    // once dS^T's registers are free.
    uint32_t keep[2][kDropout ? kBlockM / 8 : 1];
    MadeDropBits<kBlockM / 8> made_bits;  // where the producer's warps made them
    [[maybe_unused]] auto keep_exchange = [&] {
      if constexpr (kDropout) return KeepExchange<Traits>{storage.keep};
      else return 0;
    }();
    typename Pipeline::PipelineState last_state = state;
    auto release = [&](typename Pipeline::PipelineState const& s) {
      __syncwarp();
      if (lane == 0) {  // Q and dO of this stage read: the producer may refill it
        pipeline_q.consumer_release(s);
        pipeline_do.consumer_release(s);
      }
    };
    int ds_buffer = 0;
    for (int it = 0; it < num_iters; ++it) {
      const int m0 = m_block * kBlockM;
      const int stage = state.index();
      const int q_offset = stage * kQdOElems, ds_offset = ds_buffer * kPdSElems;

      Tensor acc_s = partition_fragment_C(mma_sdpt, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor acc_dp = partition_fragment_C(mma_sdpt, Shape<Int<kBlockN>, Int<kBlockM>>{});
      if constexpr (!kZeroInit) {
        clear(acc_s);
        clear(acc_dp);
      }
      wait_q(state, q_offset, m0);
      product_st(acc_s, 0, q_offset);
      pipeline_do.consumer_wait(state);
      product_dpt(acc_dp, 0, q_offset);
      // This tile's calls into the exchange (last read before the last barrier),
      // unless the producer's warps make them.
      constexpr bool kKeepByMakers = bwd_keep_by_makers<Traits, kDropout>();
      if constexpr (kDropout && !kKeepByMakers) {
        keep_exchange.publish(params, batch, head, m0, n0, tidx / 128, tidx % 128);
      }
      // The last iteration's dK, issued last, done: its stage is free. (Waited
      // for unconditionally: ptxas serializes every wgmma of a kernel where
      // some path may read an accumulator still in flight.)
      if constexpr (kDkAcross) {
        products_wait<Traits, 2>(acc_dk);
        warpgroup_fence_operand(rdS);
        if (it > 0) release(last_state);
      }
      if constexpr (kDropout && !kKeepByMakers) {
        warpgroup_sync(tidx / 128);
        keep_exchange.gather(keep, params, 0, tidx / 128, tidx % 128);
      }
      if constexpr (kKeepByMakers) {
        keep_exchange.wait_full(tidx / 128, it % 2);
        keep_exchange.load_bits(made_bits.words, it % 2, tidx);
        if (it + 2 < num_iters) keep_exchange.mark_free(it % 2);
      }
      const QueryColumnStats<decltype(tStcSt0_rc)> stats{storage.lse_hi[stage] + query0, storage.lse_lo[stage] + query0,
                                                        storage.d[stage] + query0, tStcSt0_rc};
      products_wait<Traits, 1>(acc_s);
      if constexpr (kKeepByMakers) {
        p_and_ds<Traits, kScoreMods, true>(acc_s, acc_dp, stats, params, mask, tStcSt, tStcSt0, tStcSt_rc,
                                           tStcSt0_rc, batch, head, m0, n0, made_bits);
      } else if constexpr (kDropout) {
        p_and_ds<Traits, kScoreMods, true>(acc_s, acc_dp, stats, params, mask, tStcSt, tStcSt0, tStcSt_rc,
                                           tStcSt0_rc, batch, head, m0, n0, keep);
      } else {
        p_and_ds<Traits, kScoreMods, false>(acc_s, acc_dp, stats, params, mask, tStcSt, tStcSt0, tStcSt_rc,
                                            tStcSt0_rc, batch, head, m0, n0);
      }
      Tensor rP = convert_fragment<Element>(acc_s);
      convert_fragment_into(acc_dp, rdS);
      Tensor tdVrP = make_tensor(rP.data(), Traits::c_to_a(rP.layout()));
      wgmma_issue<false>(mma_dkv_rs, tdVrP, b_operand(sdOt, q_offset), acc_dv);
      // dS^T into this iteration's buffer, while dV multiplies. The buffer was
      // last read by dQ two iterations ago, which both warpgroups waited for
      // before the last barrier.
      copy(copy_ds, make_tensor(rdS.data(), copy_ds.retile(rdS.layout())),
           make_tensor(tdSsdSk.data() + ds_offset, tdSsdSk.layout()));
      cutlass::arch::fence_view_async_shared();
      if constexpr (!kDkAcross) wgmma_issue<false>(mma_dkv_rs, tdKrdS, b_operand(sQt, q_offset), acc_dk);
      consumers_sync<Traits>();  // both warpgroups' dS^T written

      Tensor acc_dq = partition_fragment_C(mma_dq_t, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      if constexpr (!kZeroInit) clear(acc_dq);
      product_dq_t(acc_dq, ds_offset);
      if constexpr (kDkAcross) {
        wgmma_issue<false>(mma_dkv_rs, tdKrdS, b_operand(sQt, q_offset), acc_dk);
        products_wait<Traits, 1>(acc_dv, acc_dq);
      } else {
        products_wait<Traits, 1>(acc_dv, acc_dk);
        warpgroup_fence_operand(rdS);
        release(state);
        products_wait<Traits, 0>(acc_dq);
      }
      warpgroup_fence_operand(rP);  // the registers dV read stay its own until here
      add_dq<Traits>(params, mask, seq.workspace_row(params, batch, head), m0, n_block, acc_dq, tidx,
                     ConsumersSync<Traits>{});

      last_state = state;
      ++state;
      ds_buffer ^= 1;
      if (++m_block == m_end) m_block = m_begin, ++head;
    }
    if constexpr (kDkAcross) {
      products_wait<Traits, 0>(acc_dk);
      warpgroup_fence_operand(rdS);
      if (num_iters > 0) release(last_state);
    }
  } else {
    // Dropout (d > 128; d <= 128 with -DFLASHATTN_SM90_BWD_DROPOUT_QUERIES_AS_ROWS):
    // a tile's keep masks are made under its own S and dP products, between their
    // issue and the wait for S, rather than after dP landed: forward + backward
    // with dropout, H100, d64 +1.8%, d256 +1.0% (no cell slower).
    // -DFLASHATTN_SM90_BWD_KEEP_IN_PLACE: after dP, to compare. Not with score
    // modifiers, whose kernels spill in their loop already.
#if defined(FLASHATTN_SM90_BWD_KEEP_IN_PLACE)
    constexpr bool kKeepWords = false;
#else
    constexpr bool kKeepWords = kDropout && !kScoreMods;
#endif
    uint32_t keep[kKeepWords ? kRows : 1][kKeepWords ? kPairs : 1];
    int pds_buffer = 0;
    for (int it = 0; it < num_iters; ++it) {
      const int m0 = m_block * kBlockM;
      const int stage = state.index();
      const int q_offset = stage * kQdOElems, pds_offset = pds_buffer * kPdSElems;

      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      clear(acc_dp);
      wait_q(state, q_offset, m0);
      product_s(acc_s, q_offset);
      pipeline_do.consumer_wait(state);
      product_dp(acc_dp, q_offset);
      if constexpr (kKeepWords) make_keep_words<Traits>(keep, params, tScS_rc, tScS0_rc, batch, head, m0, n0);

      RowStats<kRows> stats;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(tScS_rc(r, 0));
        stats.hi[r] = storage.lse_hi[stage][row];
        stats.lo[r] = storage.lse_lo[stage][row];
        stats.d[r] = storage.d[stage][row];
      }
      products_wait<Traits, 1>(acc_s);
      if constexpr (kKeepWords) {
        p_and_ds<Traits, kScoreMods, kDropout>(acc_s, acc_dp, stats, params, mask, tScS, tScS0, tScS_rc, tScS0_rc,
                                               batch, head, m0, n0, keep);
      } else {
        p_and_ds<Traits, kScoreMods, kDropout>(acc_s, acc_dp, stats, params, mask, tScS, tScS0, tScS_rc, tScS0_rc,
                                               batch, head, m0, n0);
      }
      Tensor rP = convert_fragment<Element>(acc_s);
      Tensor rdS = convert_fragment<Element>(acc_dp);
      copy(copy_pds, make_tensor(rP.data(), copy_pds.retile(rP.layout())),
           make_tensor(tPsP.data() + pds_offset, tPsP.layout()));
      copy(copy_pds, make_tensor(rdS.data(), copy_pds.retile(rdS.layout())),
           make_tensor(tdSsdS.data() + pds_offset, tdSsdS.layout()));
      cutlass::arch::fence_view_async_shared();
      // P and dS of both warpgroups written. The buffer written next iteration was
      // last read by the products of the previous one, which every warpgroup
      // waited for before arriving here.
      consumers_sync<Traits>();

      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      clear(acc_dq);
      product_dv(acc_dv, pds_offset, q_offset);
      product_dk(acc_dk, pds_offset, q_offset);
      product_dq(acc_dq, pds_offset);
      products_wait<Traits, 1>(acc_dv, acc_dk);
      __syncwarp();
      if (lane == 0) {  // Q and dO of this stage read: the producer may refill it
        pipeline_q.consumer_release(state);
        pipeline_do.consumer_release(state);
      }
      products_wait<Traits, 0>(acc_dq);
      add_dq<Traits>(params, mask, seq.workspace_row(params, batch, head), m0, n_block, acc_dq, tidx,
                     ConsumersSync<Traits>{});

      ++state;
      pds_buffer ^= 1;
      if (++m_block == m_end) m_block = m_begin, ++head;
    }
  }

  Tensor sdK = make_tensor(sQ.data(), typename Traits::SmemLayoutKV{});
  Tensor sdV = make_tensor(sdO.data(), typename Traits::SmemLayoutKV{});
  consumers_sync<Traits>();  // every warpgroup is done with Q and dO
  store_dk_dv<Traits, kDropout>(acc_dk, acc_dv, mma_dkv, sdK, sdV, params, seq, batch, head_k, n0, tidx,
                                ConsumersSync<Traits>{});
}

}  // namespace flashattn
