// Host side of a forward launch, shared by every family: grid, shared memory.
// A family's launch header names, per head-dim bucket and tile set, a `Kernel`
// with `Traits` and `kBuilt` (launch/tile_set.h); the generated instantiation
// files call launch_fwd<Kernel> and publish tile_smem_bytes<Kernel> for the
// kernel table, which picks the largest tile that fits the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "flashattn/kernel/fwd.h"
#include "flashattn/kernel/grid_dependency.h"
#include "flashattn/launch/kv_cache_launch.h"
#include "flashattn/launch/tile_set.h"
#include "flashattn/params.h"

namespace flashattn {

// What a CTA asks for so that no more than two share an SM (each takes its ask
// plus what the GPU reserves per CTA): just over a third of the SM's shared
// memory, less the reservation. Asked once per device (< 64); 0 if the GPU does
// not say.
inline int smem_for_two_ctas_per_sm(int device) {
  static std::atomic<int> bytes[64];  // 0: not asked yet
  int known = bytes[device & 63].load(std::memory_order_relaxed);
  if (known > 0) return known;
  int per_sm = 0, reserved = 0;
  if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  known = ((per_sm / 3 - reserved) / 128 + 1) * 128;
  bytes[device & 63].store(known, std::memory_order_relaxed);
  return known;
}

// The KV cache kernel (softcap and ALiBi as runtime features) with its own tile,
// then the merge of its splits; each may start while the kernel before it
// finishes (kernel/grid_dependency.h).
// kKvStages: key blocks of K and V in flight (fwd.h). With stages, at most two
// CTAs per SM, as the kernel was tuned and as the split count assumes
// (choose_num_splits, cpp/ops.cpp): its d64 registers (161) let a third one in on
// Hopper, and b = 64 decode lost 5-22% where the last of fewer, fuller waves ran
// few CTAs (H100; docs/perf-notes.md, decode).
template <typename KvTraits, int kKvStages>
void launch_fwd_kv_cache_kernel(const FwdParams& params, cudaStream_t stream) {
  constexpr int kSmem = kv_smem_bytes<KvTraits, kKvStages>();
  static_assert(kSmem <= KvTraits::kMaxSmemBytes, "the tile needs more shared memory than the family's GPUs give a CTA");
  constexpr auto kKernel = &fwd_kernel<KvTraits, true, true, false, kKvStages>;
  // Padded within what a launch may use (FLASHATTN_MAX_SMEM_KB included).
  const int limit = params.max_smem > 0 ? std::min(params.max_smem, KvTraits::kMaxSmemBytes) : KvTraits::kMaxSmemBytes;
  // (A cap below the two-CTA ask, e.g. FLASHATTN_MAX_SMEM_KB=64 on an H100, lets
  // a third CTA in: slower at large batches, not wrong.)
  const int smem = kKvStages > 1 ? std::max(kSmem, std::min(smem_for_two_ctas_per_sm(params.device), limit)) : kSmem;
  // Opted in once per kernel and device: at the most any call asks.
  opt_in_smem<kKernel>(kKvStages > 1 && params.max_smem > 0 ? std::max(kSmem, limit) : smem, params.device);
  if (launch_after_previous_kernel<kKernel>(QueryTileScheduler<KvTraits::kBlockM, true>::num_ctas(params),
                                            KvTraits::kNThreads, smem, stream, params.device, params) != cudaSuccess) {
    return;  // the caller's check_launch reports it; no merge of splits never written
  }
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
