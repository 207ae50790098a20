// The core's behaviour at the edges: 0-d tensors and axes, degenerate statistics, scalars that do
// not fit an integer dtype, integer clamping, empty arrays, softmax over nothing, and the promotion
// table in dtype.h. Expected values are PyTorch 1.13's (printed by hand from torch for each case)
// or closed forms; the differential test (test_differential.cpp) covers the same ground at random.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "braid/braid.h"
#include "error_of.h"

namespace braid {
namespace {

TEST(Edges, ZeroDimTensorHasNoAxisToSliceOrSplit) {
  // torch: "narrow() cannot be applied to a 0-dim tensor", "split expects at least a 1-dimensional tensor".
  const Tensor s = scalar_tensor(2.5);
  const Tensor i0 = scalar_tensor(0, kInt64);
  EXPECT_NE(error_of<IndexError>([&] { slice(s, 0, 0, 1); }).find("slice: a 0-d tensor has no axis 0"),
            std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { narrow(s, -1, 0, 1); }).find("narrow"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { s.select(0, 0); }).find("select"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { split(s, {1}, 0); }).find("split"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { chunk(s, 1, -1); }).find("chunk"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { s.size(0); }).find("size"), std::string::npos);
  // Out-of-range axes of a 0-d tensor (torch: "expected to be in range of [-1, 0], but got 7").
  EXPECT_NE(error_of<IndexError>([&] { transpose(s, 0, 7); }).find("transpose: axis 7"), std::string::npos);
  EXPECT_NE(error_of<IndexError>([&] { flatten(s, 0, 2); }).find("flatten: axis 2"), std::string::npos);
  EXPECT_THROW(gather(s, 1, i0), IndexError);
  EXPECT_THROW(sum(s, {1}), IndexError);
}

TEST(Edges, ZeroDimTensorActsAsOneAxisWhereTorchAllowsIt) {
  const Tensor s = scalar_tensor(2.5);
  // torch.gather(s, 0, tensor(0)) -> tensor(2.5); with index [0] -> tensor([2.5]).
  Tensor g0 = gather(s, 0, scalar_tensor(0, kInt64));
  EXPECT_EQ(g0.dim(), 0);
  EXPECT_EQ(g0.item(), 2.5);
  Tensor g1 = gather(s, -1, tensor(std::vector<int64_t>{0, 0}, {2}));
  EXPECT_EQ(g1.shape(), Shape({2}));
  EXPECT_EQ(g1.to_vector<float>(), std::vector<float>({2.5f, 2.5f}));
  EXPECT_THROW(gather(s, 0, scalar_tensor(1, kInt64)), IndexError);
  // A 0-d index into a 1-d input picks one element (torch.gather(tensor([1., 2.]), 0, tensor(1)) -> tensor(2.)).
  Tensor g2 = gather(tensor(std::vector<float>{1, 2}, {2}), 0, scalar_tensor(1, kInt64));
  EXPECT_EQ(g2.dim(), 0);
  EXPECT_EQ(g2.item(), 2.0);
  EXPECT_EQ(scatter_add(zeros({2}), 0, scalar_tensor(1, kInt64), scalar_tensor(3.0)).to_vector<float>(),
            std::vector<float>({0.0f, 3.0f}));
  // torch.index_select(s, 0, tensor([0])) -> tensor(2.5), 0-d.
  Tensor is = index_select(s, 0, tensor(std::vector<int64_t>{0}, {1}));
  EXPECT_EQ(is.dim(), 0);
  EXPECT_EQ(is.item(), 2.5);
  // torch.zeros(()).scatter_add(0, tensor(0), tensor(1.)) -> tensor(1.).
  Tensor sa = scatter_add(zeros({}), 0, scalar_tensor(0, kInt64), scalar_tensor(1.0));
  EXPECT_EQ(sa.dim(), 0);
  EXPECT_EQ(sa.item(), 1.0);
  EXPECT_EQ(transpose(s, 0, -1).dim(), 0);
  EXPECT_EQ(flatten(s, 0, -1).shape(), Shape({1}));
  EXPECT_EQ(squeeze(s, 0).dim(), 0);
  EXPECT_EQ(softmax(s, 0).item(), 1.0);
  EXPECT_EQ(argmax(s, -1).item(), 0.0);
  // The gradient flows through the 0-d gather: d/ds sum(gather(s, [0, 0])) = 2.
  Tensor w = scalar_tensor(2.5);
  w.set_requires_grad(true);
  sum(gather(w, 0, tensor(std::vector<int64_t>{0, 0}, {2}))).backward();
  EXPECT_EQ(w.grad().item(), 2.0);
}

TEST(Edges, VarianceWithTooFewElementsIsNaN) {
  // torch.var(torch.zeros(0)) and torch.var(torch.ones(1)) are nan; so is correction 2 of one element.
  for (const Tensor& x : {zeros({0}), ones({1}), zeros({0}, kFloat64)}) {
    for (int64_t correction : {1, 2}) {
      const double v = var(x, {}, correction).item(), s = braid::std(x, {}, correction).item();
      EXPECT_TRUE(std::isnan(v)) << shape_str(x.shape()) << " correction " << correction << " gave " << v;
      EXPECT_TRUE(std::isnan(s)) << shape_str(x.shape()) << " correction " << correction << " gave " << s;
    }
  }
  // Per-row: rows of one element are nan, a row of two with correction 1 is the closed form.
  Tensor rows = tensor(std::vector<double>{1.0, 3.0}, {1, 2});
  EXPECT_EQ(var(rows, {1}).item(), 2.0);
  EXPECT_TRUE(std::isnan(var(rows, {0}).to_vector<double>()[0]));
  // n - correction < 0 with a non-zero sum is +inf (the divisor is clamped at 0, as in torch).
  EXPECT_EQ(var(rows, {1}, 3).item(), std::numeric_limits<double>::infinity());
}

TEST(Edges, ScalarsThatDoNotFitAnIntegerDtypeActAsFloats) {
  // torch: tensor([False, False, True]) + 1e30 -> float32 [1e30, 1e30, 1e30].
  Tensor b = tensor_bool({false, false, true}, {3}) + 1e30;
  EXPECT_EQ(b.dtype(), kFloat32);
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(3, 1e30f));
  // torch: tensor([1], dtype=int32) * 3e9 -> float32 [3e9].
  Tensor m = tensor(std::vector<int32_t>{1}, {1}) * 3e9;
  EXPECT_EQ(m.dtype(), kFloat32);
  EXPECT_EQ(m.item(), 3e9);
  // A whole number that fits keeps the integer dtype; bool with a whole number gives int64.
  EXPECT_EQ((tensor(std::vector<int32_t>{1}, {1}) * 3.0).dtype(), kInt32);
  EXPECT_EQ((tensor_bool({true}, {1}) + 2.0).dtype(), kInt64);
  EXPECT_EQ((tensor(std::vector<int64_t>{1}, {1}) + 0.5).dtype(), kFloat32);
  // Explicit fills refuse values out of range (torch: "value cannot be converted to type int64_t
  // without overflow"); in-place updates refuse a scalar that would change the dtype.
  EXPECT_NE(error_of<ValueError>([] { full({2}, 1e30, kInt64); }).find("full: value 1e+30"), std::string::npos);
  EXPECT_THROW(full({2}, std::nan(""), kInt32), ValueError);
  EXPECT_THROW(zeros({2}, kInt32).fill_(3e9), ValueError);
  EXPECT_THROW(arange(0.0, 4e9, 1e9, kInt32), ValueError);  // its last value 3e9 is out of range
  EXPECT_EQ(arange(0.0, 3e9, 1e9, kInt32).to_vector<int32_t>(), std::vector<int32_t>({0, 1000000000, 2000000000}));
  EXPECT_EQ(full({1}, -2147483648.0, kInt32).item(), -2147483648.0);
  EXPECT_EQ(full({1}, 2.9, kInt64).item(), 2.0);  // truncation toward zero, as torch.full
  Tensor i = tensor(std::vector<int64_t>{4}, {1});
  EXPECT_THROW(i.mul_(0.5), TypeError);
  EXPECT_EQ(i.mul_(3.0).item(), 12.0);
  // add with a fractional alpha on an integer operand computes in float (torch: b * alpha first).
  Tensor f = add(zeros({1}), tensor(std::vector<int64_t>{3}, {1}), 0.5);
  EXPECT_EQ(f.item(), 1.5);
}

TEST(Edges, ClampOfIntegersWithFractionalBoundsPromotes) {
  // torch.clamp(tensor([-1, 3]), -0.5) -> float32 [-0.5, 3.]; with max=2 -> [-0.5, 2.].
  const Tensor x = tensor(std::vector<int64_t>{-1, 3}, {2});
  Tensor c = clamp(x, -0.5, std::nullopt);
  EXPECT_EQ(c.dtype(), kFloat32);
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>({-0.5f, 3.0f}));
  EXPECT_EQ(clamp(x, -0.5, 2.0).to_vector<float>(), std::vector<float>({-0.5f, 2.0f}));
  // Whole bounds keep the dtype; bool is clamped as int64 (torch: clamp(bool, 0.5) -> float32).
  Tensor k = clamp(x, 0.0, 2.0);
  EXPECT_EQ(k.dtype(), kInt64);
  EXPECT_EQ(k.to_vector<int64_t>(), std::vector<int64_t>({0, 2}));
  Tensor bc = clamp(tensor_bool({true, false}, {2}), 0.5, std::nullopt);
  EXPECT_EQ(bc.dtype(), kFloat32);
  EXPECT_EQ(bc.to_vector<float>(), std::vector<float>({1.0f, 0.5f}));
  // Deliberately unlike torch (which sets every element to max): min > max is an error.
  EXPECT_THROW(clamp(zeros({2}), 3.0, 1.0), ValueError);
}

TEST(Edges, SoftmaxFamilyOverAZeroLengthAxis) {
  // torch.softmax(zeros(2, 0), 1) is an empty (2, 0); torch.logsumexp(zeros(2, 0), 1) = [-inf, -inf].
  EXPECT_EQ(softmax(zeros({2, 0}), 1).shape(), Shape({2, 0}));
  EXPECT_EQ(log_softmax(zeros({2, 0}), -1).shape(), Shape({2, 0}));
  Tensor l = logsumexp(zeros({2, 0}), {1});
  EXPECT_EQ(l.shape(), Shape({2}));
  EXPECT_EQ(l.to_vector<float>(), std::vector<float>(2, -std::numeric_limits<float>::infinity()));
  EXPECT_EQ(logsumexp(zeros({0, 2}), {1}).shape(), Shape({0}));
  // The max of nothing is still an error (torch: "Expected reduction dim 1 to have non-zero size").
  EXPECT_THROW(amax(zeros({2, 0}), {1}), ValueError);
  // Non-empty rows keep PyTorch's behaviour around infinities: a +inf element makes the row NaN in
  // softmax (inf - inf), while logsumexp gives +inf.
  Tensor r = tensor(std::vector<float>{std::numeric_limits<float>::infinity(), 0.0f}, {2});
  EXPECT_TRUE(std::isnan(softmax(r, 0).to_vector<float>()[1]));
  EXPECT_EQ(logsumexp(r, {0}).item(), std::numeric_limits<double>::infinity());
}

TEST(Edges, PromotionFollowsTheTableInDtypeH) {
  const Tensor t = tensor_bool({true, false}, {2}), f = tensor_bool({true, true}, {2});
  // torch: bool + bool and bool * bool stay bool; maximum/minimum of bools are bool.
  EXPECT_EQ((t + f).dtype(), kBool);
  EXPECT_EQ((t + f).to_vector<int64_t>(), std::vector<int64_t>({1, 1}));
  EXPECT_EQ((t * f).to_vector<int64_t>(), std::vector<int64_t>({1, 0}));
  EXPECT_EQ(maximum(t, f).dtype(), kBool);
  EXPECT_EQ(minimum(t, f).to_vector<int64_t>(), std::vector<int64_t>({1, 0}));
  EXPECT_EQ((t / f).dtype(), kFloat32);
  EXPECT_NE(error_of<TypeError>([&] { sub(t, f); }).find("logical_xor"), std::string::npos);
  EXPECT_THROW(pow(t, f), TypeError);
  // square of bool gives int64 (torch.square(tensor([True])) -> tensor([1])); sign of bool stays bool.
  EXPECT_EQ(square(t).dtype(), kInt64);
  EXPECT_EQ(sign(t).dtype(), kBool);
  // sum_to has sum's dtype whether or not anything is reduced.
  EXPECT_EQ(sum_to(t, {2}).dtype(), kInt64);
  EXPECT_EQ(sum_to(t, {1}).dtype(), kInt64);
  EXPECT_EQ(sum_to(tensor(std::vector<int32_t>{1, 2}, {2}), {2}).dtype(), kInt64);
  EXPECT_EQ(sum_to(zeros({2}), {2}).dtype(), kFloat32);
  // Tensor-tensor promotion looks at dtypes only, also for 0-d tensors (deliberately unlike torch).
  EXPECT_EQ((tensor(std::vector<int32_t>{1}, {1}) + scalar_tensor(5, kInt64)).dtype(), kInt64);
  EXPECT_EQ(promote_types(kBool, kInt32), kInt32);
  EXPECT_EQ(promote_types(kInt64, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat16, kBFloat16), kFloat32);
}

}  // namespace
}  // namespace braid

// erf in float32 is a vectorised polynomial (fast_math.h): within 1 ulp of double-precision libm
// over a dense grid of [-6, 6] and down to tiny magnitudes, exact at 0, +-1 beyond 4, NaN kept.
TEST(Edges, Float32ErfIsWithinTwoUlpOfLibm) {
  std::vector<float> xs;
  for (int i = -600000; i <= 600000; ++i) xs.push_back(static_cast<float>(i * 1e-5));
  for (double v = 1e-30; v < 1; v *= 1.01) xs.push_back(static_cast<float>(-v));
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  const int64_t n = static_cast<int64_t>(xs.size());
  const std::vector<float> got = braid::erf(braid::tensor(xs, {n})).to_vector<float>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::erf(static_cast<double>(xs[static_cast<size_t>(i)]));
    const double err = std::fabs(got[static_cast<size_t>(i)] - want) / std::max(std::fabs(want), 1e-38);
    worst = std::max(worst, err);
  }
  EXPECT_LE(worst, 1.2e-7);  // 1 ulp of float32 in relative terms
  const std::vector<float> special =
      braid::erf(braid::tensor(std::vector<float>{0.0f, -0.0f, 4.5f, -7.0f, std::nanf("")}, {5})).to_vector<float>();
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_TRUE(std::signbit(special[1]));
  EXPECT_EQ(special[2], 1.0f);
  EXPECT_EQ(special[3], -1.0f);
  EXPECT_TRUE(std::isnan(special[4]));
}

// The float32 polynomials on strided input go through the same vector kernels in gathered blocks
// (Note [Vector clones]): a transposed tensor gives the bits of its contiguous copy, and every
// value is close to double-precision libm's.
TEST(Edges, StridedTranscendentalsMatchContiguousAndLibm) {
  const int64_t rows = 300, cols = 7;  // over one block of 256 along each strided run
  std::vector<float> xs;
  for (int64_t i = 0; i < rows * cols; ++i) xs.push_back(static_cast<float>(std::sin(0.37 * i) * 9.0));
  const braid::Tensor x = braid::transpose(braid::tensor(xs, {rows, cols}), 0, 1);  // (cols, rows), strided
  ASSERT_FALSE(x.is_contiguous());
  const braid::Tensor xc = braid::contiguous(x);
  struct Case {
    const char* name;
    braid::Tensor (*op)(const braid::Tensor&);
    double (*ref)(double);
  };
  const Case cases[] = {
      {"exp", [](const braid::Tensor& t) { return braid::exp(t); }, [](double v) { return std::exp(v); }},
      {"tanh", [](const braid::Tensor& t) { return braid::tanh(t); }, [](double v) { return std::tanh(v); }},
      {"sigmoid", [](const braid::Tensor& t) { return braid::sigmoid(t); },
       [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"erf", [](const braid::Tensor& t) { return braid::erf(t); }, [](double v) { return std::erf(v); }},
      {"gelu", [](const braid::Tensor& t) { return braid::gelu(t); },
       [](double v) { return v * 0.5 * (1 + std::erf(v / std::sqrt(2.0))); }},
      {"softplus", [](const braid::Tensor& t) { return braid::softplus(t); },
       [](double v) { return std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))); }},
  };
  for (const Case& c : cases) {
    const std::vector<float> strided = braid::contiguous(c.op(x)).to_vector<float>();
    const std::vector<float> plain = c.op(xc).to_vector<float>();
    const std::vector<float> in = xc.to_vector<float>();
    ASSERT_EQ(strided.size(), plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_EQ(strided[i], plain[i]) << c.name << " at " << i;
      const double want = c.ref(in[i]);
      ASSERT_NEAR(plain[i], want, 4e-7 * std::max(1.0, std::fabs(want))) << c.name << "(" << in[i] << ")";
    }
  }
}

// index_select copies whole runs where its index is the same along the innermost axis (rows of an
// embedding table): every element width, along the first and a middle axis, with repeated and
// reversed positions, against the positions written out.
TEST(Edges, IndexSelectRowsMatchThePositions) {
  const int64_t d0 = 5, d1 = 3, d2 = 40;
  std::vector<double> xs;
  for (int64_t i = 0; i < d0 * d1 * d2; ++i) xs.push_back(static_cast<double>(i % 113));
  const std::vector<int64_t> pick{4, 0, 4, 2, 1};
  for (braid::DType t : {braid::kUInt8, braid::kFloat16, braid::kFloat32, braid::kInt64}) {
    const braid::Tensor x = braid::cast(braid::tensor(xs, {d0, d1, d2}), t);
    const braid::Tensor idx = braid::tensor(pick, {5});
    const std::vector<double> rows = braid::index_select(x, 0, idx).to_vector<double>();
    const std::vector<int64_t> mid{2, 2, 0};
    const std::vector<double> cols = braid::index_select(x, 1, braid::tensor(mid, {3})).to_vector<double>();
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 0; j < d1 * d2; ++j)
        ASSERT_EQ(rows[static_cast<size_t>(r * d1 * d2 + j)], xs[static_cast<size_t>(pick[r] * d1 * d2 + j)])
            << braid::dtype_name(t);
    for (int64_t a = 0; a < d0; ++a)
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t k = 0; k < d2; ++k)
          ASSERT_EQ(cols[static_cast<size_t>((a * 3 + r) * d2 + k)],
                    xs[static_cast<size_t>((a * d1 + mid[static_cast<size_t>(r)]) * d2 + k)])
              << braid::dtype_name(t);
  }
}

// Batched products of small matrices read from views (a transposed operand, batch axes permuted so
// that no single batch stride walks them) against the sums written out in double.
TEST(Edges, BatchedSmallProductsOfViewsMatchTheSums) {
  braid::Generator gen(31);
  const braid::Tensor a = braid::randn({2, 3, 5, 4}, braid::kFloat32, &gen);
  const braid::Tensor b_rows = braid::randn({2, 3, 6, 4}, braid::kFloat32, &gen);
  const braid::Tensor b = braid::transpose(b_rows, 2, 3);  // (2, 3, 4, 6), column-major matrices
  const braid::Tensor a_swapped = braid::transpose(braid::randn({3, 2, 5, 4}, braid::kFloat32, &gen), 0, 1);
  for (const braid::Tensor& x : {a, a_swapped}) {
    const std::vector<float> got = braid::matmul(x, b).to_vector<float>();
    const std::vector<float> xv = braid::contiguous(x).to_vector<float>(), bv = braid::contiguous(b).to_vector<float>();
    ASSERT_EQ(got.size(), 2u * 3 * 5 * 6);
    for (int64_t batch = 0; batch < 6; ++batch)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 6; ++j) {
          double want = 0;
          for (int64_t k = 0; k < 4; ++k)
            want += static_cast<double>(xv[static_cast<size_t>((batch * 5 + i) * 4 + k)]) *
                    bv[static_cast<size_t>((batch * 4 + k) * 6 + j)];
          EXPECT_NEAR(got[static_cast<size_t>((batch * 5 + i) * 6 + j)], want, 1e-5 * (1 + std::fabs(want)))
              << "batch " << batch << " (" << i << ", " << j << ")";
        }
  }
}

// exp, tanh and sigmoid in float32 are vectorised polynomials with fused multiply-adds
// (fast_math.h): within the ulp that its header states of double-precision libm over a dense grid.
TEST(Edges, Float32ExpTanhSigmoidAreWithinTheirStatedUlp) {
  struct Case {
    const char* name;
    braid::Tensor (*op)(const braid::Tensor&);
    double (*ref)(double);
    double lo, hi, bound;  // the grid, and the worst relative error allowed
  };
  const Case cases[] = {
      {"exp", [](const braid::Tensor& t) { return braid::exp(t); }, [](double v) { return std::exp(v); }, -87, 88,
       1.2e-7},
      {"tanh", [](const braid::Tensor& t) { return braid::tanh(t); }, [](double v) { return std::tanh(v); }, -12, 12,
       1.7e-7},
      {"sigmoid", [](const braid::Tensor& t) { return braid::sigmoid(t); },
       [](double v) { return 1 / (1 + std::exp(-v)); }, -80, 30, 2.4e-7},
  };
  for (const Case& c : cases) {
    std::vector<float> xs;
    for (int i = 0; i <= 1000000; ++i) xs.push_back(static_cast<float>(c.lo + (c.hi - c.lo) * i / 1e6));
    const int64_t n = static_cast<int64_t>(xs.size());
    const std::vector<float> got = c.op(braid::tensor(xs, {n})).to_vector<float>();
    double worst = 0;
    float at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = c.ref(static_cast<double>(xs[static_cast<size_t>(i)]));
      const double err = std::fabs(got[static_cast<size_t>(i)] - want) / std::max(std::fabs(want), 1e-38);
      if (err > worst) worst = err, at = xs[static_cast<size_t>(i)];
    }
    EXPECT_LE(worst, c.bound) << c.name << " at " << at;
  }
}

// Note [Pow's special cases]: every exponent with a cheaper form than pow equals C's pow at every
// input, signed zeros, infinities, NaN and denormals included, in float32 and float64; the values
// of 0.5 and -0.5 at -0.0 and -inf are where sqrt and pow part (+0 and +inf; +inf and +0).
TEST(Edges, PowSpecialCasesEqualCPow) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> xs = {-inf, -1e30, -2.5, -1.0, -0.0, 0.0, 1e-310, 1e-40, 0.25, 1.0, 2.0, 9.0,
                                  1e30, inf, nan, -1e-310};
  for (braid::DType dtype : {braid::kFloat32, braid::kFloat64}) {
    const braid::Tensor x = braid::tensor(xs, {static_cast<int64_t>(xs.size())}).to(dtype);
    const std::vector<double> in = x.to(braid::kFloat64).to_vector<double>();  // as the dtype holds them
    for (double e : {0.5, -0.5, 2.0, 1.0, -1.0, -2.0, 3.0, 0.0, 1.5}) {
      const std::vector<double> got = braid::pow(x, e).to(braid::kFloat64).to_vector<double>();
      for (size_t i = 0; i < in.size(); ++i) {
        double want = std::pow(in[i], e);
        if (dtype == braid::kFloat32) want = static_cast<double>(std::pow(static_cast<float>(in[i]), static_cast<float>(e)));
        const bool same = (std::isnan(want) && std::isnan(got[i])) ||
                          (want == got[i] && std::signbit(want) == std::signbit(got[i])) ||
                          (std::isfinite(want) && std::fabs(got[i] - want) <= 4e-7 * std::fabs(want));
        EXPECT_TRUE(same) << braid::dtype_name(dtype) << ": " << in[i] << " ** " << e << " = " << got[i]
                          << ", C's pow gives " << want;
      }
    }
  }
}
