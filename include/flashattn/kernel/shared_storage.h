// Shared memory of each pass as a struct: its sizeof is the dynamic shared
// memory a launch asks for, and the kernels take their tiles from its members
// (no size formulas elsewhere). Every member is a whole number of 16-byte
// vectors, so nothing pads between them.
#pragma once

#include <cute/container/array_aligned.hpp>
#include <cute/layout.hpp>

namespace flashattn {

template <typename Element, typename Layout>
using SmemTile = cute::array_aligned<Element, cute::cosize_v<Layout>, 16>;

// Forward: Q (the output is staged there at the end), K, V.
template <typename Traits>
struct FwdSharedStorageBase {
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutQ> q;
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutKV> k;
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutKV> v;
};

// ... and P where the accumulator layout is no operand layout (Volta).
template <typename Traits, bool kPThroughSmem = Traits::kPThroughSmem>
struct FwdSharedStorage : FwdSharedStorageBase<Traits> {};

template <typename Traits>
struct FwdSharedStorage<Traits, true> : FwdSharedStorageBase<Traits> {
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutP> p;
};

// The KV cache kernel: the forward's, and for paged K/V the (page, row in page)
// of each row of two key blocks (staged by fwd.h), where the family's GPUs
// give a CTA room for them (not the sm75 family's largest tiles).
template <typename Traits>
struct KvSharedStorage : FwdSharedStorage<Traits> {
  int2 pages[2 * Traits::kBlockN];
};

template <typename Traits>
constexpr bool kv_stages_pages = sizeof(KvSharedStorage<Traits>) <= Traits::kMaxSmemBytes;

template <typename Traits>
constexpr int kv_smem_bytes() {
  return int(kv_stages_pages<Traits> ? sizeof(KvSharedStorage<Traits>) : sizeof(FwdSharedStorage<Traits>));
}

// Backward: Q (two buffers with kDoubleBufferQ), dO, K, V, P, dS. dK and dV are
// staged where Q and dO were, dQ (the conversion kernel) where Q was.
template <typename Traits>
struct BwdSharedStorage {
  using Element = typename Traits::Element;
  SmemTile<Element, typename Traits::SmemLayoutQdO> q[Traits::kDoubleBufferQ ? 2 : 1];
  SmemTile<Element, typename Traits::SmemLayoutQdO> d_o;
  SmemTile<Element, typename Traits::SmemLayoutKV> k;
  SmemTile<Element, typename Traits::SmemLayoutKV> v;
  SmemTile<Element, typename Traits::SmemLayoutPdS> p;
  SmemTile<Element, typename Traits::SmemLayoutPdS> ds;
};

// The dQ conversion kernel: one dQ tile.
template <typename Traits>
struct ConvertDqSharedStorage {
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutQdO> dq;
};

}  // namespace flashattn
