// Quantised values and their arithmetic: int8/uint8 as storage dtypes (conversions as C++ and NumPy
// define them), int_matmul against the integer product summed in int64 by a loop here, quantize and
// dequantize against their closed forms, and the one-pass softmax and GELU against the composites
// they replace, on the device under test (tests/test_device.h). The family also runs with oneDNN and
// the fused kernels off (tests/meson.build), which takes the composites.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "braid/braid.h"
#include "ops/fused.h"
#include "error_of.h"

namespace braid {
namespace {

TEST(Int8, ConversionsSaturateFromFloatAndWrapBetweenIntegers) {
  EXPECT_EQ(dtype_size(kInt8), 1);
  EXPECT_EQ(dtype_name(kUInt8), "uint8");
  EXPECT_FALSE(is_compute_type(kInt8));
  EXPECT_EQ(compute_type(kUInt8), kInt32);
  EXPECT_EQ(promote_types(kInt8, kUInt8), kInt32);
  EXPECT_EQ(promote_types(kUInt8, kFloat32), kFloat32);
  const Tensor f = tensor(std::vector<float>{-300.f, -128.9f, -1.5f, 0.7f, 126.9f, 255.5f, 1e9f, NAN}, {8});
  // Truncation toward zero, then saturation (NaN gives 0), as braid's float -> int32.
  EXPECT_EQ(cast(f, kInt8).to_vector<int32_t>(), (std::vector<int32_t>{-128, -128, -1, 0, 126, 127, 127, 0}));
  EXPECT_EQ(cast(f, kUInt8).to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0, 0, 126, 255, 255, 0}));
  // Between integers the low bits are kept, as numpy's astype and ONNX's Cast do.
  const Tensor i = tensor(std::vector<int32_t>{300, -1, 128, -129}, {4});
  EXPECT_EQ(cast(i, kUInt8).to_vector<int32_t>(), (std::vector<int32_t>{44, 255, 128, 127}));
  EXPECT_EQ(cast(i, kInt8).to_vector<int32_t>(), (std::vector<int32_t>{44, -1, -128, 127}));
  // Storage types do not compute; the error says what to cast to.
  const Tensor q = cast(i, kInt8);
  EXPECT_NE(error_of<TypeError>([&] { (void)sum(q); }).find("cast to int32 first"), std::string::npos);
  EXPECT_EQ(sum(cast(q, kInt32)).item(), 44 - 1 - 128 + 127);
}

// (a - za)(b - zb) summed exactly in int64, for a (m, k) and b (k, n) given as int32 values.
std::vector<int64_t> reference_product(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int64_t m,
                                       int64_t k, int64_t n, int64_t za, int64_t zb) {
  std::vector<int64_t> c(static_cast<size_t>(m * n), 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[static_cast<size_t>(i * n + j)] +=
            (a[static_cast<size_t>(i * k + p)] - za) * (b[static_cast<size_t>(p * n + j)] - zb);
  return c;
}

std::vector<int32_t> random_values(DType t, int64_t count, Generator& gen) {
  const double lo = t == kInt8 ? -128 : 0, hi = t == kInt8 ? 128 : 256;
  return cast(floor(rand({count}, kFloat64, &gen) * (hi - lo) + lo), kInt32).to_vector<int32_t>();
}

// A weight multiplied again and again (a quantised model's, symmetric: zero point 0) is kept in the
// GEMM's layout from its second product on (Note [Kept int8 weights]): every product stays the
// exact one, with A's zero point changing between calls, and a weight written in place is used as
// it is now.
TEST(IntMatmul, AWeightUsedAgainGivesTheExactProductEachTime) {
  Generator gen(12);
  const int64_t m = 7, k = 150, n = 33;
  const std::vector<int32_t> bv = random_values(kInt8, k * n, gen);
  Tensor b = cast(tensor(bv, {k, n}), kInt8);
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(call);
    const std::vector<int32_t> av = random_values(kUInt8, m * k, gen);
    const int64_t za = 100 + call;
    const std::vector<int64_t> want = reference_product(av, bv, m, k, n, za, 0);
    const std::vector<int32_t> got = int_matmul(cast(tensor(av, {m, k}), kUInt8), b, za, 0).to_vector<int32_t>();
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << i;
  }
  b.fill_(1.0);  // in place: the kept copy is stale
  const std::vector<int32_t> av = random_values(kUInt8, m * k, gen);
  const std::vector<int64_t> want = reference_product(av, std::vector<int32_t>(k * n, 1), m, k, n, 9, 0);
  const std::vector<int32_t> got = int_matmul(cast(tensor(av, {m, k}), kUInt8), b, 9, 0).to_vector<int32_t>();
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << i;
}

// int_matmul_chain: the exact product converted to float32 and carried through a quantised linear
// layer's steps, each the float32 operation of its op, bit for bit: a scale (one value or one per
// column), a bias, a residual, then steps that stay a chain (GELU) or that read an earlier value
// (which keeps them out of the product's epilogue, Note [int8 epilogues]). Each case runs three
// times with one weight, so that the weight is kept and the epilogue runs.
TEST(IntMatmulChain, IsTheProductThroughTheStepsBitForBit) {
  Generator gen(21);
  const int64_t batch = 2, m = 16, k = 64, n = 48;
  const std::vector<int32_t> bv = random_values(kInt8, k * n, gen);
  const Tensor b = cast(tensor(bv, {k, n}), kInt8);
  const std::vector<float> bias = (randn({n}, kFloat32, &gen)).to_vector<float>();
  const std::vector<float> col = (rand({n}, kFloat32, &gen) * 1e-3).to_vector<float>();
  const std::vector<float> res = (randn({batch, m, n}, kFloat32, &gen)).to_vector<float>();
  const float scale = 3.7e-4f;
  using K = ChainStep::Kind;
  const auto step = [](K kind, int a, int b_slot, float k_value = 0, Tensor operand = Tensor()) {
    ChainStep s;
    s.kind = kind;
    s.a = a;
    s.b = b_slot;
    s.k = k_value;
    s.operand = std::move(operand);
    return s;
  };
  const Tensor bias_t = tensor(bias, {n}), col_t = tensor(col, {1, n}), res_t = tensor(res, {batch, m, n});
  constexpr int C = ChainStep::kConstant, T = ChainStep::kTensor;
  struct Case {
    const char* name;
    std::vector<ChainStep> steps;
    // the closed form of one element: the product p at row r, column j (flat index i)
    float (*want)(float p, int64_t j, int64_t i, const std::vector<float>& bias, const std::vector<float>& col,
                  const std::vector<float>& res, float scale);
  };
  const std::vector<Case> cases = {
      {"scale and bias",
       {step(K::Mul, 0, C, scale), step(K::Add, T, 1, 0, bias_t)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>&, float scale) { return bias[j] + p * scale; }},
      {"per-column scale, bias, residual",
       {step(K::Mul, T, 0, 0, col_t), step(K::Add, 1, T, 0, bias_t), step(K::Add, 2, T, 0, res_t)},
       [](float p, int64_t j, int64_t i, const std::vector<float>& bias, const std::vector<float>& col,
          const std::vector<float>& res, float) { return (col[j] * p + bias[j]) + res[i]; }},
      {"division and subtraction",
       {step(K::Div, 0, C, 2731.0f), step(K::Sub, 1, T, 0, bias_t)},
       [](float p, int64_t j, int64_t, const std::vector<float>& bias, const std::vector<float>&,
          const std::vector<float>&, float) { return p / 2731.0f - bias[j]; }},
      {"constant minus the product (not an epilogue)",
       {step(K::Sub, C, 0, 1.5f), step(K::Mul, 1, C, scale)},
       [](float p, int64_t, int64_t, const std::vector<float>&, const std::vector<float>&, const std::vector<float>&,
          float scale) { return (1.5f - p) * scale; }},
      {"a later step reads the product",
       {step(K::Mul, 0, C, scale), step(K::Add, 1, 0)},
       [](float p, int64_t, int64_t, const std::vector<float>&, const std::vector<float>&, const std::vector<float>&,
          float scale) { return p * scale + p; }},
  };
  for (DType at : {kUInt8, kInt8}) {
    const std::vector<int32_t> av = random_values(at, batch * m * k, gen);
    const int64_t za = at == kUInt8 ? 131 : -7;
    const std::vector<int64_t> p = reference_product(av, bv, batch * m, k, n, za, 0);
    const Tensor a = cast(tensor(av, {batch, m, k}), at);
    for (const Case& c : cases)
      for (int call = 0; call < 3; ++call) {
        const std::vector<float> got = detail::int_matmul_chain(a, b, za, 0, c.steps).to_vector<float>();
        ASSERT_EQ(got.size(), p.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const int64_t j = static_cast<int64_t>(i) % n;
          ASSERT_EQ(got[i], c.want(static_cast<float>(p[i]), j, static_cast<int64_t>(i), bias, col, res, scale))
              << c.name << ", " << dtype_name(at) << " A, call " << call << ", element " << i;
        }
      }
    // Steps after the epilogue run as a chain: GELU of the scaled, biased product, then a scale.
    std::vector<ChainStep> gelu_steps{step(K::Mul, 0, C, scale), step(K::Add, 1, T, 0, bias_t), ChainStep{},
                                      step(K::Mul, 3, C, 0.5f)};
    gelu_steps[2].kind = K::Gelu;
    gelu_steps[2].a = 2;
    std::vector<float> pre(p.size());
    for (size_t i = 0; i < p.size(); ++i) pre[i] = static_cast<float>(p[i]) * scale + bias[i % n];
    const std::vector<float> want = (gelu(tensor(pre, {batch, m, n})) * 0.5).to_vector<float>();
    for (int call = 0; call < 3; ++call)
      EXPECT_EQ(detail::int_matmul_chain(a, b, za, 0, gelu_steps).to_vector<float>(), want) << dtype_name(at) << " A";
  }
}

TEST(IntMatmul, IsTheExactIntegerProductForEverySignedness) {
  Generator gen(11);
  const int64_t batch = 2, m = 5, k = 300, n = 19;  // sums of 300 products of up to 255 * 255
  for (DType ta : {kUInt8, kInt8})
    for (DType tb : {kUInt8, kInt8}) {
      SCOPED_TRACE(dtype_name(ta) + " x " + dtype_name(tb));
      const std::vector<int32_t> av = random_values(ta, batch * m * k, gen), bv = random_values(tb, k * n, gen);
      const int64_t za = ta == kInt8 ? -7 : 131, zb = tb == kInt8 ? 3 : 255;
      const Tensor a = cast(tensor(av, {batch, m, k}), ta);
      const Tensor b = cast(tensor(bv, {k, n}), tb);
      const Tensor c = int_matmul(a, b, za, zb);
      ASSERT_EQ(c.dtype(), kInt32);
      ASSERT_EQ(c.shape(), (Shape{batch, m, n}));
      const std::vector<int32_t> got = c.to_vector<int32_t>();
      for (int64_t s = 0; s < batch; ++s) {
        const std::vector<int32_t> as(av.begin() + s * m * k, av.begin() + (s + 1) * m * k);
        const std::vector<int64_t> want = reference_product(as, bv, m, k, n, za, zb);
        for (int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(got[static_cast<size_t>(s * m * n + i)], want[static_cast<size_t>(i)])
              << "batch " << s << " element " << i;
      }
      // A batched b and 1-d operands take matmul's rules (the float64 path).
      const Tensor b2 = cast(tensor(bv, {1, k, n}), tb);
      EXPECT_TRUE(equal(int_matmul(a, b2, za, zb), c));
      const Tensor row = narrow(reshape(a, {batch * m, k}), 0, 0, 1).reshape({k});
      EXPECT_TRUE(equal(int_matmul(row, b, za, zb), narrow(reshape(c, {batch * m, n}), 0, 0, 1).reshape({n})));
    }
  const Tensor u = cast(zeros({2, 3}), kUInt8);
  EXPECT_NE(error_of([&] { (void)int_matmul(u, u); }).find("do not match"), std::string::npos);
  EXPECT_NE(error_of([&] {
              (void)int_matmul(u, cast(zeros({3, 2}), kUInt8), 256);
            }).find("outside uint8's range"),
            std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { (void)int_matmul(zeros({2, 3}), u); }).find("int8 or uint8"), std::string::npos);
}

/// ONNX's QuantizeLinear of one value: the quotient in float32 (as its reference divides), rounded
/// half to even, shifted by the zero point, saturated to [lo, hi]; NaN gives 0.
double quantized(float x, float scale, int64_t zero, double lo, double hi) {
  const float q = x / scale;
  const double v = std::nearbyint(static_cast<double>(q)) + static_cast<double>(zero);
  return std::isnan(v) ? 0 : std::min(std::max(v, lo), hi);
}

TEST(Quantize, IsRoundHalfToEvenOfTheQuotientSaturated) {
  Generator gen(3);
  std::vector<float> x = (randn({100000}, kFloat32, &gen) * 3.0).to_vector<float>();
  const float scale = 0.02f;
  // Exact ties of the quotient, both signs, values past either end, NaN and infinities.
  for (float t : {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.5f}) x.push_back(t * scale);
  for (float v : {1e9f, -1e9f, NAN, INFINITY, -INFINITY, 0.0f, -0.0f}) x.push_back(v);
  const int64_t count = static_cast<int64_t>(x.size());
  for (DType t : {kUInt8, kInt8}) {
    const int64_t zero = t == kUInt8 ? 128 : -3;
    const double lo = t == kUInt8 ? 0 : -128, hi = t == kUInt8 ? 255 : 127;
    const std::vector<int32_t> got = quantize(tensor(x, {count}), scale, zero, t).to_vector<int32_t>();
    for (int64_t i = 0; i < count; ++i) {
      const double want = quantized(x[static_cast<size_t>(i)], scale, zero, lo, hi);
      ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<int32_t>(want))
          << dtype_name(t) << " x = " << x[static_cast<size_t>(i)];
    }
  }
  EXPECT_NE(error_of([&] { (void)quantize(zeros({2}), 0.0, 0, kUInt8); }).find("scale"), std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] { (void)quantize(zeros({2}), 1.0, 0, kInt32); }).find("int8 or uint8"),
            std::string::npos);
}

// dynamic_quantize (ONNX's DynamicQuantizeLinear) is the reference's closed form: the range widened
// to include 0, scale = range / 255 in float32, zero = round(-lo / scale) clamped to [0, 255], then
// the quotient rounded half to even and saturated; for sizes on either side of the parallel grain,
// all-positive and all-negative inputs, zeros, and a NaN (counted as 0 in the range).
TEST(DynamicQuantize, IsTheReferencesClosedForm) {
  Generator gen(8);
  struct Case {
    const char* name;
    std::vector<float> x;
  };
  std::vector<Case> cases;
  for (int64_t n : {7, 5000, 40000}) {
    cases.push_back({"mixed", (randn({n}, kFloat32, &gen) * 2.5).to_vector<float>()});
    cases.push_back({"positive", (rand({n}, kFloat32, &gen) * 3.0 + 0.5).to_vector<float>()});
  }
  cases.push_back({"negative", (rand({300}, kFloat32, &gen) * -4.0 - 1.0).to_vector<float>()});
  cases.push_back({"zeros", std::vector<float>(100, 0.0f)});
  std::vector<float> with_nan = (randn({1000}, kFloat32, &gen)).to_vector<float>();
  with_nan[417] = NAN;
  cases.push_back({"a NaN", with_nan});
  for (const Case& c : cases) {
    float mn = 0, mx = 0;
    bool nan = false;
    for (float v : c.x) {
      nan = nan || std::isnan(v);
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    if (nan) mn = mx = 0;
    const float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
    const int64_t zero = static_cast<int64_t>(std::nearbyint(std::clamp(0.0f - mn / scale, 0.0f, 255.0f)));
    const int64_t n = static_cast<int64_t>(c.x.size());
    const DynamicQuantized q = dynamic_quantize(tensor(c.x, {n}));
    EXPECT_EQ(q.scale, scale) << c.name << ", " << n;
    EXPECT_EQ(q.zero_point, zero) << c.name << ", " << n;
    ASSERT_EQ(q.values.dtype(), kUInt8);
    const std::vector<int32_t> got = q.values.to_vector<int32_t>();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)],
                static_cast<int32_t>(quantized(c.x[static_cast<size_t>(i)], scale, zero, 0, 255)))
          << c.name << ", " << n << " values, element " << i;
  }
  const DynamicQuantized empty = dynamic_quantize(zeros({0}));
  EXPECT_EQ(empty.values.numel(), 0);
  EXPECT_EQ(empty.scale, 1.0f / 255.0f);
  EXPECT_NE(error_of<TypeError>([&] { (void)dynamic_quantize(zeros({3}, kFloat64)); }).find("float32"),
            std::string::npos);
}

TEST(Dequantize, IsTheDifferenceScaledInFloat32) {
  for (DType t : {kUInt8, kInt8}) {
    const int64_t zero = t == kUInt8 ? 131 : -5;
    std::vector<int32_t> v;
    for (int32_t i = t == kUInt8 ? 0 : -128; i <= (t == kUInt8 ? 255 : 127); ++i)
      for (int r = 0; r < 400; ++r) v.push_back(i);  // every value, 100,000 and more elements in all
    const int64_t n = static_cast<int64_t>(v.size());
    const float scale = 0.0372f;
    const std::vector<float> got = dequantize(cast(tensor(v, {n}), t), scale, zero).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float want = (static_cast<float>(v[static_cast<size_t>(i)]) - static_cast<float>(zero)) * scale;
      ASSERT_EQ(got[static_cast<size_t>(i)], want) << dtype_name(t) << " value " << v[static_cast<size_t>(i)];
    }
  }
  const std::vector<float> wide = dequantize(tensor(std::vector<int32_t>{-70000, 5}, {2}), 0.5, 3).to_vector<float>();
  EXPECT_EQ(wide, (std::vector<float>{-35001.5f, 1.0f}));
  EXPECT_NE(error_of<TypeError>([&] { (void)dequantize(zeros({2}), 1.0, 0); }).find("int8, uint8 or int32"),
            std::string::npos);
}

// fake_quantize (ONNX's QuantizeLinear + DequantizeLinear in one pass) is the closed form, the
// quotient rounded half to even, saturated, shifted back and scaled in float32, bit for bit.
TEST(FakeQuantize, IsTheRoundedQuotientScaledBackBitForBit) {
  Generator gen(5);
  std::vector<float> x = (randn({100000}, kFloat32, &gen) * 3.0).to_vector<float>();
  const float scale = 0.02f;
  for (float t : {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.5f}) x.push_back(t * scale);
  for (float v : {1e9f, -1e9f, NAN, INFINITY, -INFINITY, 0.0f, -0.0f}) x.push_back(v);
  const int64_t count = static_cast<int64_t>(x.size());
  for (DType t : {kUInt8, kInt8}) {
    const int64_t zero = t == kUInt8 ? 128 : -3;
    const double lo = t == kUInt8 ? 0 : -128, hi = t == kUInt8 ? 255 : 127;
    const std::vector<float> got = fake_quantize(tensor(x, {count}), scale, zero, t).to_vector<float>();
    for (int64_t i = 0; i < count; ++i) {
      const double v = quantized(x[static_cast<size_t>(i)], scale, zero, lo, hi);
      const float want = (static_cast<float>(v) - static_cast<float>(zero)) * scale;
      ASSERT_EQ(got[static_cast<size_t>(i)], want) << dtype_name(t) << " x = " << x[static_cast<size_t>(i)];
    }
  }
  EXPECT_NE(error_of([&] { (void)fake_quantize(zeros({2}), 0.0, 0, kUInt8); }).find("scale"), std::string::npos);
}

// Values a few ulp either side of every rounding tie, for scales whose reciprocal is inexact: each
// quotient rounds as the float32 division x / scale does (a multiplication by 1/scale would round
// some of them the other way), in quantize, fake_quantize and a chain's step alike.
TEST(Quantize, NearTiesRoundAsTheDivisionDoes) {
  for (const float scale : {0.0371f, 1.0f / 3.0f, 7.3e-3f, 0.02f, 1.7e-5f}) {
    std::vector<float> x;
    for (int k = -131; k <= 131; ++k) {
      float v = (static_cast<float>(k) + 0.5f) * scale;
      for (int u = 0; u < 6; ++u) v = std::nextafter(v, -INFINITY);
      for (int u = 0; u < 12; ++u, v = std::nextafter(v, INFINITY)) x.push_back(v);
    }
    const int64_t count = static_cast<int64_t>(x.size());
    for (DType t : {kUInt8, kInt8}) {
      const int64_t zero = t == kUInt8 ? 127 : 0;
      const double lo = t == kUInt8 ? 0 : -128, hi = t == kUInt8 ? 255 : 127;
      const Tensor xt = tensor(x, {count});
      const std::vector<int32_t> q = quantize(xt, scale, zero, t).to_vector<int32_t>();
      const std::vector<float> fq = fake_quantize(xt, scale, zero, t).to_vector<float>();
      ChainStep step;
      step.kind = ChainStep::Kind::FakeQuantize;
      step.scale = scale;
      step.zero = zero;
      step.qtype = t;
      const std::vector<float> chained = detail::elementwise_chain(xt, {step}).to_vector<float>();
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = quantized(x[i], scale, zero, lo, hi);
        const float back = (static_cast<float>(v) - static_cast<float>(zero)) * scale;
        ASSERT_EQ(q[i], static_cast<int32_t>(v)) << "scale " << scale << " x = " << x[i];
        ASSERT_EQ(fq[i], back) << "scale " << scale << " x = " << x[i];
        ASSERT_EQ(chained[i], back) << "scale " << scale << " x = " << x[i];
      }
    }
  }
}

// The one-pass softmax (Backend::softmax_rows) gives the composite's numbers bit for bit: rows short
// and long, with infinities and NaN, enough rows for every thread.
TEST(Softmax, RowKernelIsTheComposite) {
  Generator gen(8);
  for (int64_t n : {1, 7, 16, 37, 300}) {
    SCOPED_TRACE("row length " + std::to_string(n));
    Tensor x = randn({500, n}, kFloat32, &gen) * 4.0;
    std::vector<float> v = x.to_vector<float>();
    v[0] = INFINITY;
    v[static_cast<size_t>(n)] = -INFINITY;
    v[static_cast<size_t>(2 * n)] = NAN;
    x = tensor(v, {500, n});
    const Tensor e = exp(x - amax(x, {1}, true));
    const Tensor composite = e / sum(e, {1}, true);
    const std::vector<float> got = softmax(x, 1).to_vector<float>(), want = composite.to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i]))
        ASSERT_TRUE(std::isnan(got[i])) << i;
      else
        ASSERT_EQ(got[i], want[i]) << i;
    }
    // And a closed-form check of one ordinary row, in double.
    double s = 0, m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(v[static_cast<size_t>(3 * n + j)]));
    for (int64_t j = 0; j < n; ++j) s += std::exp(v[static_cast<size_t>(3 * n + j)] - m);
    for (int64_t j = 0; j < n; ++j)
      EXPECT_NEAR(got[static_cast<size_t>(3 * n + j)], std::exp(v[static_cast<size_t>(3 * n + j)] - m) / s, 2e-7);
  }
}

// The one-pass exact GELU (UnaryOp::Gelu) gives the composite x * (0.5 * (1 + erf(x / sqrt 2)))
// bit for bit, with infinities and NaN, in both float dtypes; and std::erf's closed form in double.
TEST(Gelu, OnePassIsTheComposite) {
  Generator gen(9);
  for (DType t : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<double> v = (randn({40000}, kFloat64, &gen) * 5.0).to_vector<double>();
    v[0] = INFINITY, v[1] = -INFINITY, v[2] = NAN, v[3] = 0.0, v[4] = -0.0, v[5] = 1e-40;
    const Tensor x = cast(tensor(v, {40000}), t);
    const Tensor composite = x * (0.5 * (1.0 + erf(x / 1.4142135623730951)));
    const std::vector<double> got = gelu(x).to_vector<double>(), want = composite.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i]))
        ASSERT_TRUE(std::isnan(got[i])) << i;
      else
        ASSERT_EQ(got[i], want[i]) << i << ": x = " << v[i];
    }
    const std::vector<double> xs = x.to_vector<double>();
    for (size_t i = 6; i < 200; ++i)
      EXPECT_NEAR(got[i], xs[i] * 0.5 * (1 + std::erf(xs[i] / std::sqrt(2.0))),
                  t == kFloat32 ? 2e-6 * (1 + std::fabs(xs[i])) : 1e-14);
  }
}

// aminmax (DynamicQuantizeLinear's range) is amin and amax in one pass: on sizes below and above
// the parallel grain, a strided input, infinities, and NaN anywhere winning.
TEST(Aminmax, IsAminAndAmax) {
  Generator gen(13);
  for (int64_t n : {1, 7, 1000, 100003}) {
    SCOPED_TRACE(n);
    Tensor x = randn({n}, kFloat32, &gen) * 3.0;
    const auto [lo, hi] = aminmax(x);
    EXPECT_EQ(lo.dim(), 0);
    EXPECT_EQ(lo.item(), amin(x).item());
    EXPECT_EQ(hi.item(), amax(x).item());
    if (n > 1) {
      x.narrow(0, n / 2, 1).fill_(INFINITY);
      EXPECT_EQ(aminmax(x).second.item(), INFINITY);
      x.narrow(0, n - 1, 1).fill_(NAN);
      EXPECT_TRUE(std::isnan(aminmax(x).first.item()) && std::isnan(aminmax(x).second.item()));
    }
  }
  const Tensor m = randn({40, 30}, kFloat32, &gen).transpose(0, 1);  // not contiguous
  EXPECT_EQ(aminmax(m).first.item(), amin(m).item());
  EXPECT_EQ(aminmax(m).second.item(), amax(m).item());
  // With a gradient: amin and amax, recorded.
  Tensor w = tensor(std::vector<float>{1.f, -2.f, 5.f}, {3});
  w.set_requires_grad();
  const auto [wl, wh] = aminmax(w);
  (wh - wl).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0.f, -1.f, 1.f}));
}

// An elementwise chain (Note [Elementwise chains]) gives, bit for bit, its steps run one by one as
// the ops they stand for, in either layout (a channels-last input gives a channels-last result):
// the fake quantisations of both types, a per-channel affine map, arithmetic by constants on
// either side, between two earlier steps and with tensors that broadcast (a residual, a per-sample
// channel scale, a bias, a mask), the exact GELU, with ties, saturation, NaN and infinities, on sizes below and
// above the parallel grain.
TEST(ElementwiseChain, EachStepIsItsOpBitForBit) {
  Generator gen(12);
  for (bool channels_last : {false, true}) {
    for (const Shape& s : {Shape{1, 5, 3, 4}, Shape{2, 24, 37, 41}}) {
      SCOPED_TRACE(std::string(channels_last ? "channels-last " : "contiguous ") + shape_str(s));
      Tensor x = channels_last ? (randn({s[0], s[2], s[3], s[1]}, kFloat32, &gen) * 4.0).permute({0, 3, 1, 2})
                               : randn(s, kFloat32, &gen) * 4.0;
      {
        std::vector<float> v = x.to_vector<float>();  // the logical order; written back through the view
        v[0] = NAN, v[1] = INFINITY, v[2] = -INFINITY, v[3] = 1e9f, v[4] = 0.045f, v[5] = -0.015f;
        x.copy_(tensor(v, s));
      }
      const int64_t c = s[1];
      const Tensor sc = rand({c}, kFloat32, &gen, 0.5, 1.5), sh = randn({c}, kFloat32, &gen);
      using K = ChainStep::Kind;
      std::vector<ChainStep> steps(9);
      steps[0].kind = K::FakeQuantize, steps[0].a = 0, steps[0].scale = 0.03, steps[0].zero = 120;
      steps[1].kind = K::ChannelAffine, steps[1].a = 1, steps[1].channel_scale = sc, steps[1].channel_shift = sh;
      steps[2].kind = K::FakeQuantize, steps[2].a = 2, steps[2].scale = 0.05, steps[2].zero = -4,
      steps[2].qtype = kInt8;
      steps[3].kind = K::Add, steps[3].a = 3, steps[3].b = -1, steps[3].k = 3.0f;
      steps[4].kind = K::FakeQuantize, steps[4].a = 4, steps[4].scale = 6.0 / 255, steps[4].zero = 0;
      steps[5].kind = K::Mul, steps[5].a = 3, steps[5].b = 5;
      steps[6].kind = K::Div, steps[6].a = 6, steps[6].b = -1, steps[6].k = 6.0f;
      steps[7].kind = K::Sub, steps[7].a = -1, steps[7].b = 7, steps[7].k = 0.5f;
      steps[8].kind = K::Div, steps[8].a = -1, steps[8].b = 8, steps[8].k = 2.0f;
      // Tensor operands: a residual of x's shape (always NCHW, so against a channels-last x its
      // strides differ), a per-sample channel scale, a bias along the last axis and a mask.
      const Tensor full_size = randn(s, kFloat32, &gen), se = rand({s[0], c, 1, 1}, kFloat32, &gen),
                   bias = randn({s[3]}, kFloat32, &gen), mask = randn({s[0], 1, 1, s[3]}, kFloat32, &gen);
      steps.resize(14);
      steps[9].kind = K::Add, steps[9].a = 9, steps[9].b = ChainStep::kTensor, steps[9].operand = full_size;
      steps[10].kind = K::Mul, steps[10].a = ChainStep::kTensor, steps[10].b = 10, steps[10].operand = se;
      steps[11].kind = K::Add, steps[11].a = 11, steps[11].b = ChainStep::kTensor, steps[11].operand = bias;
      steps[12].kind = K::Sub, steps[12].a = 12, steps[12].b = ChainStep::kTensor, steps[12].operand = mask;
      steps[13].kind = K::Gelu, steps[13].a = 13;
      const Tensor got = detail::elementwise_chain(x, steps);
      EXPECT_EQ(got.shape(), s);
      EXPECT_EQ(!got.is_contiguous() && got.is_channels_last(), channels_last);
      const Tensor v1 = fake_quantize(x, 0.03, 120, kUInt8);
      const Tensor v2 = channel_affine(v1, sc, sh);
      const Tensor v3 = fake_quantize(v2, 0.05, -4, kInt8);
      const Tensor v4 = v3 + full({}, 3.0, kFloat32);
      const Tensor v5 = fake_quantize(v4, 6.0 / 255, 0, kUInt8);
      const Tensor v8 = full({}, 0.5, kFloat32) - (v3 * v5) / full({}, 6.0, kFloat32);
      const Tensor want = gelu(((se * (full({}, 2.0, kFloat32) / v8 + full_size)) + bias) - mask);
      const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
      ASSERT_EQ(g.size(), w.size());
      for (size_t i = 0; i < g.size(); ++i) {
        if (std::isnan(w[i]))
          ASSERT_TRUE(std::isnan(g[i])) << i;
        else
          ASSERT_EQ(g[i], w[i]) << i;
      }
      // One step alone, and a chain whose last step reads the input again.
      EXPECT_EQ(detail::elementwise_chain(x, {steps[0]}).to_vector<float>(), v1.to_vector<float>());
      ChainStep again;
      again.kind = K::Sub, again.a = 1, again.b = 0;
      const std::vector<float> residual = detail::elementwise_chain(x, {steps[0], again}).to_vector<float>(),
                               residual_want = (v1 - x).to_vector<float>();
      for (size_t i = 0; i < residual.size(); ++i) {
        if (!std::isnan(residual_want[i])) {
          ASSERT_EQ(residual[i], residual_want[i]) << i;
        }
      }
    }
  }
}

// A chain against its closed form written out here in float arithmetic: the fake quantisation
// (round half to even by std::nearbyint, saturated), a per-channel affine map, an added constant and
// a bias along the last axis exactly; then the exact GELU against std::erf in double.
TEST(ElementwiseChain, MatchesTheClosedForm) {
  Generator gen(20);
  const Tensor x = randn({2, 3, 50}, kFloat32, &gen) * 4.0, sc = rand({3}, kFloat32, &gen, 0.5, 1.5),
               sh = randn({3}, kFloat32, &gen), bias = randn({50}, kFloat32, &gen);
  using K = ChainStep::Kind;
  std::vector<ChainStep> steps(5);
  steps[0].kind = K::FakeQuantize, steps[0].a = 0, steps[0].scale = 0.05, steps[0].zero = 128;
  steps[1].kind = K::ChannelAffine, steps[1].a = 1, steps[1].channel_scale = sc, steps[1].channel_shift = sh;
  steps[2].kind = K::Add, steps[2].a = 2, steps[2].b = ChainStep::kConstant, steps[2].k = 0.25f;
  steps[3].kind = K::Mul, steps[3].a = 3, steps[3].b = ChainStep::kTensor, steps[3].operand = bias;
  steps[4].kind = K::Gelu, steps[4].a = 4;
  const std::vector<float> exact = detail::elementwise_chain(x, {steps[0], steps[1], steps[2], steps[3]}).to_vector<float>();
  const std::vector<float> with_gelu = detail::elementwise_chain(x, steps).to_vector<float>();
  const std::vector<float> xs = x.to_vector<float>(), a = sc.to_vector<float>(), b = sh.to_vector<float>(),
                           t = bias.to_vector<float>();
  const float s = 0.05f, z = 128.0f;
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t c = (i / 50) % 3, l = i % 50;
    const float q = std::min(255.0f, std::max(0.0f, std::nearbyint(xs[i] / s) + z));
    const float want = (((q - z) * s) * a[c] + b[c] + 0.25f) * t[l];
    ASSERT_EQ(exact[i], want) << i;
    const double g = static_cast<double>(want) * 0.5 * (1 + std::erf(static_cast<double>(want) / std::sqrt(2.0)));
    ASSERT_NEAR(with_gelu[i], g, 2e-6 * (1 + std::fabs(g))) << i;
  }
}

// int32 values (MatMulInteger's products) enter a chain converted as braid::cast converts them,
// including those that float32 rounds (above 2^24).
TEST(ElementwiseChain, Int32InputIsCastFirst) {
  Generator gen(16);
  for (int64_t n : {5, 70000}) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 2654435761u) % 100000) - 50000;
    v[0] = (1 << 24) + 1, v[1] = -((1 << 30) + 3), v[2] = std::numeric_limits<int32_t>::max();
    const Tensor x = tensor(v, {n / 5, 5}), bias = randn({5}, kFloat32, &gen);
    std::vector<ChainStep> steps(2);
    steps[0].kind = ChainStep::Kind::Mul, steps[0].a = 0, steps[0].b = ChainStep::kConstant, steps[0].k = 3.1e-4f;
    steps[1].kind = ChainStep::Kind::Add, steps[1].a = ChainStep::kTensor, steps[1].b = 1, steps[1].operand = bias;
    const Tensor want = bias + cast(x, kFloat32) * full({}, 3.1e-4, kFloat32);
    EXPECT_EQ(detail::elementwise_chain(x, steps).to_vector<float>(), want.to_vector<float>()) << n;
  }
}

TEST(ElementwiseChain, RefusesStepsItCannotRunNamingThem) {
  const Tensor x = ones({2, 3, 4, 4});
  ChainStep later;
  later.kind = ChainStep::Kind::Add, later.a = 0, later.b = 2;
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(x, {later}); }).find("step 0 reads slots 0 and 2"),
            std::string::npos);
  ChainStep affine;
  affine.kind = ChainStep::Kind::ChannelAffine, affine.channel_scale = ones({4}), affine.channel_shift = zeros({4});
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(x, {affine}); }).find("channels (axis 1 of [2, 3, 4, 4])"),
            std::string::npos);
  ChainStep q;
  q.kind = ChainStep::Kind::FakeQuantize, q.scale = 0.1, q.zero = 300;
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(x, {q}); }).find("zero point 300"), std::string::npos);
  EXPECT_NE(
      error_of<TypeError>([&] { detail::elementwise_chain(ones({3}, kFloat64), {later}); }).find("must be float32 or int32"),
      std::string::npos);
  Tensor w = ones({3});
  w.set_requires_grad();
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(w, {q}); }).find("inference only"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(x, {}); }).find("no steps"), std::string::npos);
  ChainStep wide;
  wide.kind = ChainStep::Kind::Add, wide.b = ChainStep::kTensor, wide.operand = ones({3, 2, 3, 4, 4});
  EXPECT_NE(error_of<ValueError>([&] { detail::elementwise_chain(x, {wide}); }).find("does not broadcast to the input's"),
            std::string::npos);
}

}  // namespace
}  // namespace braid
