// Small device helpers shared by every kernel family: tile GEMMs with
// shared->register pipelining, predicated tile copies, lane reductions.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace flashattn {

using namespace cute;

// acc += A . B^T with both operands in shared memory. The next k-slice is read
// from shared memory while the tensor cores work on the current one.
template <typename Acc, typename RegA, typename RegB, typename SmemA, typename SmemB, typename TiledMma,
          typename CopyA, typename CopyB>
__device__ __forceinline__ void gemm_smem_smem(Acc& acc, RegA& rA, RegB& rB, const SmemA& sA,
                                               const SmemB& sB, TiledMma tiled_mma, CopyA copy_a,
                                               CopyB copy_b) {
  auto rA_view = make_tensor(rA.data(), copy_a.retile(rA.layout()));
  auto rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));
  copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    cute::gemm(tiled_mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A . B^T with A already in registers (the probabilities P).
template <typename Acc, typename RegA, typename RegB, typename SmemB, typename TiledMma, typename CopyB>
__device__ __forceinline__ void gemm_reg_smem(Acc& acc, const RegA& rA, RegB& rB, const SmemB& sB,
                                              TiledMma tiled_mma, CopyB copy_b) {
  auto rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    cute::gemm(tiled_mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// Global -> shared copy of one tile, partitioned (CPY, CPY_ROWS, CPY_COLS).
// Rows at or past `rows_left` and columns whose predicate is false are zeroed
// in shared memory instead: nothing outside the tensor is read, and padding
// contributes exact zeros to the products. kZeroFills: the copy atom zero-fills
// on a false predicate itself (cp.async with src-size 0), so no extra stores
// (and no branches) stand in the loop.
//
// RowOffset: where the rows of `src` really are. row_offset(r), called only for
// rows r < rows_left of the tile, is added to the address of tile row r (the
// pages of a paged KV cache); NoRowOffset compiles to the plain copy.
struct NoRowOffset {
  __device__ __forceinline__ int64_t operator()(int) const { return 0; }
};

template <bool kZeroFills = false, typename TiledCopy, typename Src, typename Dst, typename Coords,
          typename ColPred, typename RowOffset = NoRowOffset>
__device__ __forceinline__ void copy_tile(TiledCopy tiled_copy, const Src& src, Dst& dst,
                                          const Coords& coords, const ColPred& col_ok, int rows_left,
                                          const RowOffset& row_offset = {}) {
  // Up to four rows' offsets are read before their copies: an offset read from
  // shared memory (a paged cache's) placed after a cp.async, which writes shared
  // memory, would wait for it, one memory latency per row.
  constexpr int kPasses = decltype(size<1>(src))::value;
  constexpr int kChunk = kPasses % 4 == 0 ? 4 : kPasses < 4 ? kPasses : kPasses % 2 == 0 ? 2 : 1;
  CUTE_UNROLL
  for (int m0 = 0; m0 < kPasses; m0 += kChunk) {
    int64_t offsets[kChunk];
    CUTE_UNROLL
    for (int i = 0; i < kChunk; ++i) {
      const int row = get<0>(coords(0, m0 + i, 0));
      offsets[i] = row < rows_left ? row_offset(row) : 0;
    }
    CUTE_UNROLL
    for (int i = 0; i < kChunk; ++i) {
      const int m = m0 + i;
      const bool row_ok = get<0>(coords(0, m, 0)) < rows_left;
      auto at = [&](int k) { return make_tensor(src(_, m, k).data() + offsets[i], src(_, m, k).layout()); };
      if constexpr (kZeroFills) {
        CUTE_UNROLL
        for (int k = 0; k < size<2>(src); ++k) copy(tiled_copy.with(row_ok && col_ok(k)), at(k), dst(_, m, k));
      } else if (row_ok) {
        CUTE_UNROLL
        for (int k = 0; k < size<2>(src); ++k) {
          if (col_ok(k)) {
            copy(tiled_copy, at(k), dst(_, m, k));
          } else {
            clear(dst(_, m, k));
          }
        }
      } else {
        clear(dst(_, m, _));
      }
    }
  }
}

// A tile's global->shared copy in two steps, so that its loads are in flight
// while the warps compute: issue() before a product, commit() after it.
// kThroughRegisters (sm70, sm75: no cp.async) loads into registers in issue()
// and stores them to shared memory in commit(); otherwise issue() copies
// straight to shared memory (asynchronously with cp.async, kZeroFills) and
// commit() does nothing.
template <bool kThroughRegisters, bool kZeroFills, typename Element, typename DstPartition>
struct StagedTileCopy {
  using Registers = decltype(make_tensor<Element>(shape(std::declval<DstPartition>())));
  std::conditional_t<kThroughRegisters, Registers, int> regs;

  template <typename TiledCopy, typename Src, typename Dst, typename Coords, typename ColPred,
            typename RowOffset = NoRowOffset>
  __device__ __forceinline__ void issue(TiledCopy tiled_copy, const Src& src, Dst& dst, const Coords& coords,
                                        const ColPred& col_ok, int rows_left, const RowOffset& row_offset = {}) {
    if constexpr (kThroughRegisters) {
      copy_tile<false>(tiled_copy, src, regs, coords, col_ok, rows_left, row_offset);
    } else {
      copy_tile<kZeroFills>(tiled_copy, src, dst, coords, col_ok, rows_left, row_offset);
    }
  }

  template <typename TiledCopy, typename Dst>
  __device__ __forceinline__ void commit(TiledCopy tiled_copy, Dst& dst) {
    if constexpr (kThroughRegisters) copy(tiled_copy, regs, dst);
  }
};

// Registers -> global store of one tile; rows/columns outside are skipped.
// RowOffset as in copy_tile.
template <typename TiledCopy, typename Src, typename Dst, typename Coords, typename ColPred,
          typename RowOffset = NoRowOffset>
__device__ __forceinline__ void store_tile(TiledCopy tiled_copy, const Src& src, Dst& dst,
                                           const Coords& coords, const ColPred& col_ok, int rows_left,
                                           const RowOffset& row_offset = {}) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const int row = get<0>(coords(0, m, 0));
    if (row < rows_left) {
      const int64_t offset = row_offset(row);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (col_ok(k)) copy(tiled_copy, src(_, m, k), make_tensor(dst(_, m, k).data() + offset, dst(_, m, k).layout()));
      }
    }
  }
}

// Reduce over the lanes named by the set bits of kMask (xor-shuffles).
template <unsigned kMask, typename Op>
__device__ __forceinline__ float lane_allreduce(float x, Op op) {
  CUTE_UNROLL
  for (unsigned bit = 1; bit < 32; bit <<= 1) {
    if (kMask & bit) x = op(x, __shfl_xor_sync(0xffffffffu, x, bit));
  }
  return x;
}

// fp32 accumulation in a scratch tile with a private, coalesced layout: value i
// of thread t of an accumulator fragment lives in slot
//   (i / kVec) * (kVec * kThreads) + t * kVec + i % kVec,
// so that one instruction of a warp adds 32 * kVec consecutive floats. kVec is
// 4 where vector reductions exist (sm_90), else 1. Every CTA adding into a tile,
// and the kernel that reads it back, use the same fragment layout.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kScratchVec = 4;
#else
constexpr int kScratchVec = 1;
#endif

template <int kThreads, typename Fragment>
__device__ __forceinline__ void scratch_add(float* tile, const Fragment& acc, int tidx) {
  static_assert(decltype(size(acc))::value % kScratchVec == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += kScratchVec) {
    float* p = tile + i * kThreads + tidx * kScratchVec;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(acc(i)),
                 "f"(acc(i + 1)), "f"(acc(i + 2)), "f"(acc(i + 3)) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(acc(i)) : "memory");
#endif
  }
}

template <int kThreads, typename Fragment>
__device__ __forceinline__ void scratch_load(const float* tile, Fragment& acc, int tidx) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += kScratchVec) {
    const float* p = tile + i * kThreads + tidx * kScratchVec;
    if constexpr (kScratchVec == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      acc(i) = v.x, acc(i + 1) = v.y, acc(i + 2) = v.z, acc(i + 3) = v.w;
    } else {
      acc(i) = *p;
    }
  }
}

// lse * log2(e) as an unevaluated sum hi + lo of two floats (error ~2^-45 of it):
// the backward subtracts hi inside its FMA and lo after it, so that the lse's
// conversion to log2 units adds no rounding at magnitudes where an fp32 ulp is
// 1e-4 or more (scores in the thousands). +inf (a row that sees no key) stays
// hi = +inf, lo = 0.
__device__ __forceinline__ void lse_to_log2(float lse, float& hi, float& lo) {
  constexpr float kLog2eHi = 1.4426950216293335f;   // float(log2(e))
  constexpr float kLog2eLo = 1.925963033500011e-08f;  // log2(e) - kLog2eHi
  hi = lse * kLog2eHi;
  lo = isinf(hi) ? 0.f : fmaf(lse, kLog2eHi, -hi) + lse * kLog2eLo;
}

// tanh through one exp2 and one reciprocal: accurate to a few ulp of 1 (unlike
// tanh.approx) and lighter on registers than tanhf. Saturates to +-1.
__device__ __forceinline__ float tanh_exp2(float x) {
  return 1.f - 2.f / (exp2f(x * 2.8853900817779268f) + 1.f);  // 2 * log2(e)
}

// Type conversion of a whole register fragment (packed cvt instructions), into
// a fragment of the same size (as whole registers: an element-wise copy of
// 16-bit values would shuffle halves) or into a new one.
template <typename Fragment, typename Dst>
__device__ __forceinline__ void convert_fragment_into(const Fragment& src, Dst& dst) {
  using From = typename Fragment::value_type;
  using To = typename Dst::value_type;
  constexpr int N = decltype(size(src))::value;
  static_assert(decltype(size(dst))::value == N);
  cutlass::NumericArrayConverter<To, From, N> convert;
  *reinterpret_cast<cutlass::Array<To, N>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, N>*>(src.data()));
}
template <typename To, typename Fragment>
__device__ __forceinline__ auto convert_fragment(const Fragment& src) {
  auto dst = make_tensor_like<To>(src);
  convert_fragment_into(src, dst);
  return dst;
}

// Epilogue of a tile: an fp32 accumulator fragment (of `mma`) to global memory
// in the tile's element type, through shared memory so that the global stores
// are 16-byte vectors: fragment -> sTile, barrier, sTile -> registers ->
// rows < rows_left and columns < cols_left of gTile. sTile and gTile are
// (rows, cols) tiles of one shape; the caller makes sure that nobody still
// reads sTile's memory (a barrier) before the call. `sync` is the barrier of
// the threads taking part (all of the CTA's by default).
struct SyncThreads {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// The two halves, for callers whose threads store parts of a tile on their own:
// the fragment into sTile (the thread's own elements of `mma`'s C tile), and
// rows < rows_left, columns < cols_left of sTile to gTile by tidx's share of
// GmemTiledCopy.
template <typename SmemCopyAtom, typename Acc, typename TiledMma, typename SmemTile>
__device__ __forceinline__ void stage_in_smem(const Acc& acc, TiledMma mma, SmemTile& sTile, int tidx) {
  using Element = typename SmemTile::value_type;
  Tensor rAcc = convert_fragment<Element>(acc);
  auto copy_c = make_tiled_copy_C(SmemCopyAtom{}, mma);
  copy(copy_c, make_tensor(rAcc.data(), copy_c.retile(rAcc.layout())), copy_c.get_thread_slice(tidx).partition_D(sTile));
}

// SmemLoadAtom: the copy that reads shared memory (default: GmemTiledCopy's own).
template <typename GmemTiledCopy, typename SmemTile, typename GmemTile, typename RowOffset = NoRowOffset,
          typename SmemLoadAtom = void>
__device__ __forceinline__ void store_from_smem(const SmemTile& sTile, GmemTile& gTile, int rows_left, int cols_left,
                                                int tidx, const RowOffset& row_offset = {}, SmemLoadAtom* = nullptr) {
  using Element = typename SmemTile::value_type;
  GmemTiledCopy gmem_copy;
  auto thr = gmem_copy.get_thread_slice(tidx);
  Tensor tSsT = thr.partition_S(sTile);                                             // (CPY, CPY_ROWS, CPY_COLS)
  Tensor tSgT = thr.partition_D(gTile);
  Tensor tScT = thr.partition_S(make_identity_tensor(product_each(shape(sTile))));  // (row, col) of each
  Tensor tSpT = make_tensor<bool>(make_shape(size<2>(tSgT)));
  CUTE_UNROLL
  for (int k = 0; k < size(tSpT); ++k) tSpT(k) = get<1>(tScT(0, 0, k)) < cols_left;
  Tensor tSrT = make_tensor<Element>(shape(tSgT));
  if constexpr (std::is_void_v<SmemLoadAtom>) {
    copy(gmem_copy, tSsT, tSrT);
  } else {
    copy(SmemLoadAtom{}, tSsT, tSrT);
  }
  store_tile(gmem_copy, tSrT, tSgT, tScT, tSpT, rows_left, row_offset);
}

template <typename GmemTiledCopy, typename SmemCopyAtom, typename Acc, typename TiledMma, typename SmemTile,
          typename GmemTile, typename RowOffset = NoRowOffset, typename Sync = SyncThreads,
          typename SmemLoadAtom = void>
__device__ __forceinline__ void store_through_smem(const Acc& acc, TiledMma mma, SmemTile& sTile, GmemTile& gTile,
                                                   int rows_left, int cols_left, int tidx,
                                                   const RowOffset& row_offset = {}, const Sync& sync = {},
                                                   SmemLoadAtom* load = nullptr) {
  stage_in_smem<SmemCopyAtom>(acc, mma, sTile, tidx);
  sync();
  store_from_smem<GmemTiledCopy>(sTile, gTile, rows_left, cols_left, tidx, row_offset, load);
}

}  // namespace flashattn
