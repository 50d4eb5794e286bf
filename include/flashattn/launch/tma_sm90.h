// TMA descriptors of the sm90 family's loads (host side): a (rows, head dim,
// heads, batch) view of q, k, v or dO, made per call.
#pragma once

#include <stdexcept>
#include <string>

#include <cute/tensor.hpp>

#include "flashattn/arch/sm90.h"
#include "flashattn/params.h"

namespace flashattn {

// A TMA descriptor of q, k, v or dO as a (rows, head dim, heads, batch) view, for
// boxes of kRows x the bucket's head dim; a varlen tensor is one batch of its
// packed rows. Strides of dims of size 1 are never stepped and may be any number
// (ops.cpp checks the others are multiples of 16 bytes, as TMA needs): they are
// replaced by 16 bytes. A zero stride on a longer dim (a view from expand()) is
// refused: TMA descriptors are not specified for it.
template <typename Element, int kHeadDim, int kRows, typename SmemLayout>
auto make_rows_tma(const char* name, const void* base, const void* fallback, bool packed, int rows, int total_rows,
                   int heads, int batch, int head_dim, index_t row_stride, index_t head_stride,
                   index_t batch_stride) {
  if (packed) {
    rows = total_rows;
    batch = 1;
  }
  // A tensor without rows (varlen, every sequence empty on that side) is never
  // read; the descriptor still needs an address and a row.
  if (rows == 0) {
    base = fallback;
    rows = 1;
  }
  auto stride_of = [&](int size, index_t stride) {
    if (size > 1 && stride == 0) {
      throw std::runtime_error(std::string("flashattn: ") + name +
                               " repeats along a dim (stride 0 and size > 1, e.g. a view from expand()); the sm90 "
                               "kernels read it through TMA, which needs real strides: pass " + name +
                               ".contiguous() (the flash_attn_* functions copy such inputs)");
    }
    return int64_t(size > 1 ? stride : 16 / sizeof(Element));
  };
  Tensor view = make_tensor(make_gmem_ptr(static_cast<Element const*>(base)),
                            GmemLayoutRows(make_shape(rows, head_dim, heads, batch),
                                           make_stride(stride_of(rows, row_stride), _1{}, stride_of(heads, head_stride),
                                                       stride_of(batch, batch_stride))));
  return make_tma_copy(SM90_TMA_LOAD{}, view, SmemLayout{}, Shape<Int<kRows>, Int<kHeadDim>>{}, _1{});
}

}  // namespace flashattn
