// Reductions over any set of axes (with keepdim), the statistics composed from them, and the
// numerically stable softmax family. Gradients of reductions broadcast back over reduced axes.
#include <cmath>

#include "braid/amp.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

// Integer and bool sums and products accumulate in int64, as in PyTorch.
DType accumulate_type(DType t) { return is_floating(t) ? t : kInt64; }

void check_nonempty(const Tensor& x, const std::vector<int64_t>& axes, const char* op) {
  for (int64_t a : axes)
    BRAID_CHECK(x.shape()[a] > 0, op, ": cannot reduce over axis ", a, " of size 0 (shape ", shape_str(x.shape()),
                ") because the result has no identity");
}

// The max over axes (kept) that the softmax family subtracts before exp, and 0 when x is empty (a
// zero-length axis has no max, and the result is empty or -inf anyway). finite_only: an infinite
// max shifts by 0 (logsumexp's rule; softmax lets inf - inf give NaN, as PyTorch does).
Tensor stable_shift(const Tensor& x, const std::vector<int64_t>& axes, bool finite_only) {
  if (x.numel() == 0) return zeros({}, x.dtype(), x.device());
  NoGradGuard no_grad;
  Tensor m = amax(x.detach(), axes, true);
  return finite_only ? where(isnan(m - m), zeros({}, m.dtype(), m.device()), m) : m;
}

}  // namespace

Tensor sum(const Tensor& x_in, const std::vector<int64_t>& axes_in, bool keepdim) {
  const Tensor x = autocast_float32(x_in);  // on autocast's float32 list (Note [Autocast])
  check_compute(x, "sum");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "sum");
  DType t = accumulate_type(x.dtype());
  Tensor out = reduce_raw(ReduceOp::Sum, cast_raw(x, t), axes, t);
  Shape k = out.shape();
  out = as_strided(out, reduced_shape(x.shape(), axes, keepdim), contiguous_strides(reduced_shape(x.shape(), axes, keepdim)), 0);
  traced("sum", out, {x}, {axes, {keepdim ? 1.0 : 0.0}});
  if (!is_floating(t) || !needs_grad(x)) return out;
  Shape in_shape = x.shape();
  return record("sum", out, {x}, [k, in_shape](const Tensor& g, Grads& r) { r.set(0, g.reshape(k).expand(in_shape)); });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes_in, bool keepdim) {
  if (x.defined() && is_half(x.dtype())) return via_float32(x, [&](const Tensor& w) { return mean(w, axes_in, keepdim); });
  Tensor xf = float_input(x, "mean");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "mean");
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[a];
  return sum(xf, axes, keepdim) / static_cast<double>(n);
}

Tensor prod(const Tensor& x_in, const std::vector<int64_t>& axes_in, bool keepdim) {
  const Tensor x = autocast_float32(x_in);  // on autocast's float32 list (Note [Autocast])
  check_compute(x, "prod");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "prod");
  DType t = accumulate_type(x.dtype());
  Tensor kept = reduce_raw(ReduceOp::Prod, cast_raw(x, t), axes, t);
  Shape rs = reduced_shape(x.shape(), axes, keepdim);
  Tensor out = as_strided(kept, rs, contiguous_strides(rs), 0);
  traced("prod", out, {x}, {axes, {keepdim ? 1.0 : 0.0}});
  if (!is_floating(t) || !needs_grad(x)) return out;
  return record("prod", out, {x}, [x = x.detach(), kept, axes](const Tensor& g, Grads& r) {
    // d prod / d x_i = product of the others. Where a group holds one zero, that element's gradient
    // is the product of the non-zero rest; with two or more zeros every gradient is zero.
    Tensor zero = scalar_like(x, 0), one = scalar_like(x, 1);
    Tensor is_zero = eq(x, zero);
    Tensor zeros_in_group = sum(cast(is_zero, kInt64), axes, true);
    Tensor prod_nonzero = prod(where(is_zero, one, x), axes, true);
    Tensor ones_zero = eq(zeros_in_group, scalar_like(zeros_in_group, 1));
    Tensor others = where(eq(zeros_in_group, scalar_like(zeros_in_group, 0)), kept / x,
                          where(logical_and(ones_zero, is_zero), prod_nonzero, zero));
    r.set(0, g.reshape(kept.shape()) * others);
  });
}

namespace {
Tensor extremum(const char* name, ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes_in, bool keepdim) {
  check_compute(x, name);
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), name);
  check_nonempty(x, axes, name);
  Tensor kept = reduce_raw(op, x, axes, x.dtype());
  Shape rs = reduced_shape(x.shape(), axes, keepdim);
  Tensor out = as_strided(kept, rs, contiguous_strides(rs), 0);
  traced(name, out, {x}, {axes, {keepdim ? 1.0 : 0.0}});
  if (!is_floating(x.dtype()) || !needs_grad(x)) return out;
  return record(name, out, {x}, [x = x.detach(), kept, axes](const Tensor& g, Grads& r) {
    // Ties share the gradient evenly (torch.amax's rule).
    Tensor mask = cast(eq(x, kept), x.dtype());
    r.set(0, g.reshape(kept.shape()) * mask / sum(mask, axes, true));
  });
}

Tensor arg_extremum(const char* name, ReduceOp op, const Tensor& x, int64_t axis, bool keepdim) {
  check_compute(x, name);
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), name);
  Tensor xs = x.dim() == 0 ? x.reshape({1}) : x;
  check_nonempty(xs, {a}, name);
  Tensor kept = reduce_raw(op, xs, {a}, kInt64);
  Shape rs = x.dim() == 0 ? Shape{} : reduced_shape(x.shape(), {a}, keepdim);
  return traced(name, as_strided(kept, rs, contiguous_strides(rs), 0), {x}, {{a}, {keepdim ? 1.0 : 0.0}});
}
}  // namespace

Tensor amax(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extremum("amax", ReduceOp::Max, x, axes, keepdim);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extremum("amin", ReduceOp::Min, x, axes, keepdim);
}
std::pair<Tensor, Tensor> aminmax(const Tensor& x) {
  if (x.defined() && x.dtype() == kFloat32 && x.numel() > 0 && !needs_grad(x) && active_trace() == nullptr) {
    Tensor lo = new_tensor({}, kFloat32, x.device()), hi = new_tensor({}, kFloat32, x.device());
    if (backend_of(x).fused().aminmax(contiguous_raw(x), lo, hi)) return {lo, hi};
  }
  return {amin(x), amax(x)};
}

namespace {
/// arg_extremum over x flattened when no axis is given.
Tensor arg_extremum_any(const char* name, ReduceOp op, const Tensor& x, std::optional<int64_t> axis, bool keepdim) {
  if (axis) return arg_extremum(name, op, x, *axis, keepdim);
  BRAID_CHECK(x.defined(), name, ": the input is undefined");
  Tensor i = arg_extremum(name, op, x.reshape({-1}), 0, false);
  return keepdim ? i.reshape(Shape(static_cast<size_t>(x.dim()), 1)) : i;
}

/// The number of nonzero elements over axes (int64), for any and all.
Tensor count_nonzero(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, const char* name) {
  BRAID_CHECK(x.defined(), name, ": the input is undefined");
  return sum(cast(cast(x, kBool), kInt64), axes, keepdim);
}
}  // namespace

Tensor argmax(const Tensor& x, std::optional<int64_t> axis, bool keepdim) {
  return arg_extremum_any("argmax", ReduceOp::ArgMax, x, axis, keepdim);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> axis, bool keepdim) {
  return arg_extremum_any("argmin", ReduceOp::ArgMin, x, axis, keepdim);
}

Tensor any(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  Tensor n = count_nonzero(x, axes, keepdim, "any");
  return gt(n, scalar_like(n, 0.0));
}
Tensor all(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  BRAID_CHECK(x.defined(), "all: the input is undefined");
  Tensor zeros_found = count_nonzero(logical_not(cast(x, kBool)), axes, keepdim, "all");
  return eq(zeros_found, scalar_like(zeros_found, 0.0));
}

Tensor var(const Tensor& x_in, const std::vector<int64_t>& axes_in, int64_t correction, bool keepdim) {
  if (x_in.defined() && is_half(x_in.dtype()))
    return via_float32(x_in, [&](const Tensor& w) { return var(w, axes_in, correction, keepdim); });
  Tensor x = float_input(x_in, "var");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "var");
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[a];
  BRAID_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  Tensor centred = x - mean(x, axes, true);
  // With n <= correction the estimate is undefined. The divisor is clamped at 0, as PyTorch's, so
  // the result is NaN (0/0) or inf; n - correction itself would give -0.0 for a zero sum.
  return sum(centred * centred, axes, keepdim) / static_cast<double>(std::max<int64_t>(n - correction, 0));
}

Tensor std(const Tensor& x, const std::vector<int64_t>& axes, int64_t correction, bool keepdim) {
  return sqrt(var(x, axes, correction, keepdim));
}

Tensor logsumexp(const Tensor& x_in, const std::vector<int64_t>& axes_in, bool keepdim) {
  if (x_in.defined() && is_half(x_in.dtype()))  // on autocast's float32 list; else rounded once (Note [Autocast])
    return autocast_enabled() ? logsumexp(cast(x_in, kFloat32), axes_in, keepdim)
                              : via_float32(x_in, [&](const Tensor& w) { return logsumexp(w, axes_in, keepdim); });
  Tensor x = float_input(x_in, "logsumexp");
  std::vector<int64_t> axes = normalize_axes(axes_in, x.dim(), "logsumexp");
  // Shifting by the (constant) max keeps exp in range and does not change the gradient. A sum of
  // nothing is 0, so logsumexp over a zero-length axis is -inf, as in PyTorch.
  Tensor m = stable_shift(x, axes, true);
  Tensor out = log(sum(exp(x - m), axes, true)) + m;
  return keepdim ? out : out.reshape(reduced_shape(x.shape(), axes, false));
}

Tensor softmax(const Tensor& x_in, int64_t axis) {
  if (x_in.defined() && is_half(x_in.dtype()))  // on autocast's float32 list; else rounded once (Note [Autocast])
    return autocast_enabled() ? softmax(cast(x_in, kFloat32), axis)
                              : via_float32(x_in, [&](const Tensor& w) { return softmax(w, axis); });
  Tensor x = float_input(x_in, "softmax");
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), "softmax");
  Tensor y;
  {
    NoGradGuard no_grad;
    if (a == x.dim() - 1 && x.numel() > 0) {  // rows along the last axis: one pass through the backend's kernel
      Tensor out = new_tensor(x.shape(), x.dtype(), x.device());
      if (backend_of(x).fused().softmax_rows(contiguous(x), out)) y = out;
    }
    if (!y.defined()) {
      Tensor e = exp(x - stable_shift(x, {a}, false));
      y = e / sum(e, {a}, true);
    }
  }
  traced("softmax", y, {x}, {{a}, {}});
  if (!needs_grad(x)) return y;
  return record("softmax", y, {x}, [y = y.detach(), a](const Tensor& g, Grads& r) {
    r.set(0, y * (g - sum(g * y, {a}, true)));
  });
}

Tensor log_softmax(const Tensor& x_in, int64_t axis) {
  if (x_in.defined() && is_half(x_in.dtype()))  // on autocast's float32 list; else rounded once (Note [Autocast])
    return autocast_enabled() ? log_softmax(cast(x_in, kFloat32), axis)
                              : via_float32(x_in, [&](const Tensor& w) { return log_softmax(w, axis); });
  Tensor x = float_input(x_in, "log_softmax");
  int64_t a = normalize_axis_or_scalar(axis, x.dim(), "log_softmax");
  Tensor y;
  const bool rows = a == x.dim() - 1 && x.numel() > 0;  // along the last axis: the backend's fused rows
  {
    NoGradGuard no_grad;
    if (rows) {  // Note [Fused kernels]
      Tensor out = new_tensor(x.shape(), x.dtype(), x.device());
      if (backend_of(x).fused().log_softmax_rows(contiguous(x), out)) y = out;
    }
    if (!y.defined()) {
      Tensor shifted = x - stable_shift(x, {a}, false);
      y = shifted - log(sum(exp(shifted), {a}, true));
    }
  }
  traced("log_softmax", y, {x}, {{a}, {}});
  if (!needs_grad(x)) return y;
  return record("log_softmax", y, {x}, [y = y.detach(), a, rows](const Tensor& g, Grads& r) {
    if (rows) {
      Tensor gx = new_tensor(y.shape(), y.dtype(), y.device());
      if (backend_of(y).fused().log_softmax_backward_rows(contiguous(g), contiguous(y), gx)) return r.set(0, gx);
    }
    r.set(0, g - exp(y) * sum(g, {a}, true));
  });
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_compute(x, "sum_to");
  // The result has sum's dtype whether or not an axis is reduced.
  if (x.shape() == shape) return cast(x, accumulate_type(x.dtype()));
  BRAID_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to: shape ", shape_str(shape),
              " does not broadcast to ", shape_str(x.shape()));
  const size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < x.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  return sum(x, axes, true).reshape(shape);
}

}  // namespace braid
