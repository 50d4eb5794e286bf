// The sm90 family's TMA-fed stages: what the warp-specialised forward and
// backward share about them.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace flashattn {

// A stage filled by TMA from thread 0 (which announces `bytes`) and released by
// each consumer warp (cutlass::PipelineTmaAsync in a CTA of its own).
template <typename Pipeline, typename Traits>
__device__ typename Pipeline::Params tma_pipeline_params(bool producer, uint32_t bytes) {
  typename Pipeline::Params p;
  p.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  p.is_leader = threadIdx.x == 0;
  p.num_consumers = Traits::kConsumerThreads / 32;
  p.transaction_bytes = bytes;
  return p;
}

// Zeroes rows [first_row, end) of a (rows, head dim) shared-memory tile in the
// consumers' 16-byte stores (a swizzle moves whole 16-byte chunks of a row):
// rows TMA read past a varlen sequence's end, which belong to the next one.
template <typename Traits, typename Tile>
__device__ __forceinline__ void zero_rows_from(Tile& tile, int first_row, int tidx) {
  constexpr int kRows = decltype(cute::size<0>(tile))::value;
  constexpr int kChunks = decltype(cute::size<1>(tile))::value / 8;
#pragma unroll 1  // unrolled, it spilled in the d256 forward's loop
  for (int i = tidx; i < (kRows - first_row) * kChunks; i += Traits::kConsumerThreads)
    *reinterpret_cast<uint4*>(&tile(first_row + i / kChunks, i % kChunks * 8)) = make_uint4(0, 0, 0, 0);
}

}  // namespace flashattn
