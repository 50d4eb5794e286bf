// Shared memory of each pass as a struct: its sizeof is the dynamic shared
// memory a launch asks for, and the kernels take their tiles from its members
// (no size formulas elsewhere). Every member is a whole number of 16-byte
// vectors, so nothing pads between them.
#pragma once

#include <cstdint>

#include <cute/container/array_aligned.hpp>
#include <cute/layout.hpp>

namespace flashattn {

template <typename Element, typename Layout>
using SmemTile = cute::array_aligned<Element, cute::cosize_v<Layout>, 16>;

// Forward: Q (the output is staged there at the end), K, V; the KV cache
// kernel may keep kStages blocks of K and V in flight (fwd.h).
template <typename Traits, int kStages = 1>
struct FwdSharedStorageBase {
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutQ> q;
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutKV> k[kStages];
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutKV> v[kStages];
};

// ... and P where the accumulator layout is no operand layout (Volta).
template <typename Traits, int kStages = 1, bool kPThroughSmem = Traits::kPThroughSmem>
struct FwdSharedStorage : FwdSharedStorageBase<Traits, kStages> {};

template <typename Traits, int kStages>
struct FwdSharedStorage<Traits, kStages, true> : FwdSharedStorageBase<Traits, kStages> {
  SmemTile<typename Traits::Element, typename Traits::SmemLayoutP> p;
};

// A key row's place in a paged KV cache: its K and V offsets in elements, whole,
// so that the threads that copy the row read them rather than each redo the
// page arithmetic (fwd.h).
struct alignas(16) PagedRow {
  int64_t offset[2];  // K's, V's
};

// The KV cache kernel: the forward's, and for paged K/V the K and V offsets of
// each row of two key blocks (PagedRow, staged by fwd.h), where the family's
// GPUs give a CTA room for them (not the sm75 family's largest tiles).
template <typename Traits, int kStages = 1>
struct KvSharedStorage : FwdSharedStorage<Traits, kStages> {
  PagedRow pages[2 * Traits::kBlockN];
};

template <typename Traits, int kStages = 1>
constexpr bool kv_stages_pages = sizeof(KvSharedStorage<Traits, kStages>) <= Traits::kMaxSmemBytes;

template <typename Traits, int kStages = 1>
constexpr int kv_smem_bytes() {
  return int(kv_stages_pages<Traits, kStages> ? sizeof(KvSharedStorage<Traits, kStages>)
                                              : sizeof(FwdSharedStorage<Traits, kStages>));
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
