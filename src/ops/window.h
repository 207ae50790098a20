// Helpers of the window ops (convolution and pooling, src/ops/conv.cpp and src/ops/pool.cpp): their
// argument checks and a window's axes.
#pragma once

#include <vector>

#include "ops/common.h"

namespace braid::detail {

// Spreads a PyTorch int-or-tuple argument over n axes.
inline std::vector<int64_t> per_axis(const std::vector<int64_t>& v, size_t n, const char* op, const char* name) {
  BRAID_CHECK(v.size() == 1 || v.size() == n, op, ": ", name, " must have 1 or ", n, " values, got ", v.size(), " (",
              shape_str(v), ")");
  return v.size() == 1 ? std::vector<int64_t>(n, v[0]) : v;
}

inline void check_positive(const std::vector<int64_t>& v, const char* op, const char* name) {
  for (int64_t e : v) BRAID_CHECK(e > 0, op, ": ", name, " must be positive, got ", shape_str(v));
}

inline void check_non_negative(const std::vector<int64_t>& v, const char* op, const char* name) {
  for (int64_t e : v) BRAID_CHECK(e >= 0, op, ": ", name, " must be non-negative, got ", shape_str(v));
}

inline void check_float(const Tensor& t, const char* op, const char* what) {
  check_compute(t, op);
  BRAID_CHECK_T(TypeError, is_floating(t.dtype()), op, ": ", what, " must be floating-point, got ",
                dtype_name(t.dtype()));
}

// Floor division, for output-size formulas whose numerator may be negative.
inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// One spatial axis of a window op: the input and output sizes and the window's arguments.
struct Axis {
  int64_t in, out, k, stride, pad, dilation;
};

inline Window2d make_window(const Axis& y, const Axis& x) {
  return {y.in, x.in, y.out, x.out, y.k, x.k, y.stride, x.stride, y.pad, x.pad, y.dilation, x.dilation};
}

inline Tensor new_like(const Tensor& t, const Shape& shape, DType dtype) {
  return new_tensor(shape, dtype, t.device());
}

}  // namespace braid::detail
