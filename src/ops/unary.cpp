// Elementwise unary ops and their backward formulas. Floating-point ops promote integer input to
// float32; formulas are written with forward ops so that they run on every backend.
#include <cmath>
#include <limits>

#include "ops/fused.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1 / sqrt(2 pi)
constexpr double kTwoOverSqrtPi = 1.1283791670955126;
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

// What a unary op's node keeps for its formula: its input, its output, both or neither (as
// PyTorch's derivatives do, so that relu after a layer keeps one activation, not two). The formula
// is handed an undefined tensor for what is not kept.
enum class Saves { Input, Output, Both, None };

template <Saves S, typename F>
Tensor record_unary(const char* name, const Tensor& x, const Tensor& y, F formula) {
  const Tensor sx = S == Saves::Input || S == Saves::Both ? x.detach() : Tensor();
  const Tensor sy = S == Saves::Output || S == Saves::Both ? y.detach() : Tensor();
  return record(name, y, {x}, [sx, sy, formula](const Tensor& g, Grads& r) { r.set(0, formula(g, sx, sy)); });
}

// y = op(x) for a floating op, with backward grad = formula(g, x, y) (x, y detached, as S keeps them).
template <Saves S, typename F>
Tensor float_unary(const char* name, UnaryOp op, const Tensor& input, F formula, double p0 = 0, double p1 = 0) {
  Tensor x = float_input(input, name);
  Tensor y = unary_raw(op, x, p0, p1);
  traced(name, y, {x}, {{}, {p0, p1}});
  if (!needs_grad(x)) return y;
  return record_unary<S>(name, x, y, formula);
}

// Ops that keep integer dtypes (neg, abs, relu, ...); the gradient applies to floating input only.
template <Saves S, typename F>
Tensor any_unary(const char* name, UnaryOp op, const Tensor& x, F formula, double p0 = 0, double p1 = 0) {
  check_compute(x, name);
  BRAID_CHECK_T(TypeError, x.dtype() != kBool, name, ": not defined for bool tensors");
  Tensor y = unary_raw(op, x, p0, p1);
  traced(name, y, {x}, {{}, {p0, p1}});
  if (!is_floating(x.dtype()) || !needs_grad(x)) return y;
  return record_unary<S>(name, x, y, formula);
}

Tensor step_mask(const Tensor& x) { return cast(gt(x, scalar_like(x, 0)), x.dtype()); }

}  // namespace

Tensor neg(const Tensor& x) {
  return any_unary<Saves::None>("neg", UnaryOp::Neg, x, [](const Tensor& g, const Tensor&, const Tensor&) { return -g; });
}
Tensor abs(const Tensor& x) {
  return any_unary<Saves::Input>("abs", UnaryOp::Abs, x, [](const Tensor& g, const Tensor& x, const Tensor&) { return g * sign(x); });
}
Tensor exp(const Tensor& x) {
  return float_unary<Saves::Output>("exp", UnaryOp::Exp, autocast_float32(x), [](const Tensor& g, const Tensor&, const Tensor& y) { return g * y; });
}
Tensor log(const Tensor& x) {
  return float_unary<Saves::Input>("log", UnaryOp::Log, autocast_float32(x), [](const Tensor& g, const Tensor& x, const Tensor&) { return g / x; });
}
Tensor log1p(const Tensor& x) {
  return float_unary<Saves::Input>("log1p", UnaryOp::Log1p, autocast_float32(x),
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x + 1.0); });
}
Tensor expm1(const Tensor& x) {
  return float_unary<Saves::Output>("expm1", UnaryOp::Expm1, autocast_float32(x),
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return g * (y + 1.0); });
}
Tensor sqrt(const Tensor& x) {
  return float_unary<Saves::Output>("sqrt", UnaryOp::Sqrt, x,
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return g * 0.5 / y; });
}
Tensor rsqrt(const Tensor& x) {
  return float_unary<Saves::Output>("rsqrt", UnaryOp::Rsqrt, autocast_float32(x),
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return g * -0.5 * y * y * y; });
}
Tensor square(const Tensor& input) {
  check_compute(input, "square");
  Tensor x = input.dtype() == kBool ? cast(input, kInt64) : input;  // as x * x would
  return any_unary<Saves::Input>("square", UnaryOp::Square, x,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * 2.0 * x; });
}
Tensor reciprocal(const Tensor& x) {
  return float_unary<Saves::Output>("reciprocal", UnaryOp::Reciprocal, autocast_float32(x),
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return -g * y * y; });
}
Tensor sin(const Tensor& x) {
  return float_unary<Saves::Input>("sin", UnaryOp::Sin, x, [](const Tensor& g, const Tensor& x, const Tensor&) { return g * cos(x); });
}
Tensor cos(const Tensor& x) {
  return float_unary<Saves::Input>("cos", UnaryOp::Cos, x, [](const Tensor& g, const Tensor& x, const Tensor&) { return -g * sin(x); });
}
Tensor tanh(const Tensor& x) {
  return float_unary<Saves::Output>("tanh", UnaryOp::Tanh, x,
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return g * (1.0 - y * y); });
}
Tensor sigmoid(const Tensor& x) {
  return float_unary<Saves::Output>("sigmoid", UnaryOp::Sigmoid, x,
                     [](const Tensor& g, const Tensor&, const Tensor& y) { return g * y * (1.0 - y); });
}
Tensor relu(const Tensor& x) {
  return any_unary<Saves::Output>("relu", UnaryOp::Relu, x,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * step_mask(y); });  // y > 0 iff x > 0
}
Tensor leaky_relu(const Tensor& x, double slope) {
  return float_unary<Saves::Input>(
      "leaky_relu", UnaryOp::LeakyRelu, x,
      [slope](const Tensor& g, const Tensor& x, const Tensor&) {
        return g * where(gt(x, scalar_like(x, 0)), scalar_like(x, 1), scalar_like(x, slope));
      },
      slope);
}
Tensor elu(const Tensor& x, double alpha) {
  return float_unary<Saves::Both>(
      "elu", UnaryOp::Elu, x,
      [alpha](const Tensor& g, const Tensor& x, const Tensor& y) {
        return g * where(gt(x, scalar_like(x, 0)), scalar_like(x, 1), y + alpha);
      },
      alpha);
}
Tensor silu(const Tensor& x) { return x * sigmoid(x); }
// d hardsigmoid = alpha where 0 < alpha x + beta < 1, else 0.
Tensor hardsigmoid(const Tensor& x, double alpha, double beta) {
  return float_unary<Saves::Input>(
      "hardsigmoid", UnaryOp::HardSigmoid, x,
      [alpha, beta](const Tensor& g, const Tensor& x, const Tensor&) {
        Tensor v = x * alpha + beta;
        Tensor inside = logical_and(gt(v, scalar_like(x, 0)), lt(v, scalar_like(x, 1)));
        return g * where(inside, scalar_like(x, alpha), scalar_like(x, 0));
      },
      alpha, beta);
}
// d hardswish = 0 below -3, 1 above 3, (2 x + 3) / 6 between.
Tensor hardswish(const Tensor& x) {
  return float_unary<Saves::Input>("hardswish", UnaryOp::HardSwish, x, [](const Tensor& g, const Tensor& x, const Tensor&) {
    Tensor mid = x * (1.0 / 3.0) + 0.5;
    return g * where(lt(x, scalar_like(x, -3.0)), scalar_like(x, 0),
                     where(gt(x, scalar_like(x, 3.0)), scalar_like(x, 1), mid));
  });
}
Tensor softplus(const Tensor& x) {
  return float_unary<Saves::Input>("softplus", UnaryOp::Softplus, autocast_float32(x),
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return g * sigmoid(x); });
}
Tensor erf(const Tensor& x) {
  return float_unary<Saves::Input>("erf", UnaryOp::Erf, x, [](const Tensor& g, const Tensor& x, const Tensor&) {
    return g * kTwoOverSqrtPi * exp(-(x * x));
  });
}
// d asin = 1 / sqrt(1 - x^2), d acos = -1 / sqrt(1 - x^2), d atan = 1 / (1 + x^2).
Tensor asin(const Tensor& x) {
  return float_unary<Saves::Input>("asin", UnaryOp::Asin, autocast_float32(x),
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return g * rsqrt(1.0 - x * x); });
}
Tensor acos(const Tensor& x) {
  return float_unary<Saves::Input>("acos", UnaryOp::Acos, autocast_float32(x),
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return -g * rsqrt(1.0 - x * x); });
}
Tensor atan(const Tensor& x) {
  return float_unary<Saves::Input>("atan", UnaryOp::Atan, x,
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x * x + 1.0); });
}

Tensor gelu(const Tensor& input, const std::string& approximate) {
  BRAID_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh', got '",
              approximate, "'");
  if (approximate == "tanh") {
    return float_unary<Saves::Input>("gelu", UnaryOp::GeluTanh, input, [](const Tensor& g, const Tensor& x, const Tensor&) {
      Tensor x2 = x * x;
      Tensor t = tanh(kGeluK * (x + kGeluC * x2 * x));
      return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * kGeluC * x2));
    });
  }
  // Exact GELU, x * Phi(x) with Phi(x) = 0.5 * (1 + erf(x / sqrt 2)): one pass (UnaryOp::Gelu, the
  // same float operations as that composite); its derivative is Phi(x) + x * phi(x).
  // Traced without arguments, which is how the ONNX export tells it from the tanh form.
  Tensor x = float_input(input, "gelu");
  Tensor y = unary_raw(UnaryOp::Gelu, x, 0, 0);
  traced("gelu", y, {x});
  if (!needs_grad(x)) return y;
  return record("gelu", y, {x}, [x = x.detach()](const Tensor& g, Grads& r) {
    r.set(0, g * (0.5 * (1.0 + erf(x / kSqrt2)) + x * kInvSqrt2Pi * exp(-0.5 * x * x)));
  });
}

Tensor pow(const Tensor& x_in, double p) {
  // The exponent is a scalar operand: a whole one keeps integer input integer (x ** 2), as PyTorch's
  // Python int exponent does. On autocast's float32 list (Note [Autocast]).
  const Tensor x = autocast_float32(x_in);
  check_compute(x, "pow");
  if (!is_floating(x.dtype()) && !is_floating(scalar_result_type(x.dtype(), p))) {
    BRAID_CHECK(p >= 0, "pow: integers to negative integer powers are not allowed (", dtype_name(x.dtype()), " ** ", p,
                "); use a float exponent or cast the tensor to float");
    return pow(x, scalar_operand(x, p));
  }
  return float_unary<Saves::Input>(
      "pow", UnaryOp::PowScalar, x,
      [p](const Tensor& g, const Tensor& x, const Tensor&) {
        return p == 0 ? zeros_like(g) : g * p * pow(x, p - 1);
      },
      p);
}

Tensor clamp(const Tensor& input, std::optional<double> lo, std::optional<double> hi) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double a = lo.value_or(-inf), b = hi.value_or(inf);
  BRAID_CHECK(lo || hi, "clamp: at least one of min and max must be given");
  BRAID_CHECK(!(a > b), "clamp: min ", a, " is greater than max ", b);
  check_compute(input, "clamp");
  // The bounds are scalar operands: a fractional bound makes an integer tensor float32.
  DType t = is_floating(input.dtype()) ? input.dtype() : input.dtype() == kBool ? kInt64 : input.dtype();
  for (const std::optional<double>& bound : {lo, hi})
    if (bound) t = promote_types(t, scalar_result_type(input.dtype(), *bound));
  Tensor x = cast(input, t);
  return any_unary<Saves::Input>(
      "clamp", UnaryOp::Clamp, x,
      [a, b](const Tensor& g, const Tensor& x, const Tensor&) {
        return g * cast(logical_and(ge(x, scalar_like(x, a)), le(x, scalar_like(x, b))), x.dtype());
      },
      a, b);
}

namespace {
// Piecewise-constant ops: their gradient is zero wherever it exists (as in PyTorch).
Tensor flat_unary(const char* name, UnaryOp op, const Tensor& x) {
  return any_unary<Saves::None>(name, op, x, [](const Tensor& g, const Tensor&, const Tensor&) { return zeros_like(g); });
}
}  // namespace

Tensor sign(const Tensor& x) {
  check_compute(x, "sign");
  return x.dtype() == kBool ? x.clone() : flat_unary("sign", UnaryOp::Sign, x);
}
Tensor floor(const Tensor& x) { return flat_unary("floor", UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return flat_unary("ceil", UnaryOp::Ceil, x); }
Tensor round(const Tensor& x) { return flat_unary("round", UnaryOp::Round, x); }

Tensor logical_not(const Tensor& x) {
  check_compute(x, "logical_not");
  return traced("logical_not", unary_raw(UnaryOp::LogicalNot, x, 0, 0, kBool, false), {x});
}

Tensor isnan(const Tensor& x) {
  check_compute(x, "isnan");
  if (!is_floating(x.dtype())) return zeros(x.shape(), kBool, x.device());
  return traced("isnan", unary_raw(UnaryOp::IsNan, x, 0, 0, kBool, false), {x});
}

namespace detail {

Tensor gelu_half_last(const Tensor& input) {
  BRAID_CHECK(!needs_grad(input), "gelu_half_last: inference only (ONNX's GELU pattern fused), got an input that "
              "requires grad");
  return unary_raw(UnaryOp::GeluHalfLast, float_input(input, "gelu_half_last"), 0, 0);
}

}  // namespace detail

}  // namespace braid
