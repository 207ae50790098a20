// The strided loop's set-up (dropping size-1 dimensions, ordering by the first operand's strides,
// merging dimensions that are contiguous in every operand) and its run walker. Kept out of line so
// that each kernel instantiates only its inner loop, not the walker.
#include "backend/cpu/loop.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "braid/parallel.h"

namespace braid::detail {

StridedLoop::StridedLoop(const Shape& shape, std::initializer_list<LoopOperand> operands)
    : nops_(static_cast<int>(operands.size())) {
  BRAID_ASSERT(nops_ >= 1 && nops_ <= kMaxOperands, "a loop takes 1 to ", kMaxOperands, " operands");
  const LoopOperand* ops = operands.begin();
  for (int k = 0; k < nops_; ++k) base_[k] = ops[k].data;
  numel_ = 1;
  for (int64_t s : shape) numel_ *= s;
  if (numel_ == 0) return;

  // Dimensions of size 1 never move a pointer; the rest are ordered by the first operand's
  // stride (largest first) so that an output that is a permuted view is still walked in memory order.
  // Fixed arrays, not vectors: a small op's loop must not allocate.
  BRAID_CHECK_T(NotImplementedError, shape.size() <= static_cast<size_t>(kMaxRank), "CPU kernels support at most ",
                kMaxRank, " dimensions, got ", shape.size(), " for shape ", shape_str(shape));
  std::array<int, kMaxRank> dims;
  int nd = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) dims[nd++] = static_cast<int>(d);
  // Insertion sort (stable; std::stable_sort allocates a buffer), on a handful of dimensions.
  for (int i = 1; i < nd; ++i) {
    int d = dims[i], j = i;
    for (; j > 0 && std::llabs(ops[0].strides[dims[j - 1]]) < std::llabs(ops[0].strides[d]); --j) dims[j] = dims[j - 1];
    dims[j] = d;
  }

  // Merge from the innermost outwards: dimension d folds into the one inside it when every operand
  // steps over the inner one exactly once per step of d.
  std::array<int64_t, kMaxRank> sizes;
  std::array<std::array<int64_t, kMaxOperands>, kMaxRank> strides;  // elements, innermost first
  int n = 0;
  for (int i = nd; i-- > 0;) {
    int d = dims[i];
    std::array<int64_t, kMaxOperands> st{};
    for (int k = 0; k < nops_; ++k) st[k] = ops[k].strides[d];
    bool merge = n > 0;
    for (int k = 0; merge && k < nops_; ++k) merge = st[k] == strides[n - 1][k] * sizes[n - 1];
    if (merge) {
      sizes[n - 1] *= shape[d];
    } else {
      sizes[n] = shape[d];
      strides[n++] = st;
    }
  }
  if (n == 0) {  // a single element
    sizes[0] = 1;
    strides[0] = {};
    n = 1;
  }
  BRAID_CHECK_T(NotImplementedError, n <= kMaxLoopDims, "CPU kernels support at most ", kMaxLoopDims,
                " non-mergeable dimensions, got ", n, " for shape ", shape_str(shape), "; call contiguous() first");
  ndim_ = n;
  for (int i = 0; i < ndim_; ++i) {
    int d = ndim_ - 1 - i;
    shape_[d] = sizes[i];
    for (int k = 0; k < nops_; ++k) bytes_[d][k] = strides[i][k] * ops[k].elem_size;
  }
  for (int k = 0; k < nops_; ++k) inner_strides_[k] = strides[0][k];
}

void StridedLoop::run(RunFn fn, int64_t work_per_element) const {
  if (numel_ == 0) return;
  const int nt = get_num_threads();
  const bool small = numel_ <= kParallelGrain / std::max<int64_t>(work_per_element, 1);
  if (nt <= 1 || small || omp_in_parallel()) {
    run_range(base_.data(), 0, numel_, fn);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    auto [begin, end] = thread_range(numel_, omp_get_thread_num(), omp_get_num_threads());
    run_range(base_.data(), begin, end, fn);
  }
}

void StridedLoop::run_rows(RowsFn fn, int64_t work_per_element) const {
  if (numel_ == 0) return;
  const int last = ndim_ - 1, outer = last - 1;
  const int64_t n = shape_[last], total = numel_ / n;  // rows
  std::array<int64_t, kMaxOperands> outer_bytes{};
  if (outer >= 0)
    for (int k = 0; k < nops_; ++k) outer_bytes[k] = bytes_[outer][k];
  // Rows [rb, re) in order, in blocks that end where the second-innermost dimension wraps.
  const auto rows_range = [&](int64_t rb, int64_t re) {
    if (rb >= re) return;
    if (outer < 0) {  // one dimension: one row
      fn(const_cast<char* const*>(base_.data()), inner_strides_.data(), n, outer_bytes.data(), 1);
      return;
    }
    std::array<int64_t, kMaxLoopDims> idx;
    std::array<int64_t, kMaxOperands> off{};
    int64_t rem = rb;
    for (int d = outer; d >= 0; --d) {
      idx[d] = rem % shape_[d];
      rem /= shape_[d];
      for (int k = 0; k < nops_; ++k) off[k] += idx[d] * bytes_[d][k];
    }
    std::array<char*, kMaxOperands> ptrs{};
    for (int64_t r = rb;;) {
      const int64_t rows = std::min(shape_[outer] - idx[outer], re - r);
      for (int k = 0; k < nops_; ++k) ptrs[k] = base_[k] + off[k];
      fn(ptrs.data(), inner_strides_.data(), n, outer_bytes.data(), rows);
      r += rows;
      if (r >= re) return;
      idx[outer] += rows;
      for (int k = 0; k < nops_; ++k) off[k] += rows * bytes_[outer][k];
      for (int d = outer; d > 0 && idx[d] == shape_[d]; --d) {  // carry into the outer dimensions
        idx[d] = 0;
        ++idx[d - 1];
        for (int k = 0; k < nops_; ++k) off[k] += bytes_[d - 1][k] - shape_[d] * bytes_[d][k];
      }
    }
  };
  const int nt = get_num_threads();
  const bool small = numel_ <= kParallelGrain / std::max<int64_t>(work_per_element, 1);
  if (nt <= 1 || small || omp_in_parallel() || total < 2) {
    rows_range(0, total);
    return;
  }
  in_team(nt, [&](int t, int parts) { rows_range(total * t / parts, total * (t + 1) / parts); });
}

void StridedLoop::run_range(char* const* base, int64_t begin, int64_t end, RunFn fn) const {
  if (begin >= end) return;
  const int last = ndim_ - 1;
  std::array<int64_t, kMaxLoopDims> idx{};
  std::array<int64_t, kMaxOperands> off{};  // bytes from base, per operand
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % shape_[d];
    rem /= shape_[d];
    for (int k = 0; k < nops_; ++k) off[k] += idx[d] * bytes_[d][k];
  }
  std::array<char*, kMaxOperands> ptrs{};
  for (int64_t pos = begin;;) {
    const int64_t n = std::min(shape_[last] - idx[last], end - pos);
    for (int k = 0; k < nops_; ++k) ptrs[k] = base[k] + off[k];
    fn(ptrs.data(), inner_strides_.data(), n);
    pos += n;
    if (pos >= end) return;
    idx[last] += n;
    for (int k = 0; k < nops_; ++k) off[k] += n * bytes_[last][k];
    for (int d = last; d > 0 && idx[d] == shape_[d]; --d) {  // carry into the outer dimensions
      idx[d] = 0;
      ++idx[d - 1];
      for (int k = 0; k < nops_; ++k) off[k] += bytes_[d - 1][k] - shape_[d] * bytes_[d][k];
    }
  }
}

}  // namespace braid::detail
