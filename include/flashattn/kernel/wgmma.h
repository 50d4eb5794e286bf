// Warpgroup MMA (wgmma, sm_90a) helpers for the kernels shared by every family:
// a family whose traits set kWgmma reads its MMA operands from shared memory
// through descriptors instead of loading them into registers.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

namespace flashattn {

template <typename Traits, typename = void>
struct UsesWgmma : std::false_type {};
template <typename Traits>
struct UsesWgmma<Traits, std::void_t<decltype(Traits::kWgmma)>> : std::bool_constant<Traits::kWgmma> {};
template <typename Traits>
constexpr bool kUsesWgmma = UsesWgmma<Traits>::value;

// Shared-memory writes through the generic proxy (cp.async, st.shared) are not
// ordered with wgmma's reads, which go through the async proxy: every writing
// thread fences after its writes landed and before the barrier that publishes
// them. Nothing for the other families.
template <typename Traits>
__device__ __forceinline__ void publish_smem_to_mma() {
  if constexpr (kUsesWgmma<Traits>) cutlass::arch::fence_view_async_shared();
}

// acc (=, kZeroInit; else +=) A . B^T over all k-steps, issued as one wgmma batch
// (one commit group) and not waited for: acc is ready after wgmma_wait. A:
// descriptors (shared memory) or registers (left unchanged until the wait); B:
// descriptors.
template <bool kZeroInit, typename TiledMma, typename A, typename B, typename Acc>
__device__ __forceinline__ void wgmma_issue(TiledMma& tiled_mma, A& a, const B& b, Acc& acc) {
  using namespace cute;
  constexpr bool kRegisterA = !std::is_base_of_v<GMMA::DescriptorIterator, typename A::engine_type::iterator>;
  if constexpr (kRegisterA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(tiled_mma, a(_, _, k), b(_, _, k), acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// The slice of a tiled wgmma for the shared-memory operands' descriptors, which
// are the same for every thread of a warpgroup. Taken at the warpgroup's first
// thread, its index passed through a shuffle so that the compiler knows it is
// warp-uniform: the descriptors are then built in uniform registers instead of
// being moved there before every wgmma (16 R2UR per d128 S product).
template <typename TiledMma>
__device__ __forceinline__ auto warpgroup_slice(const TiledMma& tiled_mma, int tidx) {
  return tiled_mma.get_thread_slice(__shfl_sync(0xffffffffu, tidx / 128, 0) * 128);
}

// Waits until at most kPending of this warpgroup's batches are in flight (they
// complete in issue order); the accumulators named are then readable.
template <int kPending, typename... Accs>
__device__ __forceinline__ void wgmma_wait(Accs&... accs) {
  cute::warpgroup_wait<kPending>();
  (cute::warpgroup_fence_operand(accs), ...);
}

// wgmma_issue, then wait for it.
template <bool kZeroInit, typename TiledMma, typename A, typename B, typename Acc>
__device__ __forceinline__ void wgmma_gemm(TiledMma& tiled_mma, A& a, const B& b, Acc& acc) {
  constexpr bool kRegisterA =
      !std::is_base_of_v<cute::GMMA::DescriptorIterator, typename A::engine_type::iterator>;
  wgmma_issue<kZeroInit>(tiled_mma, a, b, acc);
  wgmma_wait<0>(acc);
  if constexpr (kRegisterA) cute::warpgroup_fence_operand(a);
}

// The products of a kernel shared by every family: asynchronous under wgmma (wait
// with products_wait), done on return elsewhere (products_wait does nothing).
template <typename Traits, int kPending, typename... Accs>
__device__ __forceinline__ void products_wait(Accs&... accs) {
  if constexpr (kUsesWgmma<Traits>) wgmma_wait<kPending>(accs...);
}

// Named barrier of a warp-specialised kernel's consumer warpgroups (id 0 after
// CUTLASS's reserved ones): the producer never joins it.
template <typename Traits>
__device__ __forceinline__ void consumers_sync() {
  cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 0);
}

// The 128 threads of consumer warpgroup `wg` (named barriers 1, 2, ...).
__device__ __forceinline__ void warpgroup_sync(int wg) { cutlass::arch::NamedBarrier::sync(128, 1 + wg); }

// Turns of two consumer warpgroups (named barriers 4 and 5): warpgroup wg waits
// for its turn (the other's pass, or the first turn, see first_turn), issues its
// products, and passes the turn on. Each warpgroup must take as many turns as the
// other, and nothing inside a turn may wait for the other warpgroup.
__device__ __forceinline__ void take_turn(int wg) { cutlass::arch::NamedBarrier::sync(256, 4 + wg); }
__device__ __forceinline__ void pass_turn(int wg) { cutlass::arch::NamedBarrier::arrive(256, 4 + (1 - wg)); }
// Warpgroup 0 takes the first turn: warpgroup 1 passes it once, at the start.
__device__ __forceinline__ void first_turn(int wg) {
  if (wg == 1) pass_turn(1);
}

template <typename Traits>
struct ConsumersSync {
  __device__ __forceinline__ void operator()() const { consumers_sync<Traits>(); }
};

}  // namespace flashattn
