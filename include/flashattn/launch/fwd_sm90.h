// sm90 family forward: the warp-specialised kernel's tiles per head-dim bucket,
// and the KV cache kernel's. Two consumer warpgroups of 64 query rows, and key
// blocks as long as two K and two V stages leave room for (H100, bf16; the
// stage-1 tile sweeps and the warp-specialised kernel's runs are in
// docs/perf-notes.md). benchmarks/sweep_sm90_tiles.sh builds every bucket with
// one tile instead (FLASHATTN_SM90_TILE_M / _N) to time alternatives.
#pragma once

#include <stdexcept>
#include <string>

#include "flashattn/arch/sm90.h"
#include "flashattn/kernel/fwd_sm90.h"
#include "flashattn/launch/fwd_launch.h"

namespace flashattn {

// Dropout's 8-bit units span the column groups of four lanes (kernel/dropout.h):
// its kernels keep key blocks of a multiple of 32 columns.
template <int kHeadDim>
struct Sm90FwdWsDropoutTile {
  static constexpr int kM = 128, kN = kHeadDim <= 160 ? 128 : kHeadDim <= 192 ? 96 : 64;
};
#if defined(FLASHATTN_SM90_TILE_M) && defined(FLASHATTN_SM90_TILE_N)
template <int kHeadDim>
struct Sm90FwdWsTile {
  static constexpr int kM = FLASHATTN_SM90_TILE_M, kN = FLASHATTN_SM90_TILE_N;
};
#else
template <int kHeadDim>
struct Sm90FwdWsTile : Sm90FwdWsDropoutTile<kHeadDim> {};
#endif

// A TMA descriptor of q, k or v as a (rows, head dim, heads, batch) view, for
// boxes of kRows x the bucket's head dim; a varlen tensor is one batch of its
// packed rows. Strides of dims of size 1 are never stepped and may be any number
// (ops.cpp checks the others are multiples of 16 bytes, as TMA needs): they are
// replaced by 16 bytes. A zero stride on a longer dim (a view from expand()) is
// refused: TMA descriptors are not specified for it.
template <typename Traits, int kRows, typename SmemLayout>
auto make_rows_tma(const char* name, const void* base, const void* fallback, bool packed, int rows, int total_rows,
                   int heads, int batch, int head_dim, index_t row_stride, index_t head_stride,
                   index_t batch_stride) {
  using Element = typename Traits::Element;
  if (packed) {
    rows = total_rows;
    batch = 1;
  }
  // Varlen without any key: the kernels read no key, and the descriptor needs
  // an address and a row.
  if (rows == 0) {
    base = fallback;
    rows = 1;
  }
  auto stride_of = [&](int size, index_t stride) {
    if (size > 1 && stride == 0) {
      throw std::runtime_error(std::string("flashattn: ") + name +
                               " repeats along a dim (stride 0 and size > 1, e.g. a view from expand()); the sm90 "
                               "forward reads q, k and v through TMA, which needs real strides: pass " + name +
                               ".contiguous() (the flash_attn_* functions copy such inputs)");
    }
    return int64_t(size > 1 ? stride : 16 / sizeof(Element));
  };
  Tensor view = make_tensor(make_gmem_ptr(static_cast<Element const*>(base)),
                            typename Traits::GmemLayoutRows(
                                make_shape(rows, head_dim, heads, batch),
                                make_stride(stride_of(rows, row_stride), _1{}, stride_of(heads, head_stride),
                                            stride_of(batch, batch_stride))));
  return make_tma_copy(SM90_TMA_LOAD{}, view, SmemLayout{}, Shape<Int<kRows>, Int<Traits::kHeadDim>>{}, _1{});
}

template <typename Traits>
FwdWsLoads<Traits> make_fwd_ws_loads(const FwdParams& p) {
  const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN;
  using LayoutQ = typename Traits::SmemLayoutQ;
  using LayoutKV = typename Traits::SmemLayoutKV;
  return {make_rows_tma<Traits, kM, LayoutQ>("q", p.q, p.q, packed_q, p.seqlen_q, p.total_q, p.heads, p.batch,
                                             p.head_dim, p.q_row_stride, p.q_head_stride, p.q_batch_stride),
          make_rows_tma<Traits, kN, LayoutKV>("k", p.k, p.q, packed_k, p.seqlen_k, p.total_k, p.heads_k, p.batch,
                                              p.head_dim, p.k_row_stride, p.k_head_stride, p.k_batch_stride),
          make_rows_tma<Traits, kN, LayoutKV>("v", p.v, p.q, packed_k, p.seqlen_k, p.total_k, p.heads_k, p.batch,
                                              p.head_dim, p.v_row_stride, p.v_head_stride, p.v_batch_stride)};
}

template <typename Traits, bool kScoreMods, bool kDropout>
void launch_fwd_ws_variant(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(sizeof(FwdWsSharedStorage<Traits>));
  static_assert(kSmem <= Traits::kMaxSmemBytes, "the tile needs more shared memory than Hopper gives a CTA");
  opt_in_smem<fwd_ws_kernel<Traits, kScoreMods, kDropout>>(kSmem, params.device);
  fwd_ws_kernel<Traits, kScoreMods, kDropout>
      <<<QueryTileScheduler<Traits::kBlockM>::num_persistent_ctas(params), Traits::kCtaThreads, kSmem, stream>>>(
          params, make_fwd_ws_loads<Traits>(params));
}

// The KV cache kernel: one warpgroup of 64 query rows (decode has few).
template <int kHeadDim>
struct Sm90FwdKvTile {
  static constexpr int kM = 64, kN = kHeadDim <= 128 ? 128 : 64;
};

// Every tile fits Hopper's 227 KB: one tile set.
template <typename Element, int kHeadDim, TileSet kSet>
struct Sm90Fwd {
  static constexpr bool kBuilt = kSet == TileSet::kDefault;
  using KvTile = Sm90FwdKvTile<kHeadDim>;
  using KvTraits = Sm90FwdTraits<Element, kHeadDim, KvTile::kM, KvTile::kN>;
  using WsTile = Sm90FwdWsTile<kHeadDim>;
  using WsTraits = Sm90FwdWsTraits<Element, kHeadDim, WsTile::kM, WsTile::kN>;
  using WsDropoutTile = Sm90FwdWsDropoutTile<kHeadDim>;
  using WsDropoutTraits = Sm90FwdWsTraits<Element, kHeadDim, WsDropoutTile::kM, WsDropoutTile::kN>;
  // The kernel table's shared memory: the largest of the forward kernels'.
  using SharedStorage = LargestType<FwdWsSharedStorage<WsTraits>, FwdWsSharedStorage<WsDropoutTraits>,
                                    FwdSharedStorage<KvTraits>>;

  // The forward (but the KV cache's) runs the warp-specialised kernel.
  static void launch_plain(const FwdParams& params, cudaStream_t stream) {
    launch_variant(params, [&](auto score_mods, auto dropout) {
      using Traits = std::conditional_t<decltype(dropout)::value, WsDropoutTraits, WsTraits>;
      launch_fwd_ws_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>(params, stream);
    });
  }
};

}  // namespace flashattn
