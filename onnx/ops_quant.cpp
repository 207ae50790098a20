// ONNX's quantised ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
// ConvInteger, QLinearMatMul and QLinearConv, on int8/uint8 values (braid's storage types).
//
// Note [Quantised ops]
// Every op here is exact integer arithmetic followed by one rounding, as ONNX's reference defines
// them: an integer product (a - a_zero) * (b - b_zero) summed over K, then for the QLinear ops
// acc * (a_scale * b_scale / y_scale) + y_zero rounded half to even and saturated to the output
// type. The sums are computed exactly: matrix products by braid::int_matmul (oneDNN's int8 GEMM
// where the backend has it, Note [int8 GEMM through oneDNN]; otherwise in float64, which holds
// every sum of K < 2^37 products of 8-bit values exactly), convolutions in float64. The
// multiplier is computed in float32 from the float32 scales and applied in float64, as the
// reference's NumPy does, so results agree with it (and with onnxruntime) to the rounding of the
// last step. Zero points and scales are per tensor (scalars) or per axis (1-d, along `axis`, or
// along the rows of A / columns of B / output channels of W), and QuantizeLinear/DequantizeLinear
// also take blocked scales (opset 21).
#include <cmath>
#include <optional>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

bool narrow_int(DType t) { return t == kInt8 || t == kUInt8; }
double qmin(DType t) { return t == kInt8 ? -128.0 : 0.0; }
double qmax(DType t) { return t == kInt8 ? 127.0 : 255.0; }

// The executor names the node when it passes the error on.
[[noreturn]] void not_supported(const std::string& what) { throw NotImplementedError(what); }

void check_quantised(const OpContext& c, const Tensor& t, const char* what) {
  if (!narrow_int(t.dtype())) c.fail(what, " must be int8 or uint8, got ", dtype_name(t.dtype()));
}

/// A scale or zero point p laid out to broadcast against x: per tensor (one element), per axis (a
/// 1-d tensor of x.size(axis) elements) or blocked (x's rank, block elements of x per element of
/// p along axis). Storage types come back widened to their compute type.
Tensor along(const OpContext& c, const Tensor& p, const Tensor& x, int64_t axis_attr, int64_t block, const char* what) {
  if (p.numel() == 1 && p.dim() <= 1) return reshape(p, {});
  const int64_t axis = norm_axis(c, axis_attr, std::max<int64_t>(x.dim(), 1));
  if (block > 0 && p.dim() > 0) {
    if (p.dim() != x.dim()) c.fail("blocked ", what, " of shape ", shape_str(p.shape()), " needs x's rank ", x.dim());
    const int64_t n = x.size(axis);
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d == axis ? p.size(d) != (n + block - 1) / block : p.size(d) != x.size(d))
        c.fail(what, " of shape ", shape_str(p.shape()), " does not block x of shape ", shape_str(x.shape()), " by ",
               block, " along axis ", axis);
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i / block;
    return index_select(cast(p, compute_type(p.dtype())), axis, index_vec(idx, p.device()));
  }
  if (p.dim() != 1 || x.dim() == 0 || p.numel() != x.size(axis))
    c.fail(what, " of shape ", shape_str(p.shape()), " is neither one value nor one per element of axis ", axis,
           " of x (shape ", shape_str(x.shape()), ")");
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[static_cast<size_t>(axis)] = p.numel();
  return reshape(p, s);
}

/// The zero point's one value as an integer.
int64_t zero_value(const Tensor& z) { return z.defined() ? static_cast<int64_t>(z.item()) : 0; }

/// round half to even, saturate to t's range, convert: the last step of every quantising op.
Tensor saturate(const Tensor& v, DType t) { return cast(clamp(round(v), qmin(t), qmax(t)), t); }

Tensors quantize_linear(OpContext& c) {
  const Tensor& x = c.input(0);
  const Tensor zero = c.has_input(2) ? c.input(2) : Tensor();
  DType out = kUInt8;
  if (zero.defined())
    out = zero.dtype();
  else if (c.attr_int("output_dtype", 0) != 0)
    out = dtype_from_onnx(c, c.attr_int("output_dtype", 0));
  if (!narrow_int(out))
    not_supported(detail::cat("quantising to ", dtype_name(out), " is not supported (braid quantises to int8 and ",
                              "uint8; it holds int16/uint16 as int32)"));
  const int64_t axis = c.attr_int("axis", 1), block = c.attr_int("block_size", 0);
  const Tensor& scale = c.input(1);
  if (x.dtype() == kFloat32 && scale.numel() == 1 && (!zero.defined() || zero.numel() == 1)) {
    const double s = scale.item();
    if (std::isfinite(s) && s > 0) return {quantize(x, s, zero.defined() ? zero_value(zero) : 0, out)};
  }
  const DType work = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor q = round(div(cast(x, work), cast(along(c, c.input(1), x, axis, block, "y_scale"), work)));
  if (zero.defined()) q = q + cast(along(c, zero, x, axis, block, "y_zero_point"), work);
  return {cast(clamp(q, qmin(out), qmax(out)), out)};
}

Tensors dequantize_linear(OpContext& c) {
  const Tensor& x = c.input(0);
  if (!narrow_int(x.dtype()) && x.dtype() != kInt32)
    not_supported(detail::cat("dequantising ", dtype_name(x.dtype()), " is not supported (int8, uint8, int32)"));
  const Tensor& scale = c.input(1);
  if (!is_floating(scale.dtype())) c.fail("x_scale must be floating-point, got ", dtype_name(scale.dtype()));
  const int64_t axis = c.attr_int("axis", 1), block = c.attr_int("block_size", 0);
  const bool per_tensor = scale.numel() == 1 && (!c.has_input(2) || c.input(2).numel() == 1);
  if (per_tensor && scale.dtype() == kFloat32 && c.attr_int("output_dtype", 0) == 0 &&
      (!c.has_input(2) || c.input(2).dtype() == x.dtype()))
    return {dequantize(x, scale.item(), c.has_input(2) ? zero_value(c.input(2)) : 0)};
  Tensor v = cast(x, kFloat32);
  if (c.has_input(2)) {
    if (c.input(2).dtype() != x.dtype())
      c.fail("x_zero_point is ", dtype_name(c.input(2).dtype()), ", x is ", dtype_name(x.dtype()));
    v = v - cast(along(c, c.input(2), x, axis, block, "x_zero_point"), kFloat32);
  }
  v = v * cast(along(c, scale, x, axis, block, "x_scale"), kFloat32);
  DType out = scale.dtype();
  if (c.attr_int("output_dtype", 0) != 0) out = dtype_from_onnx(c, c.attr_int("output_dtype", 0));
  return {cast(v, out)};
}

Tensors dynamic_quantize_linear(OpContext& c) {
  const Tensor& x = c.input(0);
  if (x.dtype() != kFloat32) c.fail("x must be float32, got ", dtype_name(x.dtype()));
  const DynamicQuantized q = dynamic_quantize(x);  // the reference's float32 arithmetic
  return {q.values, scalar_tensor(q.scale, kFloat32, c.device()),
          scalar_tensor(static_cast<double>(q.zero_point), kUInt8, c.device())};
}

// ---- integer products ----

/// A's zero point as it broadcasts against A (M, K): one value, or one per row ([M] or [..., M, 1]).
Tensor row_zero(const OpContext& c, const Tensor& z, const Tensor& a, const char* what) {
  if (z.numel() == 1) return reshape(z, {});
  if (z.dim() == 1 && a.dim() >= 2 && z.numel() == a.size(-2)) return reshape(z, {z.numel(), 1});
  if (z.dim() == a.dim() && z.size(-1) == 1) return z;
  c.fail(what, " of shape ", shape_str(z.shape()), " is neither one value nor one per row of A (shape ",
         shape_str(a.shape()), ")");
}

/// B's zero point as it broadcasts against B (K, N): one value, or one per column ([N] or [..., 1, N]).
Tensor column_zero(const OpContext& c, const Tensor& z, const Tensor& b, const char* what) {
  if (z.numel() == 1) return reshape(z, {});
  if (z.dim() == 1 && z.numel() == b.size(-1)) return z;
  if (z.dim() == b.dim() && z.size(-2) == 1) return z;
  c.fail(what, " of shape ", shape_str(z.shape()), " is neither one value nor one per column of B (shape ",
         shape_str(b.shape()), ")");
}

}  // namespace

/// The exact int32 sums of (a - a_zero)(b - b_zero) (Note [Quantised ops]). One zero point per
/// tensor goes to int_matmul as it is; per-row/per-column ones are the corrections of the plain
/// product: a b - a_zero colsum(b) - rowsum(a) b_zero + K a_zero b_zero.
Tensor integer_matmul(const OpContext& c, const Tensor& a, const Tensor& a_zero, const Tensor& b,
                      const Tensor& b_zero) {
  check_quantised(c, a, "A");
  check_quantised(c, b, "B");
  for (const Tensor* z : {&a_zero, &b_zero})
    if (z->defined() && z->dtype() != (z == &a_zero ? a : b).dtype())
      c.fail(z == &a_zero ? "a" : "b", "_zero_point is ", dtype_name(z->dtype()), ", its operand ",
             dtype_name((z == &a_zero ? a : b).dtype()));
  const bool per_tensor = (!a_zero.defined() || a_zero.numel() == 1) && (!b_zero.defined() || b_zero.numel() == 1);
  if (per_tensor) return int_matmul(a, b, zero_value(a_zero), zero_value(b_zero));
  if (a.dim() < 2 || b.dim() < 2) c.fail("per-row or per-column zero points need 2-d or batched operands");
  Tensor za = a_zero.defined() ? cast(row_zero(c, a_zero, a, "a_zero_point"), kInt64) : Tensor();
  Tensor zb = b_zero.defined() ? cast(column_zero(c, b_zero, b, "b_zero_point"), kInt64) : Tensor();
  Tensor out = cast(int_matmul(a, b), kInt64);
  if (zb.defined()) out = out - sum(cast(a, kInt32), {-1}, true) * zb;
  if (za.defined()) out = out - za * sum(cast(b, kInt32), {-2}, true);
  if (za.defined() && zb.defined()) out = out + za * zb * a.size(-1);
  return cast(out, kInt32);
}

namespace {

/// Output channel m's value of a per-channel weight parameter, shaped to broadcast over the
/// convolution's output (N, M, *spatial).
Tensor per_channel(const OpContext& c, const Tensor& p, int64_t channels, int64_t rank, const char* what) {
  if (p.numel() == 1) return reshape(p, {});
  if (p.dim() != 1 || p.numel() != channels)
    c.fail(what, " of shape ", shape_str(p.shape()), " is neither one value nor one per output channel (", channels,
           ")");
  Shape s(static_cast<size_t>(rank), 1);
  s[1] = channels;
  return reshape(p, s);
}

/// The exact integer convolution of (x - x_zero) with (w - w_zero), in float64.
Tensor integer_conv(const OpContext& c, const Tensor& x, const Tensor& x_zero, const Tensor& w, const Tensor& w_zero,
                    const Tensor& bias) {
  check_quantised(c, x, "x");
  check_quantised(c, w, "w");
  Tensor xf = cast(x, kFloat64), wf = cast(w, kFloat64);
  if (x_zero.defined()) {
    if (x_zero.numel() != 1) c.fail("x_zero_point must be one value, got shape ", shape_str(x_zero.shape()));
    xf = xf - cast(reshape(x_zero, {}), kFloat64);
  }
  if (w_zero.defined()) {
    const int64_t m = w.size(0);
    if (w_zero.numel() != 1 && (w_zero.dim() != 1 || w_zero.numel() != m))
      c.fail("w_zero_point of shape ", shape_str(w_zero.shape()), " is neither one value nor one per output channel (",
             m, ")");
    Shape s(static_cast<size_t>(w.dim()), 1);
    s[0] = m;
    wf = wf - cast(w_zero.numel() == 1 ? reshape(w_zero, {}) : reshape(w_zero, s), kFloat64);
  }
  Tensor y = conv_of(c, xf, wf, Tensor());
  if (bias.defined()) {
    if (bias.dtype() != kInt32) c.fail("B must be int32, got ", dtype_name(bias.dtype()));
    y = y + cast(per_channel(c, bias, w.size(0), y.dim(), "B"), kFloat64);
  }
  return y;
}

/// acc * (a_scale * b_scale / y_scale) + y_zero, rounded and saturated to y_zero's type.
Tensor requantise(const OpContext& c, const Tensor& acc, const Tensor& ab_scale, const Tensor& y_scale,
                  const Tensor& y_zero) {
  if (y_scale.numel() != 1) c.fail("y_scale must be one value, got shape ", shape_str(y_scale.shape()));
  const DType out = y_zero.defined() ? y_zero.dtype() : kUInt8;
  if (!narrow_int(out)) c.fail("y_zero_point must be int8 or uint8, got ", dtype_name(out));
  Tensor multiplier = cast(div(ab_scale, cast(reshape(y_scale, {}), kFloat32)), kFloat64);
  Tensor v = acc * multiplier;
  if (y_zero.defined()) {
    if (y_zero.numel() != 1) c.fail("y_zero_point must be one value, got shape ", shape_str(y_zero.shape()));
    v = v + cast(reshape(y_zero, {}), kFloat64);
  }
  return saturate(v, out);
}

Tensor input_or_none(const OpContext& c, size_t i) { return c.has_input(i) ? c.input(i) : Tensor(); }

Tensors matmul_integer(OpContext& c) {
  return {integer_matmul(c, c.input(0), input_or_none(c, 2), c.input(1), input_or_none(c, 3))};
}

Tensors qlinear_matmul(OpContext& c) {
  const Tensor &a = c.input(0), &b = c.input(3);
  Tensor acc = cast(integer_matmul(c, a, c.input(2), b, c.input(5)), kFloat64);
  Tensor as = cast(row_zero(c, c.input(1), a, "a_scale"), kFloat32);
  Tensor bs = cast(column_zero(c, c.input(4), b, "b_scale"), kFloat32);
  return {requantise(c, acc, as * bs, cast(c.input(6), kFloat32), c.input(7))};
}

Tensors conv_integer(OpContext& c) {
  return {cast(integer_conv(c, c.input(0), input_or_none(c, 2), c.input(1), input_or_none(c, 3), Tensor()), kInt32)};
}

Tensors qlinear_conv(OpContext& c) {
  const Tensor &x = c.input(0), &w = c.input(3);
  Tensor acc = integer_conv(c, x, c.input(2), w, c.input(5), input_or_none(c, 8));
  if (c.input(1).numel() != 1) c.fail("x_scale must be one value, got shape ", shape_str(c.input(1).shape()));
  Tensor ws = per_channel(c, cast(c.input(4), kFloat32), w.size(0), acc.dim(), "w_scale");
  return {requantise(c, acc, cast(reshape(c.input(1), {}), kFloat32) * ws, cast(c.input(6), kFloat32), c.input(7))};
}

OpSchema quant(const char* type, std::vector<std::string> attrs, std::function<Tensors(OpContext&)> fn, int64_t since) {
  OpSchema s = op(type, std::move(attrs), std::move(fn), since);
  s.storage_via_compute = false;  // int8/uint8 are what these ops read and write
  return s;
}

}  // namespace

void register_quant_ops(OpRegistry& r) {
  r.add(quant("QuantizeLinear", {"axis", "block_size", "output_dtype", "saturate", "precision"}, quantize_linear, 10));
  r.add(quant("DequantizeLinear", {"axis", "block_size", "output_dtype"}, dequantize_linear, 10));
  r.add(quant("DynamicQuantizeLinear", {}, dynamic_quantize_linear, 11));
  r.add(quant("MatMulInteger", {}, matmul_integer, 10));
  r.add(quant("QLinearMatMul", {}, qlinear_matmul, 10));
  r.add(quant("ConvInteger", {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}, conv_integer, 10));
  r.add(quant("QLinearConv", {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}, qlinear_conv, 10));
}

}  // namespace braid::onnx::ops
