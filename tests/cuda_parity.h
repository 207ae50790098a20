// What the CUDA parity suites share (tests/test_cuda_*.cpp): operands made alike on any device in
// several layouts, seeded values with the special ones, and the comparison of a result on cuda:0
// with the CPU backend's under a per-dtype tolerance. Each suite's cases skip, with the reason,
// where no GPU is present; CI runs them against the host emulation (tools/cuda_emu).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "braid/braid.h"
#include "core/internal.h"
#include "error_of.h"

namespace braid {
// Names at namespace scope, not in an anonymous namespace: a suite uses some of them, not all.

using detail::BinaryOp;
using detail::RandomKind;
using detail::ReduceOp;
using detail::UnaryOp;
using detail::Window2d;

const Device kCuda = Device::cuda(0);

#define REQUIRE_CUDA()                                                                                   \
  if (!device_available(kCuda))                                                                          \
  GTEST_SKIP() << "no CUDA device: device_count(DeviceType::CUDA) is " << device_count(DeviceType::CUDA) \
               << " (no GPU or no driver visible to this process)"

detail::Backend& backend(Device d) { return detail::backend_for(d); }
Tensor fresh(const Shape& shape, DType t, Device d) { return detail::new_tensor(shape, t, d); }

const DType kComputeTypes[] = {kFloat32, kFloat64, kInt32, kInt64, kBool};
const DType kAllTypes[] = {kFloat32, kFloat64, kInt32, kInt64, kBool, kFloat16, kBFloat16};
const double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

// ---- operands: host values and a layout over them, made alike on any device ----

struct Layout {
  std::string name;
  Shape shape, strides;
  int64_t offset = 0;
};

// Shape (2, 3, 4) read four ways, plus the 0-d, empty and large cases.
[[maybe_unused]] std::vector<Layout> layouts() {
  return {{"contiguous", {2, 3, 4}, {12, 4, 1}, 0},
          {"permuted", {2, 3, 4}, {1, 2, 6}, 0},   // a (4, 3, 2) tensor's transpose
          {"sliced", {2, 3, 4}, {40, 8, 2}, 5},    // every other element of an offset window
          {"broadcast", {2, 3, 4}, {0, 1, 0}, 0},  // stride 0: one value per row
          {"0-d", {}, {}, 0},
          {"empty", {2, 0, 4}, {0, 4, 1}, 0},
          {"large", {257, 413}, {413, 1}, 0},
          {"large-transposed", {257, 413}, {1, 257}, 0}};
}

int64_t base_numel(const Layout& l) {
  int64_t end = l.offset + 1;
  for (size_t d = 0; d < l.shape.size(); ++d) {
    if (l.shape[d] == 0) return l.offset + 1;
    end += (l.shape[d] - 1) * l.strides[d];
  }
  return end;
}

struct ValueRange {
  double lo = -3, hi = 3;
  bool specials = true;  // NaN, infinities, signed zeros, halves (floats); extremes (integers)
  bool nonzero = false;  // no zeros (divisors)
};

// n values of dtype t, from a seeded generator: uniform in [lo, hi] (whole numbers for integers,
// 0/1 for bool), every 7th a special value when asked.
Tensor draw(int64_t n, DType t, uint32_t seed, const ValueRange& r) {
  static const double kFloatSpecials[] = {kNaN, kInf, -kInf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-40, 1e30};
  static const double kIntSpecials[] = {0, 1, -1, 2147483647, -2147483648.0, 7, -7};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(r.lo, r.hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = u(gen);
    if (!is_floating(t)) x = std::round(x);
    if (r.specials && i % 7 == 3) x = is_floating(t) ? kFloatSpecials[i / 7 % 12] : kIntSpecials[i / 7 % 7];
    if (r.nonzero && x == 0) x = (i % 2) ? 1 : -1;
    v[static_cast<size_t>(i)] = x;
  }
  return tensor(v, {n}, Device::cpu()).to(t);
}

struct Operand {
  Tensor base;  // contiguous, on the CPU
  Layout layout;
  Tensor on(Device d) const {
    return detail::as_strided(d.is_cpu() ? base : base.to(d), layout.shape, layout.strides, layout.offset);
  }
};

[[maybe_unused]] Operand operand(const Layout& l, DType t, uint32_t seed, const ValueRange& r = {}) {
  return {draw(base_numel(l), t, seed, r), l};
}

// ---- comparison ----

struct Tol {
  double rtol = 0, atol = 0;  // 0, 0: equal (NaN matches NaN, zeros' signs must agree)
};

// The tolerance of computed floating results: a few ulp of float32 / float64.
// A few ulp of t: float32 and float64 results of different functions (libdevice against the CPU's),
// and for the half types one half ulp (2^-10 for float16, 2^-7 for bfloat16), with a little absolute
// room near 0.
Tol approx(DType t) {
  return t == kFloat64    ? Tol{1e-13, 1e-14}
         : t == kFloat16  ? Tol{1e-3, 1e-6}
         : t == kBFloat16 ? Tol{8e-3, 1e-6}
                          : Tol{3e-6, 1e-6};
}

std::vector<double> values_of(const Tensor& t) {
  const Tensor c = t.cpu();
  return (c.dtype() == kFloat16 || c.dtype() == kBFloat16 ? c.to(kFloat32) : c).to_vector<double>();  // exact
}

void expect_match(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.device(), kCuda) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  if (want.dtype() == kInt64) {  // exactly, beyond double's 53 bits
    EXPECT_EQ(got.cpu().to_vector<int64_t>(), want.to_vector<int64_t>()) << what;
    return;
  }
  const std::vector<double> g = values_of(got), w = values_of(want);
  int reported = 0;
  for (size_t i = 0; i < w.size() && reported < 5; ++i) {
    const bool ok = (std::isnan(g[i]) && std::isnan(w[i])) ||
                    (tol.rtol == 0 && tol.atol == 0
                         ? g[i] == w[i] && std::signbit(g[i]) == std::signbit(w[i])
                         : g[i] == w[i] || std::fabs(g[i] - w[i]) <= tol.atol + tol.rtol * std::fabs(w[i]));
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on cuda, " << w[i] << " on the cpu";
      ++reported;
    }
  }
}

// Runs make(device) -> result on the CPU and on cuda:0 and compares them; a TypeError on the CPU
// (an unsupported dtype) must be a TypeError on CUDA too.
void expect_parity(const std::string& what, Tol tol, const std::function<Tensor(Device)>& make) {
  Tensor want;
  try {
    want = make(Device::cpu());
  } catch (const TypeError&) {
    EXPECT_THROW(make(kCuda), TypeError) << what << ": refused on the cpu, so on cuda too";
    return;
  }
  expect_match(make(kCuda), want, tol, what);
}

[[maybe_unused]] std::string name(DType t, const Layout& l) { return dtype_name(t) + " " + l.name; }
[[maybe_unused]] bool is_int(DType t) { return t == kInt32 || t == kInt64; }

// ---- the unary ops both parity suites run (test_cuda_backend.cpp, test_cuda_half.cpp) ----

struct UnaryCase {
  detail::UnaryOp op;
  const char* name;
  double p0 = 0, p1 = 0;
};

// The same correctly rounded IEEE operations on both backends: equal results (for the half types
// after their one rounding too).
inline const std::vector<UnaryCase>& exact_unary_cases() {
  using U = detail::UnaryOp;
  // clang-format off
  static const std::vector<UnaryCase> cases = {
      {U::Neg, "neg"}, {U::Abs, "abs"}, {U::Sqrt, "sqrt"}, {U::Rsqrt, "rsqrt"}, {U::Square, "square"},
      {U::Reciprocal, "reciprocal"}, {U::Relu, "relu"}, {U::Sign, "sign"}, {U::Floor, "floor"}, {U::Ceil, "ceil"},
      {U::Round, "round"}, {U::LogicalNot, "logical_not"}, {U::IsNan, "isnan"}, {U::PowScalar, "pow 2", 2},
      {U::PowScalar, "pow 0.5", 0.5}, {U::PowScalar, "pow -0.5", -0.5}, {U::PowScalar, "pow 1", 1},
      {U::PowScalar, "pow -1", -1}, {U::Clamp, "clamp", -1.5, 2}, {U::Clamp, "clamp -inf..1", -kInf, 1},
      {U::LeakyRelu, "leaky_relu", 0.01}, {U::HardSigmoid, "hardsigmoid", 1.0 / 6.0, 0.5}, {U::HardSwish, "hardswish"}};
  // clang-format on
  return cases;
}

// libdevice against glibc and the CPU's polynomials (fast_math.h): a few float32 ulp apart (so equal
// halves, or one half ulp apart).
inline const std::vector<UnaryCase>& approximate_unary_cases() {
  using U = detail::UnaryOp;
  // clang-format off
  static const std::vector<UnaryCase> cases = {
      {U::Exp, "exp"}, {U::Log, "log"}, {U::Log1p, "log1p"}, {U::Expm1, "expm1"}, {U::Sin, "sin"}, {U::Cos, "cos"},
      {U::Tanh, "tanh"}, {U::Sigmoid, "sigmoid"}, {U::Erf, "erf"}, {U::PowScalar, "pow 3", 3},
      {U::PowScalar, "pow 1.7", 1.7}, {U::Elu, "elu", 1.3}, {U::Softplus, "softplus"}, {U::GeluTanh, "gelu_tanh"},
      {U::Gelu, "gelu"}, {U::GeluHalfLast, "gelu (half last)"}, {U::Asin, "asin"}, {U::Acos, "acos"},
      {U::Atan, "atan"}};
  // clang-format on
  return cases;
}

// Every unary case on every layout of dtype t, CUDA against the CPU: the exact cases equal, the
// approximate ones within `approximate` (bool results always equal).
[[maybe_unused]] inline void unary_parity(DType t, Tol approximate) {
  for (const auto& [cases, tol] :
       {std::pair{exact_unary_cases(), Tol{}}, std::pair{approximate_unary_cases(), approximate}}) {
    for (const UnaryCase& c : cases) {
      const bool bool_out = c.op == detail::UnaryOp::LogicalNot || c.op == detail::UnaryOp::IsNan;
      for (const Layout& l : layouts()) {
        const Operand x = operand(l, t, 7, {-3, 3});
        const Tol within = bool_out || !is_floating(t) ? Tol{} : tol;
        expect_parity(std::string(c.name) + " " + name(t, l), within, [&](Device d) {
          Tensor out = fresh(l.shape, bool_out ? kBool : t, d);
          backend(d).unary(c.op, x.on(d), out, c.p0, c.p1);
          return out;
        });
      }
    }
  }
}

// Every binary op on every pair of layouts of dtype t, CUDA against the CPU: equal, except pow of
// floating operands (within approx(t)).
[[maybe_unused]] inline void binary_parity(DType t) {
  using detail::BinaryOp;
  const std::vector<Layout> ls = layouts();
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow, BinaryOp::Max,
                          BinaryOp::Min, BinaryOp::Eq,  BinaryOp::Ne,  BinaryOp::Lt,  BinaryOp::Le,  BinaryOp::Gt,
                          BinaryOp::Ge,  BinaryOp::And, BinaryOp::Or,  BinaryOp::Xor};
  for (BinaryOp op : ops) {
    const bool pow = op == BinaryOp::Pow, div = op == BinaryOp::Div;
    const ValueRange ra = pow && is_int(t) ? ValueRange{-5, 5, false} : ValueRange{-3, 3, true};
    const ValueRange rb = pow && is_int(t) ? ValueRange{0, 6, false} : ValueRange{-3, 3, !is_int(t), div && is_int(t)};
    for (size_t i = 0; i < ls.size(); ++i) {
      // Pair each layout with the next one of the same shape (a contiguous a with a broadcast b, ...).
      const Layout& la = ls[i];
      const Layout& lb = i + 1 < ls.size() && ls[i + 1].shape == la.shape ? ls[i + 1] : ls[i];
      const Operand a = operand(la, t, 21, ra), b = operand(lb, t, 22, rb);
      const bool bool_out = op >= BinaryOp::Eq, exact = op != BinaryOp::Pow || is_int(t);
      expect_parity("binary op " + std::to_string(static_cast<int>(op)) + " " + name(t, la) + ", " + lb.name,
                    exact ? Tol{} : approx(t), [&](Device d) {
                      Tensor out = fresh(la.shape, bool_out ? kBool : t, d);
                      backend(d).binary(op, a.on(d), b.on(d), out);
                      return out;
                    });
    }
  }
}

// where over every layout of dtype t (bits moved, so equal), b taken from layout b_layout where its
// shape is the first layout's.
[[maybe_unused]] inline void where_parity(DType t, size_t b_layout) {
  const std::vector<Layout> ls = layouts();
  for (const Layout& l : ls) {
    const Operand c = operand(l, kBool, 31), a = operand(l, t, 32),
                  b = operand(ls[0].shape == l.shape ? ls[b_layout] : l, t, 33);
    expect_parity("where " + name(t, l), {}, [&](Device d) {
      Tensor out = fresh(l.shape, t, d);
      backend(d).where(c.on(d), a.on(d), b.on(d), out);
      return out;
    });
  }
}

// A reduction's input layout and axes.
struct ReductionCase {
  Layout layout;
  std::vector<int64_t> axes;
};

// Each layout over each single axis, two axes of a 3-d one and all axes; then few outputs over
// `long_len` inputs (split reductions, partial results combined) and many outputs over few, in the
// given long layouts.
[[maybe_unused]] inline std::vector<ReductionCase> reduction_cases(const std::vector<Layout>& long_layouts) {
  std::vector<ReductionCase> cases;
  for (const Layout& l : layouts()) {
    const int64_t nd = static_cast<int64_t>(l.shape.size());
    std::vector<int64_t> all(static_cast<size_t>(nd));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t a = 0; a < nd; ++a) cases.push_back({l, {a}});
    if (nd == 3) cases.push_back({l, {0, 2}});
    if (nd > 1) cases.push_back({l, all});
  }
  for (const Layout& l : long_layouts)
    for (std::vector<int64_t> axes : {std::vector<int64_t>{0}, {1}, {0, 1}}) cases.push_back({l, axes});
  return cases;
}

// Every reduction of dtype t over every case, CUDA against the CPU: sum and prod within `sums` (the
// order of the terms differs; integers equal), max and min equal; then argmax and argmin, equal,
// where a case reduces one non-empty axis of several (ties everywhere and NaN now and then: the first
// extreme wins).
[[maybe_unused]] inline void reduction_parity(DType t, const std::vector<ReductionCase>& cases, Tol sums) {
  for (const ReductionCase& c : cases) {
    Shape out_shape = c.layout.shape;
    for (int64_t a : c.axes) out_shape[a] = 1;
    std::string axes;
    for (int64_t a : c.axes) axes += std::to_string(a) + ",";
    const std::string what = name(t, c.layout) + " axes " + axes;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min}) {
      const bool prod = op == ReduceOp::Prod, extreme = op == ReduceOp::Max || op == ReduceOp::Min;
      // NaN and infinities only where they do not swamp every sum (max and min propagate NaN).
      const Operand x = operand(c.layout, t, 41, prod ? ValueRange{0.5, 1.5, false} : ValueRange{-3, 3, extreme});
      expect_parity("reduce " + std::to_string(static_cast<int>(op)) + " " + what,
                    extreme || !is_floating(t) ? Tol{} : sums, [&](Device d) {
                      Tensor out = fresh(out_shape, t, d);
                      backend(d).reduce(op, x.on(d), c.axes, out);
                      return out;
                    });
    }
    if (c.axes.size() != 1 || out_shape == c.layout.shape || c.layout.shape[c.axes[0]] == 0) continue;
    const Operand x = operand(c.layout, t, 43, {-2, 2, true});
    for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin})
      expect_parity("arg-reduce " + std::to_string(static_cast<int>(op)) + " " + what, {}, [&](Device d) {
        Tensor out = fresh(out_shape, kInt64, d);
        backend(d).reduce(op, x.on(d), c.axes, out);
        return out;
      });
  }
}

// argmax and argmin of dtype t along each axis of long rows and long columns (one block per output),
// CUDA against the CPU, equal.
[[maybe_unused]] inline void long_arg_reduction_parity(DType t) {
  for (const Layout& l : {Layout{"long rows", {3, 5000}, {5000, 1}, 0}, Layout{"long columns", {5000, 3}, {3, 1}, 0}})
    for (int64_t axis : {0, 1}) {
      const Operand x = operand(l, t, 44, {-2, 2, true});
      Shape out_shape = l.shape;
      out_shape[axis] = 1;
      for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin})
        expect_parity(
            "arg-reduce " + std::to_string(static_cast<int>(op)) + " " + name(t, l) + " axis " + std::to_string(axis),
            {}, [&](Device d) {
              Tensor out = fresh(out_shape, kInt64, d);
              backend(d).reduce(op, x.on(d), {axis}, out);
              return out;
            });
    }
}

}  // namespace braid
