// ONNX elementwise, activation and reduction ops as braid ops.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

using UnaryFn = Tensor (*)(const Tensor&);

void unary(OpRegistry& r, const char* type, UnaryFn f) {
  r.add(op(type, {}, [f](OpContext& c) { return Tensors{f(c.input(0))}; }));
}

/// The second operand of a binary op. Before opset 7, `broadcast` = 1 let B match a contiguous run
/// of A's axes starting at `axis` (default: A's trailing axes); B is reshaped so NumPy broadcasting
/// does the rest.
Tensor legacy_b(const OpContext& c) {
  const Tensor &a = c.input(0), &b = c.input(1);
  if (c.opset() >= 7 || c.attr_int("broadcast", 0) == 0 || b.dim() == 0 || b.dim() > a.dim()) return b;
  const int64_t axis = c.has_attr("axis") ? norm_axis(c, c.attr_int("axis", 0), a.dim()) : a.dim() - b.dim();
  if (axis + b.dim() > a.dim()) c.fail("B of shape ", shape_str(b.shape()), " does not fit A of shape ", shape_str(a.shape()), " at axis ", axis);
  Shape s(static_cast<size_t>(a.dim() - axis), 1);
  for (int64_t i = 0; i < b.dim(); ++i) s[static_cast<size_t>(i)] = b.size(i);
  return reshape(b, s);
}

template <typename F>
void binary(OpRegistry& r, const char* type, F f) {
  r.add(op(type, {"broadcast", "axis"}, [f](OpContext& c) { return Tensors{f(c.input(0), legacy_b(c))}; }));
}

// Max and Min: any number of inputs, broadcast together.
template <typename F>
void variadic(OpRegistry& r, const char* type, F f) {
  r.add(op(type, {}, [f](OpContext& c) {
    Tensor acc = c.input(0);
    for (size_t i = 1; i < c.num_inputs(); ++i) acc = f(acc, c.input(i));
    return Tensors{acc};
  }));
}

Tensor softsign(const Tensor& x) { return x / (abs(x) + 1.0); }

/// Softmax-style ops: opset < 13 flattens to 2-d at axis (default 1); 13+ works along axis (default -1).
template <typename F>
Tensor along_axis(OpContext& c, F f) {
  const Tensor& x = c.input(0);
  if (c.opset() >= 13) return f(x, norm_axis(c, c.attr_int("axis", -1), x.dim()));
  const int64_t axis = norm_axis(c, c.attr_int("axis", 1), std::max<int64_t>(x.dim(), 1));
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.size(d);
  Tensor y = f(reshape(x, {outer, x.numel() / std::max<int64_t>(outer, 1)}), 1);
  return reshape(y, x.shape());
}

Tensor hardmax(const Tensor& x, int64_t axis) {
  Tensor idx = argmax(x, axis, true);
  Tensor pos = arange(x.size(axis), kInt64, x.device());
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[static_cast<size_t>(axis)] = x.size(axis);
  return cast(eq(reshape(pos, s), idx), x.dtype());
}

// Reductions. keepdims defaults to 1; empty axes reduce everything unless noop_with_empty_axes.
template <typename F>
void reduction(OpRegistry& r, const char* type, F f, int64_t axes_input_since) {
  r.add(op(type, {"axes", "keepdims", "noop_with_empty_axes"}, [f, axes_input_since](OpContext& c) {
    const Tensor& x = c.input(0);
    std::vector<int64_t> axes = reduce_axes(c, c.opset() >= axes_input_since);
    const bool keep = c.attr_int("keepdims", 1) != 0;
    if (axes.empty() && c.attr_int("noop_with_empty_axes", 0) != 0) return Tensors{x};
    for (int64_t& a : axes) a = norm_axis(c, a, x.dim());
    if (axes.empty())
      for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
    if (x.dim() == 0) return Tensors{f(x, std::vector<int64_t>{}, keep)};
    return Tensors{f(x, axes, keep)};
  }));
}

Tensor sum_f(const Tensor& x, const std::vector<int64_t>& a, bool k) { return sum(x, a, k); }

// ONNX (opset 18 on) defines the max of an empty set as the type's lowest value (-inf for floats,
// false for bool) and the min as its highest; braid's amax and amin, like PyTorch's, refuse it.
Tensor extreme(const Tensor& x, const std::vector<int64_t>& axes, bool keep, bool is_max) {
  bool empty = false;
  for (int64_t a : axes) empty = empty || x.size(a) == 0;
  if (!empty) return is_max ? amax(x, axes, keep) : amin(x, axes, keep);
  Shape shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced) shape.push_back(x.size(d));
    else if (keep) shape.push_back(1);
  }
  const DType t = x.dtype();
  if (t == kInt64) {
    const int64_t v = is_max ? std::numeric_limits<int64_t>::lowest() : std::numeric_limits<int64_t>::max();
    return tensor(std::vector<int64_t>(static_cast<size_t>(shape_numel(shape)), v), shape, x.device());
  }
  double v;
  if (t == kBool) v = is_max ? 0.0 : 1.0;
  else if (is_floating(t)) v = (is_max ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
  else if (t == kInt32) v = is_max ? std::numeric_limits<int32_t>::lowest() : std::numeric_limits<int32_t>::max();
  else v = is_max ? 0.0 : 255.0;  // uint8
  return full(shape, v, t, x.device());
}

}  // namespace

std::vector<int64_t> reduce_axes(const OpContext& c, bool from_input) {
  if (from_input) return c.has_input(1) ? c.input_ints(1) : std::vector<int64_t>{};
  return c.attr_ints("axes");
}

void register_math_ops(OpRegistry& r) {
  unary(r, "Abs", abs);
  unary(r, "Neg", neg);
  unary(r, "Exp", exp);
  unary(r, "Log", log);
  unary(r, "Sqrt", sqrt);
  unary(r, "Reciprocal", reciprocal);
  unary(r, "Sin", sin);
  unary(r, "Cos", cos);
  unary(r, "Tanh", tanh);
  unary(r, "Sigmoid", sigmoid);
  unary(r, "Relu", relu);
  unary(r, "Erf", erf);
  unary(r, "Asin", asin);
  unary(r, "Acos", acos);
  unary(r, "Atan", atan);
  unary(r, "Floor", floor);
  unary(r, "Ceil", ceil);
  unary(r, "Round", round);
  unary(r, "Sign", sign);
  unary(r, "Not", logical_not);
  unary(r, "IsNaN", isnan);
  unary(r, "Softplus", softplus);
  unary(r, "Softsign", softsign);
  r.add(op("Tan", {}, [](OpContext& c) { return Tensors{sin(c.input(0)) / cos(c.input(0))}; }));
  r.add(op("Sinh", {}, [](OpContext& c) { return Tensors{(exp(c.input(0)) - exp(-c.input(0))) * 0.5}; }));
  r.add(op("Cosh", {}, [](OpContext& c) { return Tensors{(exp(c.input(0)) + exp(-c.input(0))) * 0.5}; }));
  r.add(op("Asinh", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    return Tensors{log(x + sqrt(square(x) + 1.0))};
  }));
  r.add(op("Acosh", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    return Tensors{log(x + sqrt(square(x) - 1.0))};
  }));
  r.add(op("Atanh", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    return Tensors{log((1.0 + x) / (1.0 - x)) * 0.5};
  }));
  r.add(op("IsInf", {"detect_negative", "detect_positive"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const double inf = std::numeric_limits<double>::infinity();
    Tensor pos = eq(x, scalar_like(x, inf));
    Tensor neg_inf = eq(x, scalar_like(x, -inf));
    const bool p = c.attr_int("detect_positive", 1) != 0, n = c.attr_int("detect_negative", 1) != 0;
    if (p && n) return Tensors{logical_or(pos, neg_inf)};
    if (p) return Tensors{pos};
    if (n) return Tensors{neg_inf};
    return Tensors{zeros(x.shape(), kBool, x.device())};
  }));

  // ---- activations with parameters ----
  r.add(op("LeakyRelu", {"alpha"}, [](OpContext& c) { return Tensors{leaky_relu(c.input(0), c.attr_float("alpha", 0.01))}; }));
  r.add(op("Elu", {"alpha"}, [](OpContext& c) { return Tensors{elu(c.input(0), c.attr_float("alpha", 1.0))}; }));
  r.add(op("Celu", {"alpha"}, [](OpContext& c) {
    const double a = c.attr_float("alpha", 1.0);
    const Tensor& x = c.input(0);
    return Tensors{relu(x) + minimum(zeros_like(x), (exp(x / a) - 1.0) * a)};
  }));
  r.add(op("Selu", {"alpha", "gamma"}, [](OpContext& c) {
    const double a = c.attr_float("alpha", 1.67326319217681884765625), g = c.attr_float("gamma", 1.05070102214813232421875);
    return Tensors{elu(c.input(0), a) * g};
  }));
  r.add(op("HardSigmoid", {"alpha", "beta"}, [](OpContext& c) {
    return Tensors{hardsigmoid(c.input(0), c.attr_float("alpha", 0.2), c.attr_float("beta", 0.5))};
  }));
  r.add(op("HardSwish", {}, [](OpContext& c) { return Tensors{hardswish(c.input(0))}; }));
  r.add(op("PRelu", {}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    Tensor slope = c.input(1);
    // Opset < 7 allowed a per-channel slope of shape (C) against (N, C, ...): make it broadcast.
    if (slope.dim() == 1 && x.dim() > 2 && slope.size(0) == x.size(1) && slope.size(0) != x.size(-1)) {
      Shape s(static_cast<size_t>(x.dim() - 1), 1);
      s[0] = slope.size(0);
      slope = reshape(slope, s);
    }
    return Tensors{where(lt(x, scalar_like(x, 0)), x * slope, x)};
  }));
  r.add(op("ThresholdedRelu", {"alpha"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    return Tensors{where(gt(x, scalar_like(x, c.attr_float("alpha", 1.0))), x, scalar_like(x, 0))};
  }));
  r.add(op("Mish", {}, [](OpContext& c) { return Tensors{c.input(0) * tanh(softplus(c.input(0)))}; }));
  r.add(op("Gelu", {"approximate"}, [](OpContext& c) { return Tensors{gelu(c.input(0), c.attr_string("approximate", "none"))}; }));
  r.add(op("Shrink", {"bias", "lambd"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    const double b = c.attr_float("bias", 0.0), l = c.attr_float("lambd", 0.5);
    Tensor zero = scalar_like(x, 0);
    return Tensors{where(lt(x, scalar_like(x, -l)), x + b, where(gt(x, scalar_like(x, l)), x - b, zero))};
  }));
  r.add(op("Softmax", {"axis"}, [](OpContext& c) { return Tensors{along_axis(c, [](const Tensor& x, int64_t a) { return softmax(x, a); })}; }));
  r.add(op("LogSoftmax", {"axis"}, [](OpContext& c) { return Tensors{along_axis(c, [](const Tensor& x, int64_t a) { return log_softmax(x, a); })}; }));
  r.add(op("Hardmax", {"axis"}, [](OpContext& c) { return Tensors{along_axis(c, hardmax)}; }));
  r.add(op("Clip", {"min", "max"}, [](OpContext& c) {
    const Tensor& x = c.input(0);
    std::optional<double> lo, hi;
    if (c.opset() < 11) {
      if (c.has_attr("min")) lo = c.attr_float("min", 0);
      if (c.has_attr("max")) hi = c.attr_float("max", 0);
    } else {
      if (c.has_input(1)) lo = c.input_scalar(1);
      if (c.has_input(2)) hi = c.input_scalar(2);
    }
    if (!is_floating(x.dtype())) {
      Tensor y = x;
      if (lo) y = maximum(y, scalar_like(x, *lo));
      if (hi) y = minimum(y, scalar_like(x, *hi));
      return Tensors{y};
    }
    if (!lo && !hi) return Tensors{x};
    // ONNX sets every element to max when min > max, which braid's clamp refuses: bound in turn.
    if (lo && hi && *lo > *hi) return Tensors{clamp(clamp(x, lo, std::nullopt), std::nullopt, hi)};
    return Tensors{clamp(x, lo, hi)};
  }));

  // ---- binary (NumPy broadcasting) ----
  binary(r, "Add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  binary(r, "Sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); });
  binary(r, "Mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); });
  r.add(op("Div", {"broadcast", "axis"}, [](OpContext& c) {
    const Tensor& a = c.input(0);
    const Tensor b = legacy_b(c);
    if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
      // Integer division truncates toward zero (C semantics, as onnxruntime).
      Tensor q = div(cast(a, kFloat64), cast(b, kFloat64));
      Tensor t = where(lt(q, zeros({}, kFloat64, q.device())), ceil(q), floor(q));
      return Tensors{cast(t, promote_types(a.dtype(), b.dtype()))};
    }
    return Tensors{div(a, b)};
  }));
  r.add(op("Pow", {"broadcast", "axis"}, [](OpContext& c) {
    const Tensor& a = c.input(0);
    const Tensor b = legacy_b(c);
    if (!is_floating(a.dtype())) return Tensors{cast(round(pow(cast(a, kFloat64), cast(b, kFloat64))), a.dtype())};
    return Tensors{pow(a, cast(b, a.dtype()))};
  }));
  r.add(op("Mod", {"fmod"}, [](OpContext& c) {
    const Tensor &a = c.input(0), &b = c.input(1);
    const DType t = promote_types(a.dtype(), b.dtype());
    Tensor x = cast(a, kFloat64), y = cast(b, kFloat64);
    Tensor q = div(x, y);
    const bool c_fmod = c.attr_int("fmod", 0) != 0;
    if (c_fmod) q = where(lt(q, zeros({}, kFloat64, q.device())), ceil(q), floor(q));  // C fmod: sign of x
    else q = floor(q);                                                         // Python: sign of y
    Tensor m = x - q * y;
    if (!c_fmod && is_floating(t)) {
      // Opset 28's special cases of the floor remainder of floats (Python's math, as numpy's mod):
      // an infinite divisor returns a finite nonzero x of its sign, else the divisor; x = +-0 gives
      // a zero with the divisor's sign; the rest (x infinite, y zero, NaNs) is NaN, as computed.
      const Tensor zero = zeros({}, kFloat64, x.device());
      const Tensor inf = full({}, std::numeric_limits<double>::infinity(), kFloat64, x.device());
      const Tensor x_finite_nonzero = logical_and(lt(abs(x), inf), ne(x, zero));
      const Tensor same_sign = eq(lt(x, zero), lt(y, zero));
      m = where(logical_and(eq(abs(y), inf), x_finite_nonzero), where(same_sign, x, y), m);
      const Tensor y_nonzero = logical_and(ne(y, zero), logical_not(isnan(y)));
      m = where(logical_and(eq(x, zero), y_nonzero), where(lt(y, zero), neg(zero), zero), m);
    }
    return Tensors{cast(m, t)};
  }));
  binary(r, "Equal", [](const Tensor& a, const Tensor& b) { return eq(a, b); });
  binary(r, "Less", [](const Tensor& a, const Tensor& b) { return lt(a, b); });
  binary(r, "LessOrEqual", [](const Tensor& a, const Tensor& b) { return le(a, b); });
  binary(r, "Greater", [](const Tensor& a, const Tensor& b) { return gt(a, b); });
  binary(r, "GreaterOrEqual", [](const Tensor& a, const Tensor& b) { return ge(a, b); });
  binary(r, "And", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); });
  binary(r, "Or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); });
  binary(r, "Xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); });
  variadic(r, "Max", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  variadic(r, "Min", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  r.add(op("Sum", {}, [](OpContext& c) {
    Tensor acc = c.input(0);
    for (size_t i = 1; i < c.num_inputs(); ++i) acc = add(acc, c.input(i));
    return Tensors{acc};
  }));
  r.add(op("Mean", {}, [](OpContext& c) {
    Tensor acc = c.input(0);
    for (size_t i = 1; i < c.num_inputs(); ++i) acc = add(acc, c.input(i));
    return Tensors{acc / static_cast<double>(c.num_inputs())};
  }));

  // ---- reductions ----
  reduction(r, "ReduceSum", sum_f, 13);
  reduction(r, "ReduceMean", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return mean(x, a, k); }, 18);
  reduction(r, "ReduceMax", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return extreme(x, a, k, true); }, 18);
  reduction(r, "ReduceMin", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return extreme(x, a, k, false); }, 18);
  reduction(r, "ReduceProd", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return prod(x, a, k); }, 18);
  reduction(r, "ReduceL1", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return sum(abs(x), a, k); }, 18);
  reduction(r, "ReduceL2", [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    if (!is_floating(x.dtype())) return cast(sqrt(sum(square(cast(x, kFloat64)), a, k)), x.dtype());
    return sqrt(sum(square(x), a, k));
  }, 18);
  reduction(r, "ReduceSumSquare", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return sum(square(x), a, k); }, 18);
  reduction(r, "ReduceLogSum", [](const Tensor& x, const std::vector<int64_t>& a, bool k) { return log(sum(x, a, k)); }, 18);
  reduction(r, "ReduceLogSumExp", [](const Tensor& x, const std::vector<int64_t>& a, bool k) {
    if (!is_floating(x.dtype())) return cast(logsumexp(cast(x, kFloat64), a, k), x.dtype());
    return logsumexp(x, a, k);
  }, 18);
  for (const char* name : {"ArgMax", "ArgMin"}) {
    const bool is_max = std::string(name) == "ArgMax";
    OpSchema s = op(name, {"axis", "keepdims", "select_last_index"}, [is_max](OpContext& c) {
      const Tensor& x = c.input(0);
      const int64_t axis = norm_axis(c, c.attr_int("axis", 0), x.dim());
      const bool keep = c.attr_int("keepdims", 1) != 0;
      if (c.attr_int("select_last_index", 0) == 0) return Tensors{is_max ? argmax(x, axis, keep) : argmin(x, axis, keep)};
      // The last extreme index: search the reversed axis, then map back.
      const int64_t n = x.size(axis);
      Tensor rev = index_select(x, axis, arange(static_cast<double>(n - 1), -1.0, -1.0, kInt64, x.device()));
      Tensor i = is_max ? argmax(rev, axis, keep) : argmin(rev, axis, keep);
      return Tensors{sub(full(i.shape(), static_cast<double>(n - 1), kInt64, i.device()), i)};
    });
    r.add(std::move(s));
  }
}

}  // namespace braid::onnx::ops
