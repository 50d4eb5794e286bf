// Tile sets and the once-per-device shared-memory opt-in, shared by every
// family's launchers.
//
// Every family has its default tiles. The sm80 family also has a second set,
// `kSmem99`, for GPUs that allow 99 KB of shared memory per block (cc 8.6 and
// 8.9: A10, A10G, L4, L40S, RTX 3090/4090), built only for the head dims whose
// default tile needs more; each set is its own instantiation file. The host
// (cpp/ops.cpp) runs the largest tile that fits the device's opt-in limit, or
// the limit set by FLASHATTN_MAX_SMEM_KB.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace flashattn {

enum class TileSet : int { kDefault = 0, kSmem99 = 1 };

constexpr int kSmem99Bytes = 99 * 1024;

// The largest of several shared-memory structs (where a family's kernels for
// one bucket differ, the kernel table states the largest).
template <typename T, typename... Rest>
struct Largest {
  using type = T;
};
template <typename T, typename U, typename... Rest>
struct Largest<T, U, Rest...> : Largest<std::conditional_t<(sizeof(U) > sizeof(T)), U, T>, Rest...> {};
template <typename... Ts>
using LargestType = typename Largest<Ts...>::type;

// Every main kernel takes score modifiers (softcap, ALiBi) and dropout as
// template flags: calls launch(kScoreMods, kDropout), both std::bool_constant,
// with the variant a call needs.
template <typename Params, typename Launch>
void launch_variant(const Params& params, Launch&& launch) {
  const bool score_mods = params.softcap > 0.f || params.alibi_slopes != nullptr;
  auto with_dropout = [&](auto dropout) {
    if (score_mods) launch(std::true_type{}, dropout);
    else launch(std::false_type{}, dropout);
  };
  if (params.dropout) with_dropout(std::true_type{});
  else with_dropout(std::false_type{});
}

// Shared memory of a family's kernel for one bucket and tile set (Kernel: its
// SharedStorage and kBuilt), for the kernel table; 0 where the set has no tile
// of its own.
template <typename Kernel>
constexpr int tile_smem_bytes() {
  return Kernel::kBuilt ? int(sizeof(typename Kernel::SharedStorage)) : 0;
}

// The query rows of a persistent forward tile whose warpgroups skip rows past a
// sequence's end (Kernel::kSkippingBlockM, where the family has one), else 0: its
// last tile of a sequence is lighter, and the host hands such a grid a tile
// counter (cpp/ops.cpp, zeroed_tile_counter).
template <typename Kernel, typename = void>
struct SkippingBlockM : std::integral_constant<int, 0> {};
template <typename Kernel>
struct SkippingBlockM<Kernel, std::void_t<decltype(Kernel::kSkippingBlockM)>>
    : std::integral_constant<int, Kernel::kSkippingBlockM> {};
template <typename Kernel>
constexpr int skipping_block_m() {
  return Kernel::kBuilt ? SkippingBlockM<Kernel>::value : 0;
}

// Above 48 KB a kernel must opt in to its dynamic shared memory, once per
// device: a bit per device (< 64, as the host checks) remembers a success
// (setting it twice is harmless; a failure is retried, and the launch reports it).
template <auto kKernel>
void opt_in_smem(int smem_bytes, int device) {
  if (smem_bytes < 48 * 1024) return;
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) == cudaSuccess)
    done.fetch_or(bit, std::memory_order_release);
}

}  // namespace flashattn
