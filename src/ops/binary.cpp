// Elementwise binary arithmetic with NumPy broadcasting, where, and the C++ operators. The engine
// sums each gradient back over broadcast axes, so formulas return gradients of the output's shape.
#include <cmath>
#include <string_view>

#include "braid/amp.h"
#include "ops/common.h"

namespace braid {

using namespace detail;

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    BRAID_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                " cannot be broadcast together (axis ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// The dtype an arithmetic op computes in (the table in dtype.h): true division of integers computes
// in float32; two bools stay bool where the op is logic (add is or, mul and maximum are and/or).
DType arith_type(const Tensor& a, const Tensor& b, const char* op, bool true_div = false) {
  check_compute(a, op);
  check_compute(b, op);
  DType t = promote_types(a.dtype(), b.dtype());
  if (true_div && !is_floating(t)) t = kFloat32;
  BRAID_CHECK_T(TypeError, t != kBool || std::string_view(op) != "pow", op,
                ": not defined for two bool tensors; cast one to int64 first");
  return t;
}

// Which of a, b and the output a node keeps for its formula (the others reach it undefined): add
// and sub keep nothing, so a product's output followed by a bias add is not kept twice.
struct Keeps {
  bool a, b, out;
};

template <typename F>
Tensor arith(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, Keeps keeps, F formula,
             bool true_div = false) {
  DType t = arith_type(a, b, name, true_div);
  Tensor out = binary_raw(op, a, b, t, t, name);
  traced(name, out, {a, b});
  if (!is_floating(t) || !needs_grad({a, b})) return out;
  const auto kept = [](bool keep, const Tensor& x) { return keep ? x.detach() : Tensor(); };
  return record(name, out, {a, b},
                [a = kept(keeps.a, a), b = kept(keeps.b, b), o = kept(keeps.out, out), formula](const Tensor& g,
                                                                                                 Grads& r) {
                  formula(g, a, b, o, r);
                });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha != 1.0) return add(a, mul(b, scalar_operand(b, alpha)));
  return arith("add", BinaryOp::Add, a, b, Keeps{false, false, false}, [](const Tensor& g, const Tensor&, const Tensor&, const Tensor&, Grads& r) {
    r.set(0, g);
    r.set(1, g);
  });
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  check_compute(a, "sub");
  check_compute(b, "sub");
  BRAID_CHECK_T(TypeError, a.dtype() != kBool && b.dtype() != kBool, "sub: not defined for bool tensors (",
                dtype_name(a.dtype()), " - ", dtype_name(b.dtype()), "); to invert a mask use logical_not, to compare "
                "two masks logical_xor");
  if (alpha != 1.0) return sub(a, mul(b, scalar_operand(b, alpha)));
  return arith("sub", BinaryOp::Sub, a, b, Keeps{false, false, false}, [](const Tensor& g, const Tensor&, const Tensor&, const Tensor&, Grads& r) {
    r.set(0, g);
    if (r.needs(1)) r.set(1, -g);
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return arith("mul", BinaryOp::Mul, a, b, Keeps{true, true, false}, [](const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&, Grads& r) {
    if (r.needs(0)) r.set(0, g * b);
    if (r.needs(1)) r.set(1, g * a);
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return arith(
      "div", BinaryOp::Div, a, b, Keeps{false, true, true},
      [](const Tensor& g, const Tensor&, const Tensor& b, const Tensor& o, Grads& r) {
        if (r.needs(0)) r.set(0, g / b);
        if (r.needs(1)) r.set(1, -g * o / b);
      },
      true);
}

Tensor pow(const Tensor& a, const Tensor& b) {
  if (autocast_enabled() && ((a.defined() && is_half(a.dtype())) || (b.defined() && is_half(b.dtype()))))
    return pow(autocast_float32(a), autocast_float32(b));  // on autocast's float32 list (Note [Autocast])
  return arith("pow", BinaryOp::Pow, a, b, Keeps{true, true, true}, [](const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& o, Grads& r) {
    Tensor zero = scalar_like(o, 0);
    if (r.needs(0)) r.set(0, where(eq(b, zero), scalar_like(o, 0), g * b * pow(a, b - 1.0)));
    // d/db a^b = a^b log a; at a == 0 the limit is 0 for b > 0 (PyTorch's convention).
    if (r.needs(1)) r.set(1, where(logical_and(eq(a, zero), ge(b, zero)), zero, g * o * log(a)));
  });
}

namespace {
// Ties send half of the gradient to each side, as PyTorch's maximum/minimum do.
void extremum_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool max, Grads& r) {
  Tensor win_a = cast(max ? gt(a, b) : lt(a, b), g.dtype());
  Tensor tie = cast(eq(a, b), g.dtype()) * 0.5;
  if (r.needs(0)) r.set(0, g * (win_a + tie));
  if (r.needs(1)) r.set(1, g * (1.0 - win_a - tie));
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return arith("maximum", BinaryOp::Max, a, b, Keeps{true, true, false}, [](const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&, Grads& r) {
    extremum_grad(g, a, b, true, r);
  });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  return arith("minimum", BinaryOp::Min, a, b, Keeps{true, true, false}, [](const Tensor& g, const Tensor& a, const Tensor& b, const Tensor&, Grads& r) {
    extremum_grad(g, a, b, false, r);
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_compute(cond, "where");
  BRAID_CHECK_T(TypeError, cond.dtype() == kBool, "where: condition must be bool, got ", dtype_name(cond.dtype()));
  DType t = arith_type(a, b, "where");
  check_same_device(cond, a, "where");
  Shape s = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = new_tensor(s, t, a.device());
  const bool as_they_are = t == kFloat32 && mixed_half_operands(a.dtype(), b.dtype());  // Note [Half arithmetic]
  const auto operand = [&](const Tensor& x) { return broadcast_view(as_they_are ? x : cast_raw(x, t), s); };
  backend_of(a).where(broadcast_view(cond, s), operand(a), operand(b), out);
  traced("where", out, {cond, a, b});
  if (!is_floating(t) || !needs_grad({a, b})) return out;
  return record("where", out, {a, b}, [c = cond.detach()](const Tensor& g, Grads& r) {
    Tensor zero = scalar_like(g, 0);
    if (r.needs(0)) r.set(0, where(c, g, zero));
    if (r.needs(1)) r.set(1, where(c, zero, g));
  });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return add(a, scalar_operand(a, s)); }
Tensor operator-(const Tensor& a, double s) { return sub(a, scalar_operand(a, s)); }
Tensor operator*(const Tensor& a, double s) { return mul(a, scalar_operand(a, s)); }
Tensor operator/(const Tensor& a, double s) { return div(a, scalar_operand(a, s)); }
Tensor operator+(double s, const Tensor& a) { return add(scalar_operand(a, s), a); }
Tensor operator-(double s, const Tensor& a) { return sub(scalar_operand(a, s), a); }
Tensor operator*(double s, const Tensor& a) { return mul(scalar_operand(a, s), a); }
Tensor operator/(double s, const Tensor& a) { return div(scalar_operand(a, s), a); }

}  // namespace braid
