// Unary elementwise kernels: one small functor per op, mapped over the strided indexer, with the
// CPU backend's formulas (src/backend/cpu/elementwise.cpp) and its dtype rules: floats take every op,
// integers the sign, rounding and clamp families (wrapping), every compute dtype logical_not and
// isnan. float16 and bfloat16 take the float ops too (Note [Half arithmetic] in
// src/backend/backend.h): each element is loaded as float32, goes through the float32 functor (the
// parameters as float32) and is rounded once on the store, so the kernels move 2-byte elements.
// float32 uses CUDA's libdevice functions where the CPU uses its own polynomials (fast_math.h), so
// the two agree to a few ulp, not bit for bit (after the rounding to a half type, exactly or by one
// half ulp).
// The CudaBackend methods, which unpack the tensors for them (host.h), follow the kernels.
#include <cmath>
#include <iterator>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host.h"

namespace braid::detail::cuda {
namespace {

const char* unary_name(UnaryOp op) {
  static const char* const kNames[] = {
      "neg",        "abs",   "exp",         "log",   "log1p",       "expm1",    "sqrt",       "rsqrt", "square",
      "reciprocal", "sin",   "cos",         "tanh",  "sigmoid",     "relu",     "erf",        "sign",  "floor",
      "ceil",       "round", "logical_not", "isnan", "pow",         "clamp",    "leaky_relu", "elu",   "softplus",
      "gelu_tanh",  "asin",  "acos",        "atan",  "hardsigmoid", "hardswish"};
  const auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

// The float and double libdevice function of each name.
#define BRAID_MATH(name)                                           \
  __device__ inline float m_##name(float x) { return name##f(x); } \
  __device__ inline double m_##name(double x) { return name(x); }
BRAID_MATH(exp)
BRAID_MATH(log)
BRAID_MATH(log1p)
BRAID_MATH(expm1)
BRAID_MATH(sqrt)
BRAID_MATH(sin)
BRAID_MATH(cos)
BRAID_MATH(tanh)
BRAID_MATH(erf)
BRAID_MATH(asin)
BRAID_MATH(acos)
BRAID_MATH(atan)
BRAID_MATH(floor)
BRAID_MATH(ceil)
BRAID_MATH(rint)  // half to even, as the CPU's nearbyint
BRAID_MATH(fabs)
#undef BRAID_MATH
__device__ inline float m_pow(float x, float y) { return powf(x, y); }
__device__ inline double m_pow(double x, double y) { return pow(x, y); }

template <typename T>
__device__ T sigmoid(T x) {
  const T e = m_exp(-m_fabs(x));  // never overflows
  return (x >= 0 ? T(1) : e) / (T(1) + e);
}

template <typename T>
__device__ T clamp01(T v) {
  return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
}

// Each op is op(x, p0, p1); most ignore the parameters.
#define BRAID_UNARY_OP(Name, ...)                                                         \
  struct Name {                                                                           \
    template <typename T>                                                                 \
    __device__ auto operator()(T x, [[maybe_unused]] T p0, [[maybe_unused]] T p1) const { \
      return __VA_ARGS__;                                                                 \
    }                                                                                     \
  };
BRAID_UNARY_OP(Neg, -x)
BRAID_UNARY_OP(Abs, m_fabs(x))
BRAID_UNARY_OP(Exp, m_exp(x))
BRAID_UNARY_OP(Log, m_log(x))
BRAID_UNARY_OP(Log1p, m_log1p(x))
BRAID_UNARY_OP(Expm1, m_expm1(x))
BRAID_UNARY_OP(Sqrt, m_sqrt(x))
BRAID_UNARY_OP(Rsqrt, T(1) / m_sqrt(x))
BRAID_UNARY_OP(Square, x* x)
BRAID_UNARY_OP(Reciprocal, T(1) / x)
BRAID_UNARY_OP(Sin, m_sin(x))
BRAID_UNARY_OP(Cos, m_cos(x))
BRAID_UNARY_OP(Tanh, m_tanh(x))
BRAID_UNARY_OP(Sigmoid, sigmoid(x))
BRAID_UNARY_OP(Relu, x < 0 ? T(0) : x)  // NaN stays
BRAID_UNARY_OP(Erf, m_erf(x))
BRAID_UNARY_OP(Asin, m_asin(x))
BRAID_UNARY_OP(Acos, m_acos(x))
BRAID_UNARY_OP(Atan, m_atan(x))
BRAID_UNARY_OP(FloatSign, x != x ? x : T((x > 0) - (x < 0)))  // NaN stays NaN, as in NumPy
BRAID_UNARY_OP(Floor, m_floor(x))
BRAID_UNARY_OP(Ceil, m_ceil(x))
BRAID_UNARY_OP(Round, m_rint(x))
BRAID_UNARY_OP(Pow, m_pow(x, p0))
// x ** ±0.5 through sqrt, equal to pow at -0.0 and -inf too (Note [Pow's special cases] in
// src/backend/cpu/elementwise.cpp).
BRAID_UNARY_OP(PowHalf, x == T(-INFINITY) ? T(INFINITY) : m_sqrt(x + T(0)))
BRAID_UNARY_OP(PowMinusHalf, x == T(-INFINITY) ? T(0) : T(1) / m_sqrt(x + T(0)))
BRAID_UNARY_OP(Identity, x)
BRAID_UNARY_OP(Clamp, x < p0 ? p0 : (x > p1 ? p1 : x))  // NaN stays; an infinite bound never binds
BRAID_UNARY_OP(LeakyRelu, x > 0 ? x : p0 * x)
BRAID_UNARY_OP(Elu, x > 0 ? x : p0 * m_expm1(x))
BRAID_UNARY_OP(Softplus, (x < 0 ? T(0) : x) + m_log1p(m_exp(-m_fabs(x))))  // no overflow for large |x|
// 0.5 x (1 + tanh(u)) = x sigmoid(2u), which does not cancel for x << 0.
BRAID_UNARY_OP(GeluTanh, x* sigmoid(T(2 * 0.7978845608028654) * (x + T(0.044715) * x * x * x)))
BRAID_UNARY_OP(Gelu, x*(T(0.5) * (T(1) + m_erf(x / T(1.4142135623730951)))))
BRAID_UNARY_OP(GeluHalfLast, x*(T(1) + m_erf(x / T(1.4142135623730951))) * T(0.5))
BRAID_UNARY_OP(HardSigmoid, clamp01(p0* x + p1))
BRAID_UNARY_OP(HardSwish, x* clamp01(x* T(1.0 / 6.0) + T(0.5)))
// Integers wrap as two's complement (unsigned arithmetic), as the CPU's wrap_sub / wrap_mul.
BRAID_UNARY_OP(IntNeg, T(static_cast<std::make_unsigned_t<T>>(0) - static_cast<std::make_unsigned_t<T>>(x)))
BRAID_UNARY_OP(IntAbs, x < 0 ? T(static_cast<std::make_unsigned_t<T>>(0) - static_cast<std::make_unsigned_t<T>>(x)) : x)
BRAID_UNARY_OP(IntSquare, T(static_cast<std::make_unsigned_t<T>>(x) * static_cast<std::make_unsigned_t<T>>(x)))
BRAID_UNARY_OP(IntSign, T((x > 0) - (x < 0)))
BRAID_UNARY_OP(LogicalNot, x == T(0))
BRAID_UNARY_OP(IsNan, x != x)  // false for integers and bool
#undef BRAID_UNARY_OP

// Elements of T computed as V = Compute<T> (float for the half types), stored as O.
template <typename O, typename T, typename Op>
struct UnaryFn {
  using V = Compute<T>;
  O* out;
  const T* x;
  V p0, p1;
  __device__ void operator()(const int64_t* off) const { out[off[0]] = cast<O>(Op{}(cast<V>(x[off[1]]), p0, p1)); }
};

// The operands of one launch; run<Op>() maps Op over them.
template <typename T>
struct Launch {
  using V = Compute<T>;
  const Indexer<2>& ix;
  int64_t n;
  void* out;
  const void* x;
  V p0, p1;
  cudaStream_t stream;
  const char* name;

  template <typename Op, typename O = T>
  void run() const {
    launch_elementwise(ix, n, UnaryFn<O, T, Op>{static_cast<O*>(out), static_cast<const T*>(x), p0, p1}, stream, name);
  }
};

// T float, double, or a half type (computed in float).
template <typename T>
void float_unary(UnaryOp op, const Launch<T>& l, double p0) {
  switch (op) {
    case UnaryOp::Neg:
      return l.template run<Neg>();
    case UnaryOp::Abs:
      return l.template run<Abs>();
    case UnaryOp::Exp:
      return l.template run<Exp>();
    case UnaryOp::Log:
      return l.template run<Log>();
    case UnaryOp::Log1p:
      return l.template run<Log1p>();
    case UnaryOp::Expm1:
      return l.template run<Expm1>();
    case UnaryOp::Sqrt:
      return l.template run<Sqrt>();
    case UnaryOp::Rsqrt:
      return l.template run<Rsqrt>();
    case UnaryOp::Square:
      return l.template run<Square>();
    case UnaryOp::Reciprocal:
      return l.template run<Reciprocal>();
    case UnaryOp::Sin:
      return l.template run<Sin>();
    case UnaryOp::Cos:
      return l.template run<Cos>();
    case UnaryOp::Tanh:
      return l.template run<Tanh>();
    case UnaryOp::Sigmoid:
      return l.template run<Sigmoid>();
    case UnaryOp::Relu:
      return l.template run<Relu>();
    case UnaryOp::Erf:
      return l.template run<Erf>();
    case UnaryOp::Asin:
      return l.template run<Asin>();
    case UnaryOp::Acos:
      return l.template run<Acos>();
    case UnaryOp::Atan:
      return l.template run<Atan>();
    case UnaryOp::Sign:
      return l.template run<FloatSign>();
    case UnaryOp::Floor:
      return l.template run<Floor>();
    case UnaryOp::Ceil:
      return l.template run<Ceil>();
    case UnaryOp::Round:
      return l.template run<Round>();
    case UnaryOp::PowScalar:
      // As the CPU (Note [Pow's special cases]): the exponents with a cheaper form than pow take
      // it, each equal to pow at every input.
      if (p0 == 2) return l.template run<Square>();
      if (p0 == 0.5) return l.template run<PowHalf>();
      if (p0 == -0.5) return l.template run<PowMinusHalf>();
      if (p0 == 1) return l.template run<Identity>();
      if (p0 == -1) return l.template run<Reciprocal>();
      return l.template run<Pow>();
    case UnaryOp::Clamp:
      return l.template run<Clamp>();
    case UnaryOp::LeakyRelu:
      return l.template run<LeakyRelu>();
    case UnaryOp::Elu:
      return l.template run<Elu>();
    case UnaryOp::Softplus:
      return l.template run<Softplus>();
    case UnaryOp::GeluTanh:
      return l.template run<GeluTanh>();
    case UnaryOp::Gelu:
      return l.template run<Gelu>();
    case UnaryOp::GeluHalfLast:
      return l.template run<GeluHalfLast>();
    case UnaryOp::HardSigmoid:
      return l.template run<HardSigmoid>();
    case UnaryOp::HardSwish:
      return l.template run<HardSwish>();
    case UnaryOp::LogicalNot:
    case UnaryOp::IsNan:
      break;  // bool output, handled by the caller
  }
  BRAID_ASSERT(false, "unhandled unary op ", unary_name(op));
}

// A bound converted as the CPU's convert<T>(double): saturating, NaN to 0 (an infinite bound
// saturates to the type's range).
template <typename T>
T saturate(double v) {
  constexpr double kLimit = std::is_same_v<T, int32_t> ? 2147483648.0 : 9223372036854775808.0;
  if (!(v == v)) return 0;
  if (v >= kLimit) return std::is_same_v<T, int32_t> ? T(INT32_MAX) : T(INT64_MAX);
  if (v <= -kLimit) return std::is_same_v<T, int32_t> ? T(INT32_MIN) : T(INT64_MIN);
  return static_cast<T>(v);
}

template <typename T>
void int_unary(UnaryOp op, Launch<T> l, double p0, double p1, DType type) {
  switch (op) {
    case UnaryOp::Neg:
      return l.template run<IntNeg>();
    case UnaryOp::Abs:
      return l.template run<IntAbs>();
    case UnaryOp::Square:
      return l.template run<IntSquare>();
    case UnaryOp::Sign:
      return l.template run<IntSign>();
    case UnaryOp::Relu:
      return l.template run<Relu>();
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Round:
      return l.template run<Identity>();  // integers are whole already
    case UnaryOp::Clamp:
      l.p0 = saturate<T>(p0);
      l.p1 = saturate<T>(p1);
      return l.template run<Clamp>();
    default:
      unsupported_dtype(unary_name(op), type);
  }
}

void launch_unary(UnaryOp op, DType type, const Indexer<2>& ix, int64_t n, void* out, const void* x, double p0,
                  double p1, cudaStream_t stream) {
  const char* name = unary_name(op);
  dispatch_arith(type, name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using V = Compute<T>;
    // Integer ops take no parameter but clamp's bounds, which int_unary converts itself.
    const V q0 = kIsFloat<V> ? static_cast<V>(p0) : V(0), q1 = kIsFloat<V> ? static_cast<V>(p1) : V(0);
    Launch<T> l{ix, n, out, x, q0, q1, stream, name};
    if (op == UnaryOp::LogicalNot) return l.template run<LogicalNot, bool>();
    if (op == UnaryOp::IsNan) return l.template run<IsNan, bool>();
    if constexpr (kIsFloat<V>)
      float_unary<T>(op, l, p0);
    else if constexpr (kIsInt<T>)
      int_unary<T>(op, l, p0, p1, type);
    else
      unsupported_dtype(name, type);
  });
}

}  // namespace
}  // namespace braid::detail::cuda

namespace braid::detail {

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) {
  const bool bool_out = op == UnaryOp::LogicalNot || op == UnaryOp::IsNan;
  BRAID_ASSERT(out.dtype() == (bool_out ? kBool : x.dtype()) && out.shape() == x.shape(), "unary: got ",
               dtype_name(x.dtype()), " ", shape_str(x.shape()), " -> ", dtype_name(out.dtype()), " ",
               shape_str(out.shape()));
  cuda::Launch l("unary", out, {x});
  cuda::launch_unary(op, x.dtype(), cuda::indexer<2>(out.shape(), {&out, &x}), out.numel(), cuda::ptr(out),
                     cuda::ptr(x), p0, p1, l.stream);
}

}  // namespace braid::detail
