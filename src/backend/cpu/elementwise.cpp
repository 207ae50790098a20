// Unary elementwise primitives and where. Each op is a small lambda mapped over a StridedLoop; the
// loop's contiguous fast path is a plain indexed loop, so ops built from arithmetic and the
// fast_math.h polynomials (exp, tanh, sigmoid on float32) vectorise, while libm calls do not.
#include <cmath>
#include <iterator>
#include <limits>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_math.h"
#include "backend/cpu/loop.h"

namespace braid::detail {
namespace {

const char* unary_name(UnaryOp op) {
  static const char* const kNames[] = {
      "neg",         "abs",   "exp",  "log",     "log1p",      "expm1", "sqrt",     "rsqrt",    "square", "reciprocal",
      "sin",         "cos",   "tanh", "sigmoid", "relu",       "erf",   "sign",     "floor",    "ceil",   "round",
      "logical_not", "isnan", "pow",  "clamp",   "leaky_relu", "elu",   "softplus", "gelu_tanh",
      "asin",        "acos",  "atan", "hardsigmoid", "hardswish"};
  const auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

// out (n) = f(x (n)), both with the loop's strides; contiguous runs go to `contiguous` when given.
template <typename O, typename T, typename F>
void map_unary(const StridedLoop& loop, F f, void (*contiguous)(O*, const T*, int64_t) = nullptr) {
  loop.run([&f, contiguous](char* const* p, const int64_t* s, int64_t n) {
    O* o = reinterpret_cast<O*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    if (s[0] == 1 && s[1] == 1) {
      if (contiguous)
        contiguous(o, x, n);
      else
        for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    } else if (contiguous) {  // strided: through the vector clone in gathered blocks (Note [Vector clones])
      constexpr int64_t kBlock = 256;
      T in[kBlock];
      O out[kBlock];
      for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
        const int64_t m = std::min(kBlock, n - i0);
        for (int64_t i = 0; i < m; ++i) in[i] = x[(i0 + i) * s[1]];
        contiguous(out, in, m);
        for (int64_t i = 0; i < m; ++i) o[(i0 + i) * s[0]] = out[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]]);
    }
  });
}

template <typename T>
T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_f32(x);
  else
    return std::exp(x);
}

template <typename T>
T tanh_t(T x) {
  if constexpr (std::is_same_v<T, float>)
    return tanh_f32(x);
  else
    return std::tanh(x);
}

template <typename T>
T sigmoid_t(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return sigmoid_f32(x);
  } else {
    const T e = std::exp(-std::fabs(x));  // never overflows; see sigmoid_f32
    return (x >= 0 ? T(1) : e) / (T(1) + e);
  }
}

// 0.5 x (1 + tanh(u)) = x sigmoid(2u), which does not cancel for x << 0.
template <typename T>
T gelu_tanh_t(T x) {
  const T k = T(2 * 0.7978845608028654);  // 2 sqrt(2 / pi)
  return x * sigmoid_t(k * (x + T(0.044715) * x * x * x));
}

// Exact GELU in one pass, with the float operations of the composite x * (0.5 * (1 + erf(x / sqrt 2)))
// in its order, so that the two agree bit for bit.
template <typename T>
T gelu_t(T x) {
  T e;
  if constexpr (std::is_same_v<T, float>)
    e = erf_f32(x / static_cast<float>(1.4142135623730951));
  else
    e = std::erf(x / T(1.4142135623730951));
  return x * (T(0.5) * (T(1) + e));
}
template <typename T>
T gelu_half_last_t(T x) {  // Note [GELU as one op]: the ONNX pattern's order
  T e;
  if constexpr (std::is_same_v<T, float>)
    e = erf_f32(x / static_cast<float>(1.4142135623730951));
  else
    e = std::erf(x / T(1.4142135623730951));
  return x * (T(1) + e) * T(0.5);
}

// BRAID_VECTOR_CLONES: Note [Vector clones] in fast_math.h.

BRAID_VECTOR_CLONES void exp_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = exp_f32(x[i]);
}
BRAID_VECTOR_CLONES void tanh_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = tanh_f32(x[i]);
}
BRAID_VECTOR_CLONES void sigmoid_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = sigmoid_f32(x[i]);
}
BRAID_VECTOR_CLONES void erf_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = erf_f32(x[i]);
}
BRAID_VECTOR_CLONES void gelu_tanh_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_tanh_t(x[i]);
}
BRAID_VECTOR_CLONES void gelu_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_t(x[i]);
}
BRAID_VECTOR_CLONES void gelu_half_last_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_half_last_t(x[i]);
}
template <typename T>
T softplus_t(T x) {  // max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|
  return (x < 0 ? T(0) : x) + std::log1p(exp_t(-std::fabs(x)));
}
BRAID_VECTOR_CLONES void softplus_run(float* o, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = softplus_t(x[i]);
}

// The float32 clone as map_unary's contiguous kernel; none for double, whose kernels call libm.
template <typename T>
auto clone_for(void (*f32)(float*, const float*, int64_t)) {
  void (*none)(T*, const T*, int64_t) = nullptr;
  if constexpr (std::is_same_v<T, float>)
    return f32;
  else
    return none;
}

template <typename T>
void float_unary(UnaryOp op, const StridedLoop& loop, double p0d, double p1d) {
  const T p0 = static_cast<T>(p0d), p1 = static_cast<T>(p1d);
  switch (op) {
    case UnaryOp::Neg:
      return map_unary<T, T>(loop, [](T x) { return -x; });
    case UnaryOp::Abs:
      return map_unary<T, T>(loop, [](T x) { return std::fabs(x); });
    case UnaryOp::Exp:
      return map_unary<T, T>(
          loop, [](T x) { return exp_t(x); }, clone_for<T>(exp_run));
    case UnaryOp::Log:
      return map_unary<T, T>(loop, [](T x) { return std::log(x); });
    case UnaryOp::Log1p:
      return map_unary<T, T>(loop, [](T x) { return std::log1p(x); });
    case UnaryOp::Expm1:
      return map_unary<T, T>(loop, [](T x) { return std::expm1(x); });
    case UnaryOp::Sqrt:
      return map_unary<T, T>(loop, [](T x) { return std::sqrt(x); });
    case UnaryOp::Rsqrt:
      return map_unary<T, T>(loop, [](T x) { return T(1) / std::sqrt(x); });
    case UnaryOp::Square:
      return map_unary<T, T>(loop, [](T x) { return x * x; });
    case UnaryOp::Reciprocal:
      return map_unary<T, T>(loop, [](T x) { return T(1) / x; });
    case UnaryOp::Sin:
      return map_unary<T, T>(loop, [](T x) { return std::sin(x); });
    case UnaryOp::Cos:
      return map_unary<T, T>(loop, [](T x) { return std::cos(x); });
    case UnaryOp::Tanh:
      return map_unary<T, T>(
          loop, [](T x) { return tanh_t(x); }, clone_for<T>(tanh_run));
    case UnaryOp::Sigmoid:
      return map_unary<T, T>(
          loop, [](T x) { return sigmoid_t(x); }, clone_for<T>(sigmoid_run));
    case UnaryOp::Relu:
      return map_unary<T, T>(loop, [](T x) { return x < 0 ? T(0) : x; });  // NaN stays
    case UnaryOp::Erf:
      return map_unary<T, T>(
          loop,
          [](T x) {
            if constexpr (std::is_same_v<T, float>)
              return erf_f32(x);
            else
              return std::erf(x);
          },
          clone_for<T>(erf_run));
    case UnaryOp::Asin:
      return map_unary<T, T>(loop, [](T x) { return std::asin(x); });
    case UnaryOp::Acos:
      return map_unary<T, T>(loop, [](T x) { return std::acos(x); });
    case UnaryOp::Atan:
      return map_unary<T, T>(loop, [](T x) { return std::atan(x); });
    case UnaryOp::Sign:  // NaN stays NaN, as in NumPy
      return map_unary<T, T>(loop, [](T x) { return x != x ? x : T((x > 0) - (x < 0)); });
    case UnaryOp::Floor:
      return map_unary<T, T>(loop, [](T x) { return std::floor(x); });
    case UnaryOp::Ceil:
      return map_unary<T, T>(loop, [](T x) { return std::ceil(x); });
    case UnaryOp::Round:
      return map_unary<T, T>(loop, [](T x) { return std::nearbyint(x); });  // half to even
    case UnaryOp::PowScalar:
      // Note [Pow's special cases]
      // The exponents with a cheaper form than pow take it, and each equals pow (C's, NumPy's) at
      // every input, ±0, ±inf and NaN included: x * x, x, 1 / x are exact; sqrt differs from pow at
      // two points, sqrt(-0.0) = -0.0 where pow(-0.0, 0.5) = +0 and sqrt(-inf) = NaN where
      // pow(-inf, 0.5) = +inf (for -0.5: +inf and +0), so -0.0 is made +0 first and -inf is set
      // apart. PyTorch computes x ** ±0.5 as sqrt and rsqrt and gives -0.0, NaN, -inf, NaN there;
      // braid keeps the definition (tests/diff/check_torch.py lists the difference).
      if (p0d == 2) return map_unary<T, T>(loop, [](T x) { return x * x; });
      if (p0d == 0.5) {
        constexpr T inf = std::numeric_limits<T>::infinity();
        return map_unary<T, T>(loop, [](T x) { return select(x == -inf, inf, std::sqrt(x + T(0))); });
      }
      if (p0d == -0.5) {
        constexpr T inf = std::numeric_limits<T>::infinity();
        return map_unary<T, T>(loop, [](T x) { return select(x == -inf, T(0), T(1) / std::sqrt(x + T(0))); });
      }
      if (p0d == 1) return map_unary<T, T>(loop, [](T x) { return x; });
      if (p0d == -1) return map_unary<T, T>(loop, [](T x) { return T(1) / x; });
      return map_unary<T, T>(loop, [p0](T x) { return std::pow(x, p0); });
    case UnaryOp::Clamp:  // NaN stays; an infinite bound never binds (Note [Branch-free select])
      return map_unary<T, T>(loop, [p0, p1](T x) { return select(x < p0, p0, select(x > p1, p1, x)); });
    case UnaryOp::LeakyRelu:
      return map_unary<T, T>(loop, [p0](T x) { return select(x > 0, x, p0 * x); });
    case UnaryOp::Elu:
      return map_unary<T, T>(loop, [p0](T x) { return x > 0 ? x : p0 * std::expm1(x); });
    case UnaryOp::Softplus:
      return map_unary<T, T>(
          loop, [](T x) { return softplus_t(x); }, clone_for<T>(softplus_run));
    case UnaryOp::GeluTanh:
      return map_unary<T, T>(
          loop, [](T x) { return gelu_tanh_t(x); }, clone_for<T>(gelu_tanh_run));
    case UnaryOp::Gelu:
      return map_unary<T, T>(
          loop, [](T x) { return gelu_t(x); }, clone_for<T>(gelu_run));
    case UnaryOp::GeluHalfLast:
      return map_unary<T, T>(
          loop, [](T x) { return gelu_half_last_t(x); }, clone_for<T>(gelu_half_last_run));
    case UnaryOp::HardSigmoid:
      return map_unary<T, T>(loop, [p0, p1](T x) {
        const T v = p0 * x + p1;
        return select(v < T(0), T(0), select(v > T(1), T(1), v));
      });
    case UnaryOp::HardSwish:
      return map_unary<T, T>(loop, [](T x) {
        // Selects, not branches: data around +-3 (a convolution's output) mispredicted half of
        // them, and the pass ran 4x slower than the depthwise convolution before it.
        const T v = x * T(1.0 / 6.0) + T(0.5);
        return x * select(v < T(0), T(0), select(v > T(1), T(1), v));
      });
    case UnaryOp::LogicalNot:
    case UnaryOp::IsNan:
      break;  // bool output, handled by the caller
  }
  BRAID_ASSERT(false, "unhandled unary op ", unary_name(op));
}

// Integers take the sign, rounding and clamp families; arithmetic wraps as two's complement.
template <typename T>
void int_unary(UnaryOp op, const StridedLoop& loop, double p0d, double p1d, DType dtype) {
  switch (op) {
    case UnaryOp::Neg:
      return map_unary<T, T>(loop, [](T x) { return wrap_sub(T(0), x); });
    case UnaryOp::Abs:
      return map_unary<T, T>(loop, [](T x) { return x < 0 ? wrap_sub(T(0), x) : x; });
    case UnaryOp::Square:
      return map_unary<T, T>(loop, [](T x) { return wrap_mul(x, x); });
    case UnaryOp::Sign:
      return map_unary<T, T>(loop, [](T x) { return T((x > 0) - (x < 0)); });
    case UnaryOp::Relu:
      return map_unary<T, T>(loop, [](T x) { return x < 0 ? T(0) : x; });
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Round:
      return map_unary<T, T>(loop, [](T x) { return x; });  // integers are whole already
    case UnaryOp::Clamp: {
      const T lo = convert<T>(p0d), hi = convert<T>(p1d);  // an infinite bound saturates to the type's range
      return map_unary<T, T>(loop, [lo, hi](T x) { return x < lo ? lo : (x > hi ? hi : x); });
    }
    default:
      unsupported_dtype(unary_name(op), dtype);
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) {
  const char* name = unary_name(op);
  const bool bool_out = op == UnaryOp::LogicalNot || op == UnaryOp::IsNan;
  BRAID_ASSERT(out.dtype() == (bool_out ? kBool : x.dtype()) && out.shape() == x.shape(), name, ": got ",
               dtype_name(x.dtype()), " ", shape_str(x.shape()), " -> ", dtype_name(out.dtype()), " ",
               shape_str(out.shape()));
  if (is_half(x.dtype())) {  // Note [Half arithmetic]: float32 kernels, one rounding
    const Tensor f = bool_out ? out : new_tensor(out.shape(), kFloat32, out.device());
    unary(op, widen_to_float32(x), f, p0, p1);
    if (!bool_out) copy(f, out);
    return;
  }
  StridedLoop loop(out.shape(), {loop_operand(out), loop_operand(x)});
  dispatch_compute(x.dtype(), name, [&]<typename T>() {
    if (op == UnaryOp::LogicalNot) return map_unary<bool, T>(loop, [](T v) { return v == T(0); });
    if (op == UnaryOp::IsNan) {
      if constexpr (std::is_floating_point_v<T>)
        return map_unary<bool, T>(loop, [](T v) { return v != v; });
      else
        return map_unary<bool, T>(loop, [](T) { return false; });
    }
    if constexpr (std::is_floating_point_v<T>)
      float_unary<T>(op, loop, p0, p1);
    else if constexpr (kIsInt<T>)
      int_unary<T>(op, loop, p0, p1, x.dtype());
    else
      unsupported_dtype(name, x.dtype());
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.dtype() == kFloat32 && mixed_half_operands(a.dtype(), b.dtype())) {  // Note [Half arithmetic]
    const auto wide = [](const Tensor& t) { return is_half(t.dtype()) ? widen_to_float32(t) : t; };
    return where(cond, wide(a), wide(b), out);
  }
  BRAID_ASSERT(cond.dtype() == kBool && a.dtype() == out.dtype() && b.dtype() == out.dtype(),
               "where: dtypes do not match");
  StridedLoop loop(out.shape(), {loop_operand(out), loop_operand(cond), loop_operand(a), loop_operand(b)});
  dispatch_all(out.dtype(), "where", [&]<typename T>() {
    loop.run([](char* const* p, const int64_t* s, int64_t n) {
      T* __restrict o = reinterpret_cast<T*>(p[0]);
      const bool* __restrict c = reinterpret_cast<const bool*>(p[1]);
      const T* __restrict x = reinterpret_cast<const T*>(p[2]);
      const T* __restrict y = reinterpret_cast<const T*>(p[3]);
      if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
      } else {
        for (int64_t i = 0; i < n; ++i) o[i * s[0]] = c[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
      }
    });
  });
}

}  // namespace braid::detail
