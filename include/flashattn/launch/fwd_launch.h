// Host side of a forward launch, shared by every family: grid, shared memory.
// A family's launch header names, per head-dim bucket and tile set, a `Kernel`
// with `Traits` and `kBuilt` (launch/tile_set.h); the generated instantiation
// files call launch_fwd<Kernel> and publish tile_smem_bytes<Kernel> for the
// kernel table, which picks the largest tile that fits the device.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "flashattn/kernel/fwd.h"
#include "flashattn/kernel/grid_dependency.h"
#include "flashattn/launch/kv_cache_launch.h"
#include "flashattn/launch/tile_set.h"
#include "flashattn/params.h"

namespace flashattn {

// The KV cache kernel (softcap and ALiBi as runtime features) with its own tile,
// then the merge of its splits; each may start while the kernel before it
// finishes (kernel/grid_dependency.h).
// kKvStages: key blocks of K and V in flight (fwd.h).
template <typename KvTraits, int kKvStages>
void launch_fwd_kv_cache_kernel(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = kv_smem_bytes<KvTraits, kKvStages>();
  static_assert(kSmem <= KvTraits::kMaxSmemBytes, "the tile needs more shared memory than the family's GPUs give a CTA");
  constexpr auto kKernel = &fwd_kernel<KvTraits, true, true, false, kKvStages>;
  opt_in_smem<kKernel>(kSmem, params.device);
  launch_after_previous_kernel<kKernel>(QueryTileScheduler<KvTraits::kBlockM, true>::num_ctas(params),
                                        KvTraits::kNThreads, kSmem, stream, params.device, params);
  if (params.num_splits > 1) launch_combine_splits(params, stream);
}

// One of the four kernels of the (score modifiers, dropout) flags.
template <typename Traits, bool kScoreMods, bool kDropout>
void launch_fwd_variant(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = int(sizeof(FwdSharedStorage<Traits>));
  static_assert(kSmem <= Traits::kMaxSmemBytes, "the tile needs more shared memory than the family's GPUs give a CTA");
  auto kernel = &fwd_kernel<Traits, kScoreMods, false, kDropout>;
  opt_in_smem<fwd_kernel<Traits, kScoreMods, false, kDropout>>(kSmem, params.device);
  kernel<<<QueryTileScheduler<Traits::kBlockM>::num_ctas(params), Traits::kNThreads, kSmem, stream>>>(params);
}

template <typename Traits>
void launch_fwd_kernel(const FwdParams& params, cudaStream_t stream) {
  launch_variant(params, [&](auto score_mods, auto dropout) {
    launch_fwd_variant<Traits, decltype(score_mods)::value, decltype(dropout)::value>(params, stream);
  });
}

// A family may run the forward but the KV cache's with a kernel of its own
// (Kernel::launch_plain: the sm90 family's warp-specialised one).
template <typename Kernel, typename = void>
struct HasOwnPlainForward : std::false_type {};
template <typename Kernel>
struct HasOwnPlainForward<Kernel, std::void_t<decltype(&Kernel::launch_plain)>> : std::true_type {};

template <typename Kernel>
void launch_fwd(const FwdParams& params, cudaStream_t stream) {
  if constexpr (Kernel::kBuilt) {
    if (params.kv_cache) {
      launch_fwd_kv_cache_kernel<typename Kernel::KvTraits, Kernel::kKvStages>(params, stream);
    } else if constexpr (HasOwnPlainForward<Kernel>::value) {
      Kernel::launch_plain(params, stream);
    } else {
      launch_fwd_kernel<typename Kernel::Traits>(params, stream);  // instantiated only here
    }
  }
}

}  // namespace flashattn
