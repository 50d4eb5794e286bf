// The kernels a build holds, listed by the generated kernel_table.cpp.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "flashattn/params.h"

namespace flashattn {

// One kernel family of python/flashattn/families.json (built or not).
struct FamilyInfo {
  int family;                 // 70, 75, 80, 90
  int min_cc;                 // the oldest compute capability it runs on (10 * major + minor)
  bool arch_specific;         // machine code for min_cc alone (sm_90a)
  const char* arch_target;    // "90a" where arch_specific, else ""
  int backward_family;        // whose backward serves this family's forward
  bool bf16;
  bool tile_counter;          // its forward takes tiles from FwdParams::tile_counter
};

const std::vector<FamilyInfo>& family_registry();

using FwdKernelFn = void (*)(const FwdParams&, cudaStream_t);

// One tile of one kernel: the dispatcher runs, for the smallest bucket that
// holds the head dim, the tile with the most shared memory that fits the device.
struct FwdKernelEntry {
  int family;          // 70, 75, 80, 90
  const char* dtype;   // "fp16", "bf16"
  int head_dim;        // bucket: serves head dims up to this
  int smem_bytes;      // dynamic shared memory per CTA; 0: no kernel in this tile set
  int kv_block_m, kv_block_n;  // the KV cache kernel's tile: query rows and key rows of a CTA
  int skipping_block_m;        // the forward's rows per tile where its warpgroups skip rows past the end; 0: no such tile
  FwdKernelFn fn;
};

using BwdKernelFn = void (*)(const BwdParams&, cudaStream_t);

struct BwdKernelEntry {
  int family;
  const char* dtype;
  int head_dim;  // bucket; also the row length of the dq accumulator
  int smem_bytes;
  BwdKernelFn fn;
};

const std::vector<FwdKernelEntry>& fwd_kernel_table();
const std::vector<BwdKernelEntry>& bwd_kernel_table();

}  // namespace flashattn
