// Building a strided Indexer (strided.h) from a shape and its operands' strides, on the host: the
// same coalescing as the CPU's StridedLoop (size-1 dimensions dropped, dimensions ordered by the
// first operand's strides, neighbours merged where every operand steps over the inner one exactly).
#pragma once

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <vector>

#include "backend/cuda/strided.h"
#include "braid/tensor.h"

namespace braid::detail::cuda {

/// An Indexer over shape; strides[k] is operand k's stride array (shape.size() entries). With
/// reorder false the dimensions keep their row-major order, so that flat index i still names the
/// i-th element of shape in row-major order (for an output written at i).
template <int N>
Indexer<N> make_indexer(const Shape& shape, const std::array<const int64_t*, N>& strides, bool reorder = true) {
  Indexer<N> ix;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  ix.narrow = numel <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
  if (numel == 0) return ix;
  std::vector<size_t> dims;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) dims.push_back(d);
  if (reorder)
    std::stable_sort(dims.begin(), dims.end(),
                     [&](size_t x, size_t y) { return std::llabs(strides[0][x]) > std::llabs(strides[0][y]); });
  std::vector<int64_t> sizes;                 // innermost first
  std::vector<std::array<int64_t, N>> steps;  // per coalesced dimension
  for (size_t i = dims.size(); i-- > 0;) {
    const size_t d = dims[i];
    std::array<int64_t, N> st{};
    for (int k = 0; k < N; ++k) st[k] = strides[k][d];
    bool merge = !sizes.empty();
    for (int k = 0; merge && k < N; ++k) merge = st[k] == steps.back()[k] * sizes.back();
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      steps.push_back(st);
    }
  }
  BRAID_CHECK_T(NotImplementedError, sizes.size() <= static_cast<size_t>(kMaxDims), "CUDA kernels support at most ",
                kMaxDims, " non-mergeable dimensions, got ", sizes.size(), " for shape ", shape_str(shape),
                "; call contiguous() first");
  ix.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) ix.strides[d][k] = steps[d][k];
  }
  return ix;
}

}  // namespace braid::detail::cuda
