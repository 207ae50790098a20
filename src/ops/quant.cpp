// Quantised arithmetic on int8/uint8 (braid's storage types for quantised values; ONNX's quantised
// ops in onnx/ops_quant.cpp are built from these): exact integer products and per-tensor
// quantisation, each through a backend primitive where one exists (Note [Fused kernels]).
#include <cmath>

#include "ops/common.h"

namespace braid {

using namespace detail;

Tensor int_matmul(const Tensor& a, const Tensor& b, int64_t a_zero, int64_t b_zero) {
  auto check = [](const Tensor& t, int64_t zero, const char* what) {
    BRAID_CHECK(t.defined(), "int_matmul: ", what, " is undefined");
    BRAID_CHECK_T(TypeError, t.dtype() == kInt8 || t.dtype() == kUInt8, "int_matmul: ", what,
                  " must be int8 or uint8, got ", dtype_name(t.dtype()));
    BRAID_CHECK(scalar_fits(static_cast<double>(zero), t.dtype()), "int_matmul: zero point ", zero, " of ", what,
                " is outside ", dtype_name(t.dtype()), "'s range");
    BRAID_CHECK(t.dim() >= 1, "int_matmul: ", what, " needs at least 1 dimension");
  };
  check(a, a_zero, "a");
  check(b, b_zero, "b");
  check_same_device(a, b, "int_matmul");
  if (a.dim() == 1) return int_matmul(a.unsqueeze(0), b, a_zero, b_zero).squeeze(-2);
  if (b.dim() == 1) return int_matmul(a, b.unsqueeze(1), a_zero, b_zero).squeeze(-1);
  const int64_t k = a.size(-1);
  BRAID_CHECK(k == b.size(-2), "int_matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
              " do not match (", k, " != ", b.size(-2), ")");
  if (b.dim() == 2) {  // (..., M, K) @ (K, N): one GEMM of all rows (Note [Fused kernels])
    const int64_t m = a.numel() / std::max<int64_t>(k, 1), n = b.size(1);
    Shape so(a.shape().begin(), a.shape().end() - 1);
    so.push_back(n);
    Tensor out = new_tensor({m, n}, kInt32, a.device());
    if (backend_of(a).fused().matmul_int8(contiguous(a).reshape({m, k}), a_zero, contiguous(b), b_zero, out))
      return out.reshape(so);
  }
  // Each sum of K products of values below 2^8 in magnitude is exact in float64 for K < 2^37.
  Tensor x = cast(a, kFloat64) - static_cast<double>(a_zero), y = cast(b, kFloat64) - static_cast<double>(b_zero);
  return cast(matmul(x, y), kInt32);
}

Tensor quantize(const Tensor& x, double scale, int64_t zero_point, DType dtype) {
  check_compute(x, "quantize");
  BRAID_CHECK_T(TypeError, is_floating(x.dtype()), "quantize: x must be floating-point, got ", dtype_name(x.dtype()));
  BRAID_CHECK_T(TypeError, dtype == kInt8 || dtype == kUInt8, "quantize: dtype must be int8 or uint8, got ",
                dtype_name(dtype));
  BRAID_CHECK(std::isfinite(scale) && scale > 0, "quantize: scale must be positive and finite, got ", scale);
  BRAID_CHECK(scalar_fits(static_cast<double>(zero_point), dtype), "quantize: zero point ", zero_point, " is outside ",
              dtype_name(dtype), "'s range");
  NoGradGuard no_grad;
  const double lo = dtype == kInt8 ? -128.0 : 0.0, hi = dtype == kInt8 ? 127.0 : 255.0;
  if (x.dtype() == kFloat32) {
    const SameLayout l = same_layout(x.detach(), dtype);
    if (backend_of(x).fused().quantize(l.in, scale, zero_point, l.out)) return l.result;
  }
  // x / scale in x's dtype, rounded half to even; NaN becomes 0 in the cast.
  return cast(clamp(round(x / scale) + static_cast<double>(zero_point), lo, hi), dtype);
}

DynamicQuantized dynamic_quantize(const Tensor& x) {
  BRAID_CHECK(x.defined(), "dynamic_quantize: got an undefined tensor");
  BRAID_CHECK_T(TypeError, x.dtype() == kFloat32, "dynamic_quantize: x must be float32, got ", dtype_name(x.dtype()));
  NoGradGuard no_grad;
  DynamicQuantized q;
  if (x.numel() > 0) {
    const SameLayout l = same_layout(x.detach(), kUInt8);
    if (backend_of(x).fused().dynamic_quantize(l.in, l.out, q.scale, q.zero_point)) {
      q.values = l.result;
      return q;
    }
  }
  float mn = 0, mx = 0;  // an empty x: the range of 0 alone
  if (x.numel() > 0) {
    const auto [lo, hi] = aminmax(x);
    mn = static_cast<float>(lo.item());
    mx = static_cast<float>(hi.item());
  }
  dynamic_quantize_params(mn, mx, q.scale, q.zero_point);
  q.values = quantize(x, q.scale, q.zero_point, kUInt8);
  return q;
}

Tensor dequantize(const Tensor& x, double scale, int64_t zero_point) {
  BRAID_CHECK(x.defined(), "dequantize: got an undefined tensor");
  BRAID_CHECK_T(TypeError, x.dtype() == kInt8 || x.dtype() == kUInt8 || x.dtype() == kInt32,
                "dequantize: x must be int8, uint8 or int32, got ", dtype_name(x.dtype()));
  BRAID_CHECK(scalar_fits(static_cast<double>(zero_point), x.dtype()), "dequantize: zero point ", zero_point,
              " is outside ", dtype_name(x.dtype()), "'s range");
  NoGradGuard no_grad;
  if (x.dtype() != kInt32) {
    const SameLayout l = same_layout(x, kFloat32);
    if (backend_of(x).fused().dequantize(l.in, scale, zero_point, l.out)) return l.result;
  }
  // In float32: x - zero_point is exact for 8-bit values, then one rounding by the multiplication.
  return (cast(x, kFloat32) - static_cast<double>(zero_point)) * scale;
}

Tensor fake_quantize(const Tensor& x, double scale, int64_t zero_point, DType dtype) {
  if (x.defined() && x.dtype() == kFloat32 && x.numel() > 0 && std::isfinite(scale) && scale > 0 &&
      (dtype == kInt8 || dtype == kUInt8) && scalar_fits(static_cast<double>(zero_point), dtype)) {
    NoGradGuard no_grad;
    const SameLayout l = same_layout(x.detach(), kFloat32);
    if (backend_of(x).fused().fake_quantize(l.in, scale, zero_point, dtype, l.out)) return l.result;
  }
  return dequantize(quantize(x, scale, zero_point, dtype), scale, zero_point);  // checks and composes
}

}  // namespace braid
