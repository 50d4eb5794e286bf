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
// and waited for. A: descriptors (shared memory) or registers; B: descriptors.
template <bool kZeroInit, typename TiledMma, typename A, typename B, typename Acc>
__device__ __forceinline__ void wgmma_gemm(TiledMma& tiled_mma, A& a, const B& b, Acc& acc) {
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
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  if constexpr (kRegisterA) warpgroup_fence_operand(a);
}

}  // namespace flashattn
