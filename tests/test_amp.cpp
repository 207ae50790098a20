// Mixed precision: autocast and GradScaler. Autocast's products are compared with float64 loops over
// operands rounded by an arithmetic rounding written here (round_to: frexp, ldexp and nearbyint,
// independent of the library's bit-level conversions), within the bound of float32 accumulation;
// the gradients with the closed forms of the same rounded-operand products. The scaler's sequences
// are PyTorch's rules written out by hand, its skipped steps are compared byte for byte, and a
// bfloat16 and a float16 training run must track float32 training of the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "braid/amp.h"
#include "braid/checkpoint.h"
#include "braid/conv.h"
#include "braid/nn/nn.h"
#include "braid/optim.h"
#include "braid/random.h"
#include "test_device.h"

namespace braid {
namespace {

constexpr double kU = 0x1p-24;  // float32's unit roundoff

/// x rounded to nearest even with low's precision: 8 significant bits (bfloat16) or 11 (float16),
/// subnormals below 2^-126 or 2^-14. Values are in range (no overflow in these tests).
double round_to(double x, DType low) {
  if (x == 0 || !std::isfinite(x)) return x;
  const int bits = low == kBFloat16 ? 8 : 11, emin = low == kBFloat16 ? -126 : -14;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 1, emin) - (bits - 1));
  return std::nearbyint(x / ulp) * ulp;  // the default rounding mode: ties to even
}

std::vector<double> host(const Tensor& t) { return t.contiguous().to_vector<double>(); }

std::vector<double> rounded(const std::vector<double>& v, DType low) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(v[i], low);
  return r;
}

/// A float64 reference value and the sum of the magnitudes of its terms, which bounds the error of
/// float32 accumulation: |got - value| <= (terms + 2) u abs.
struct Ref {
  std::vector<double> value, abs;
  explicit Ref(size_t n = 0) : value(n, 0.0), abs(n, 0.0) {}
  void add(size_t i, double term) {
    value[i] += term;
    abs[i] += std::fabs(term);
  }
};

/// The dtype autocast's products return on the device under test inside a scope of low (Note
/// [Autocast]): low where the device keeps half activations, float32 on the CPU.
DType amp_out(DType low) { return test::autocast_keeps_half(test::test_device()) ? low : kFloat32; }

/// A gradient of dtype `out` as the engine hands it on: rounded to out when out is half.
std::vector<double> as_grad_of(const std::vector<double>& g, DType out) { return out == kFloat32 ? g : rounded(g, out); }

/// Checks got (of dtype out) against ref within float32 accumulation of `terms` products, plus, for a
/// half out, its roundings to it (half an ulp each: 2^-8 relative for bfloat16, 2^-11 for float16).
/// rounded_to: the dtype the values may have passed through (a float32 gradient that a GPU's half
/// convolution kernel wrote in half first: Note [Half outputs] in src/ops/conv.cpp).
void expect_close(const Tensor& got, const Ref& ref, int64_t terms, const std::string& what, DType out = kFloat32,
                  DType rounded_to = kFloat32) {
  ASSERT_EQ(got.dtype(), out) << what;
  const std::vector<double> g = host(got);
  ASSERT_EQ(g.size(), ref.value.size()) << what;
  const DType r = out == kFloat32 ? rounded_to : out;
  const double half_ulp = r == kBFloat16 ? 0x1p-8 : r == kFloat16 ? 0x1p-11 : 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    double bound = static_cast<double>(terms + 2) * kU * ref.abs[i] + 1e-30;
    bound += 2 * half_ulp * ref.abs[i];  // up to two roundings: a product's, then a bias sum's
    ASSERT_LE(std::fabs(g[i] - ref.value[i]), bound) << what << " element " << i;
  }
}

/// The largest difference between got and plain values, relative to the float32 bound: autocast's
/// rounding must show far above it.
double excess_over_bound(const Tensor& got, const Ref& plain, int64_t terms) {
  const std::vector<double> g = host(got);
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i)
    worst = std::max(worst, std::fabs(g[i] - plain.value[i]) / ((terms + 2) * kU * plain.abs[i] + 1e-30));
  return worst;
}

/// C (batch, m, n) = A (batch, m, k) B (k, n), row-major.
Ref ref_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t batch, int64_t m, int64_t k,
               int64_t n) {
  Ref c(static_cast<size_t>(batch * m * n));
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t l = 0; l < k; ++l) c.add((s * m + i) * n + j, a[(s * m + i) * k + l] * b[l * n + j]);
  return c;
}

const DType kLowTypes[] = {kBFloat16, kFloat16};

// ---- autocast ----

TEST(Autocast, MatmulRoundsOperandsAndAccumulatesInFloat32) {
  Generator gen(1);
  const int64_t batch = 3, m = 4, k = 37, n = 6;
  Tensor a = randn({batch, m, k}, kFloat32, &gen), w = randn({n, k}, kFloat32, &gen);
  // b = w^T, a transposed view (as linear passes it), shared by every batch (a stride-0 batch axis).
  std::vector<double> bt(static_cast<size_t>(k * n)), wv = host(w);
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j) bt[l * n + j] = wv[j * k + l];
  const Ref plain = ref_matmul(host(a), bt, batch, m, k, n);
  for (DType low : kLowTypes) {
    const std::string what = dtype_name(low);
    Tensor c;
    {
      autocast guard(low);
      c = matmul(a, w.mT());
    }
    EXPECT_EQ(c.shape(), (Shape{batch, m, n}));
    expect_close(c, ref_matmul(rounded(host(a), low), rounded(bt, low), batch, m, k, n), k, what, amp_out(low));
    EXPECT_GT(excess_over_bound(c, plain, k), 20.0) << what << ": the operands were not rounded";
    // 1-d operands take the same path.
    Tensor v;
    {
      autocast guard(low);
      v = matmul(a.select(0, 0).select(0, 0), w.mT());
    }
    EXPECT_EQ(v.shape(), (Shape{n}));
    expect_close(v, ref_matmul(rounded(host(a.select(0, 0).select(0, 0)), low), rounded(bt, low), 1, 1, k, n), k,
                 what + " 1-d", amp_out(low));
  }
}

TEST(Autocast, LinearGradientsReachFloat32ParametersInFloat32) {
  Generator gen(2);
  const int64_t m = 6, k = 19, n = 5;
  Tensor x = randn({m, k}, kFloat32, &gen).set_requires_grad();
  Tensor w = randn({n, k}, kFloat32, &gen).set_requires_grad();
  Tensor b = randn({n}, kFloat32, &gen).set_requires_grad();
  Tensor g = randn({m, n}, kFloat32, &gen);  // dL/dy
  const std::vector<double> xv = host(x), wv = host(w), bv = host(b), gv = host(g);
  for (DType low : kLowTypes) {
    const std::string what = dtype_name(low);
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    Tensor y;
    {
      autocast guard(low);
      y = nn::linear(x, w, b);
    }
    y.backward(g);
    const std::vector<double> xr = rounded(xv, low), wr = rounded(wv, low), gr = as_grad_of(gv, amp_out(low));
    // With half outputs the bias is rounded too and added to the rounded product (PyTorch rounds it).
    const std::vector<double> br = amp_out(low) == kFloat32 ? bv : rounded(bv, low);
    Ref ry(static_cast<size_t>(m * n)), rdx(static_cast<size_t>(m * k)), rdw(static_cast<size_t>(n * k));
    Ref rdb(static_cast<size_t>(n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        ry.add(i * n + j, br[j]);
        rdb.add(j, gr[i * n + j]);
        for (int64_t l = 0; l < k; ++l) {
          ry.add(i * n + j, xr[i * k + l] * wr[j * k + l]);
          rdx.add(i * k + l, gr[i * n + j] * wr[j * k + l]);  // dx = G W_r
          rdw.add(j * k + l, gr[i * n + j] * xr[i * k + l]);  // dW = G^T x_r
        }
      }
    // The half output rounds twice (the product, then the sum with the bias).
    expect_close(y, ry, k + 1, what + " y", amp_out(low));
    if (amp_out(low) != kFloat32) {  // the bias gradient is summed in half, as PyTorch's
      EXPECT_EQ(b.grad().dtype(), kFloat32);
      const std::vector<double> db = host(b.grad());
      for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(db[j], rdb.value[j], 0x1p-7 * rdb.abs[j] + 1e-6) << what << " db";
    }
    // float32 gradients of the rounded-operand product: the float32 bound, 2^13 (float16) to 2^16
    // (bfloat16) times tighter than a gradient that passed through the half dtype.
    expect_close(x.grad(), rdx, n, what + " dx");
    expect_close(w.grad(), rdw, m, what + " dW");
    if (amp_out(low) == kFloat32) expect_close(b.grad(), rdb, m, what + " db");
  }
}

/// A 2-d convolution in float64: y = conv(x, w) + bias, and the gradients of sum(y * g).
struct ConvCase {
  int64_t n, c, h, wd, o, kh, kw, stride, pad, dil, groups;
};

struct ConvRef {
  Ref y, dx, dw;
  int64_t oh, ow;
};

ConvRef ref_conv2d(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& bias, const std::vector<double>& g) {
  const int64_t oh = (k.h + 2 * k.pad - k.dil * (k.kh - 1) - 1) / k.stride + 1;
  const int64_t ow = (k.wd + 2 * k.pad - k.dil * (k.kw - 1) - 1) / k.stride + 1;
  const int64_t cg = k.c / k.groups, og = k.o / k.groups;
  ConvRef r{Ref(static_cast<size_t>(k.n * k.o * oh * ow)), Ref(x.size()), Ref(w.size()), oh, ow};
  for (int64_t b = 0; b < k.n; ++b)
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t z = 0; z < ow; ++z) {
          const size_t yi = static_cast<size_t>(((b * k.o + o) * oh + y) * ow + z);
          if (!bias.empty()) r.y.add(yi, bias[o]);
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = y * k.stride - k.pad + i * k.dil, ix = z * k.stride - k.pad + j * k.dil;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.wd) continue;
                const int64_t c = o / og * cg + ci;
                const size_t xi = static_cast<size_t>(((b * k.c + c) * k.h + iy) * k.wd + ix);
                const size_t wi = static_cast<size_t>(((o * cg + ci) * k.kh + i) * k.kw + j);
                r.y.add(yi, x[xi] * w[wi]);
                r.dx.add(xi, g[yi] * w[wi]);
                r.dw.add(wi, g[yi] * x[xi]);
              }
        }
  return r;
}

TEST(Autocast, Conv2dOnEveryPathMatchesTheRoundedReferenceWithFloat32Gradients) {
  const ConvCase cases[] = {
      {2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1},  // im2col and one GEMM
      {2, 4, 5, 5, 6, 1, 1, 1, 0, 1, 1},  // 1x1: a GEMM per sample
      {2, 4, 6, 7, 8, 3, 3, 2, 1, 1, 4},  // depthwise (groups = C), two filters per channel
      {2, 4, 9, 8, 6, 3, 3, 2, 2, 2, 2},  // grouped, strided, dilated
  };
  Generator gen(3);
  for (const ConvCase& k : cases) {
    Tensor x = randn({k.n, k.c, k.h, k.wd}, kFloat32, &gen).set_requires_grad();
    Tensor w = randn({k.o, k.c / k.groups, k.kh, k.kw}, kFloat32, &gen).set_requires_grad();
    Tensor bias = randn({k.o}, kFloat32, &gen).set_requires_grad();
    const std::vector<double> xv = host(x), wv = host(w), bv = host(bias);
    const int64_t terms = k.c / k.groups * k.kh * k.kw;
    for (DType low : kLowTypes) {
      const std::string what = std::string(dtype_name(low)) + " groups=" + std::to_string(k.groups) +
                               " k=" + std::to_string(k.kh) + " stride=" + std::to_string(k.stride);
      x.set_grad(Tensor());
      w.set_grad(Tensor());
      Tensor y;
      {
        autocast guard(low);
        y = conv2d(x, w, bias, {k.stride, k.stride}, {k.pad, k.pad}, {k.dil, k.dil}, k.groups);
      }
      Tensor g = randn(y.shape(), kFloat32, &gen);
      const ConvRef r = ref_conv2d(k, rounded(xv, low), rounded(wv, low), bv, as_grad_of(host(g), amp_out(low)));
      ASSERT_EQ(y.shape(), (Shape{k.n, k.o, r.oh, r.ow})) << what;
      expect_close(y, r.y, terms + 1, what + " y", amp_out(low));
      EXPECT_GT(excess_over_bound(y, ref_conv2d(k, xv, wv, bv, host(g)).y, terms + 1), 20.0) << what;
      y.backward(g);
      expect_close(x.grad(), r.dx, k.o * k.kh * k.kw, what + " dx", kFloat32, amp_out(low));
      expect_close(w.grad(), r.dw, k.n * r.oh * r.ow, what + " dw", kFloat32, amp_out(low));
      EXPECT_EQ(bias.grad().dtype(), kFloat32);
    }
  }
}

TEST(Autocast, Conv1dAndConvTranspose2dAreAutocastToo) {
  Generator gen(4);
  const DType low = kBFloat16;
  {  // conv1d is conv2d over a height of 1
    const ConvCase k{2, 3, 1, 11, 5, 1, 3, 1, 1, 1, 1};
    Tensor x = randn({2, 3, 11}, kFloat32, &gen), w = randn({5, 3, 3}, kFloat32, &gen);
    Tensor y;
    {
      autocast guard(low);
      y = conv1d(x, w, Tensor(), 1, 1);
    }
    // conv1d pads only along its one axis: pad the reference's width, not its height of 1.
    ConvCase k2 = k;
    k2.pad = 0;
    std::vector<double> xp(static_cast<size_t>(2 * 3 * 13), 0.0), xv = rounded(host(x), low);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t i = 0; i < 11; ++i) xp[static_cast<size_t>(r * 13 + i + 1)] = xv[static_cast<size_t>(r * 11 + i)];
    k2.wd = 13;
    const ConvRef r = ref_conv2d(k2, xp, rounded(host(w), low), {}, std::vector<double>(2 * 5 * 11, 0.0));
    expect_close(y, r.y, 9, "conv1d", amp_out(low));
  }
  {  // conv_transpose2d: each input element scatters w times it into the output
    const int64_t n = 2, c = 4, h = 5, o = 3, kk = 3, s = 2, p = 1, op = 1;
    const int64_t oh = (h - 1) * s - 2 * p + kk + op;
    Tensor x = randn({n, c, h, h}, kFloat32, &gen).set_requires_grad();
    Tensor w = randn({c, o, kk, kk}, kFloat32, &gen).set_requires_grad();
    Tensor y;
    {
      autocast guard(low);
      y = conv_transpose2d(x, w, Tensor(), {s, s}, {p, p}, {op, op});
    }
    ASSERT_EQ(y.shape(), (Shape{n, o, oh, oh}));
    Tensor g = randn(y.shape(), kFloat32, &gen);
    y.backward(g);
    const std::vector<double> xr = rounded(host(x), low), wr = rounded(host(w), low),
                              gv = as_grad_of(host(g), amp_out(low));
    Ref ry(static_cast<size_t>(n * o * oh * oh)), rdx(xr.size()), rdw(wr.size());
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t iy = 0; iy < h; ++iy)
          for (int64_t ix = 0; ix < h; ++ix)
            for (int64_t oc = 0; oc < o; ++oc)
              for (int64_t i = 0; i < kk; ++i)
                for (int64_t j = 0; j < kk; ++j) {
                  const int64_t yy = iy * s - p + i, yx = ix * s - p + j;
                  if (yy < 0 || yy >= oh || yx < 0 || yx >= oh) continue;
                  const size_t yi = static_cast<size_t>(((b * o + oc) * oh + yy) * oh + yx);
                  const size_t xi = static_cast<size_t>(((b * c + ci) * h + iy) * h + ix);
                  const size_t wi = static_cast<size_t>(((ci * o + oc) * kk + i) * kk + j);
                  ry.add(yi, xr[xi] * wr[wi]);
                  rdx.add(xi, gv[yi] * wr[wi]);
                  rdw.add(wi, gv[yi] * xr[xi]);
                }
    expect_close(y, ry, c * kk * kk, "conv_transpose2d y", amp_out(low));
    expect_close(x.grad(), rdx, o * kk * kk, "conv_transpose2d dx", kFloat32, amp_out(low));
    expect_close(w.grad(), rdw, n * h * h, "conv_transpose2d dw", kFloat32, amp_out(low));
  }
}

TEST(Autocast, Float64AndIntegerOperandsAreUntouched) {
  Generator gen(5);
  Tensor a64 = randn({4, 9}, kFloat64, &gen), b64 = randn({9, 3}, kFloat64, &gen);
  Tensor a32 = randn({4, 9}, kFloat32, &gen);
  Tensor ai = randint(-5, 5, {4, 9}, kInt64, &gen), bi = randint(-5, 5, {9, 3}, kInt64, &gen);
  Tensor x64 = randn({1, 2, 5, 5}, kFloat64, &gen), w64 = randn({3, 2, 3, 3}, kFloat64, &gen);
  const Tensor plain64 = matmul(a64, b64), mixed = matmul(a32, b64), ints = matmul(ai, bi);
  const Tensor conv64 = conv2d(x64, w64, Tensor(), {1, 1}, {1, 1});
  autocast guard(kBFloat16);
  const Tensor in64 = matmul(a64, b64), in_mixed = matmul(a32, b64), in_ints = matmul(ai, bi);
  const Tensor in_conv = conv2d(x64, w64, Tensor(), {1, 1}, {1, 1});
  EXPECT_EQ(in64.dtype(), kFloat64);
  EXPECT_EQ(in_mixed.dtype(), kFloat64);
  EXPECT_EQ(in_ints.dtype(), kInt64);
  EXPECT_EQ(host(in64), host(plain64));
  EXPECT_EQ(host(in_mixed), host(mixed));
  EXPECT_EQ(host(in_ints), host(ints));
  EXPECT_EQ(host(in_conv), host(conv64));
  // The integer product against a closed form: sum_l a_il b_lj exactly.
  const std::vector<double> av = host(ai), bv = host(bi), cv = host(in_ints);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      double s = 0;
      for (int64_t l = 0; l < 9; ++l) s += av[i * 9 + l] * bv[l * 3 + j];
      EXPECT_EQ(cv[i * 3 + j], s);
    }
}

TEST(Autocast, ScopesNestRestoreAndStayOnTheirThread) {
  Generator gen(6);
  Tensor a = randn({3, 40}, kFloat32, &gen), b = randn({40, 2}, kFloat32, &gen);
  const Ref plain = ref_matmul(host(a), host(b), 1, 3, 40, 2);
  const Ref bf = ref_matmul(rounded(host(a), kBFloat16), rounded(host(b), kBFloat16), 1, 3, 40, 2);
  const Ref fp = ref_matmul(rounded(host(a), kFloat16), rounded(host(b), kFloat16), 1, 3, 40, 2);
  const std::vector<double> outside = host(matmul(a, b));
  expect_close(matmul(a, b), plain, 40, "before any scope");
  EXPECT_FALSE(autocast_enabled());
  {
    autocast outer(kBFloat16);
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), kBFloat16);
    expect_close(matmul(a, b), bf, 40, "bfloat16 scope", amp_out(kBFloat16));
    {
      autocast inner(kFloat16);
      EXPECT_EQ(autocast_dtype(), kFloat16);
      expect_close(matmul(a, b), fp, 40, "float16 inside bfloat16", amp_out(kFloat16));
      {
        autocast off(kFloat16, false);
        EXPECT_FALSE(autocast_enabled());
        EXPECT_EQ(host(matmul(a, b)), outside) << "enabled = false";
      }
      EXPECT_TRUE(autocast_enabled());
    }
    EXPECT_EQ(autocast_dtype(), kBFloat16);
    expect_close(matmul(a, b), bf, 40, "bfloat16 again after the inner scopes", amp_out(kBFloat16));
    bool other_thread_enabled = true;
    std::thread([&] { other_thread_enabled = autocast_enabled(); }).join();
    EXPECT_FALSE(other_thread_enabled) << "autocast is per thread";
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(host(matmul(a, b)), outside) << "after the scope";
  EXPECT_THROW({ autocast bad(kFloat32); }, TypeError);
}

TEST(Autocast, OtherOpsAreUnchangedAndHalfOperandsKeepTheirDtypeOutsideTheScope) {
  Generator gen(7);
  Tensor x = randn({5, 8}, kFloat32, &gen), y = randn({5, 8}, kFloat32, &gen);
  auto others = [&] { return host(softmax(relu(x + y) * 1.5, -1) + tanh(x).sum({0}, true) + nn::mse_loss(x, y)); };
  const std::vector<double> outside = others();
  {
    autocast guard(kFloat16);
    EXPECT_EQ(others(), outside);
  }
  // Outside a scope a product of half tensors accumulates in float32 and returns their dtype, as in
  // PyTorch (Note [Half arithmetic]); inside, autocast's rule for the device.
  Tensor xh = x.to(kBFloat16), wh = y.to(kBFloat16).mT();
  const Ref ref = ref_matmul(rounded(host(x), kBFloat16), rounded(host(y.mT()), kBFloat16), 1, 5, 8, 5);
  expect_close(matmul(xh, wh), ref, 8, "bfloat16 operands outside a scope", kBFloat16);
  autocast guard(kBFloat16);
  expect_close(matmul(xh, wh), ref, 8, "bfloat16 operands", amp_out(kBFloat16));
}

TEST(Autocast, BackwardInsideTheScopeGivesTheSameGradients) {
  // A pipeline's train_step runs backward inside the caller's scope: the formulas turn it off.
  auto grads = [](bool backward_inside) {
    manual_seed(8);
    auto m = std::make_shared<nn::Sequential>();
    m->add(std::make_shared<nn::Conv2d>(2, 3, 3, 1, 1)).add(std::make_shared<nn::ReLU>());
    m->add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(3 * 4 * 4, 2));
    Generator gen(9);
    Tensor x = randn({3, 2, 4, 4}, kFloat32, &gen);
    Tensor loss;
    {
      autocast guard(kBFloat16);
      loss = square(m->forward(x)).sum();
      if (backward_inside) loss.backward();
    }
    if (!backward_inside) loss.backward();
    std::vector<double> all;
    for (const Tensor& p : m->parameters()) {
      const std::vector<double> g = host(p.grad());
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  EXPECT_EQ(grads(true), grads(false));
}

// ---- GradScaler ----

/// p's gradient set to v (one value per element).
void set_grad(Tensor& p, const std::vector<float>& v) { p.set_grad(tensor(v, p.shape())); }

/// The bytes of t's values, read through a host copy.
std::vector<unsigned char> bytes(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  std::vector<unsigned char> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(GradScaler, DefaultsAreTorchs) {
  optim::GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  const auto st = s.state_dict();
  EXPECT_EQ(st.at("growth_factor"), 2.0);
  EXPECT_EQ(st.at("backoff_factor"), 0.5);
  EXPECT_EQ(st.at("growth_interval"), 2000.0);
  EXPECT_EQ(st.at("_growth_tracker"), 0.0);
}

TEST(GradScaler, ScaleBacksOffOnInfOrNanAndGrowsAfterCleanSteps) {
  Tensor p = zeros({3}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 0.5});
  optim::GradScaler s({.init_scale = 8, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // Clean, clean, inf, then three clean (growth), clean, NaN, -inf.
  const std::vector<double> bad = {0, 0, inf, 0, 0, 0, 0, nan, -inf};
  const std::vector<bool> stepped = {true, true, false, true, true, true, true, false, false};
  const std::vector<double> scale = {8, 8, 4, 4, 4, 8, 8, 4, 2};
  const std::vector<int64_t> tracker = {1, 2, 0, 1, 2, 0, 1, 0, 0};
  for (size_t i = 0; i < bad.size(); ++i) {
    set_grad(p, {1, static_cast<float>(bad[i]), 2});
    EXPECT_EQ(s.step(opt), stepped[i]) << "iteration " << i;
    s.update();
    EXPECT_EQ(s.get_scale(), scale[i]) << "iteration " << i;
    EXPECT_EQ(s.growth_tracker(), tracker[i]) << "iteration " << i;
  }
  // Growth keeps the scale finite in float32: 2^127 * 2 would overflow, so it stays.
  optim::GradScaler top({.init_scale = 0x1p127, .growth_interval = 1});
  set_grad(p, {1, 1, 1});
  top.step(opt);
  top.update();
  EXPECT_EQ(top.get_scale(), 0x1p127);
  top.update(3.0);
  EXPECT_EQ(top.get_scale(), 3.0);
}

TEST(GradScaler, UnscaleDividesOnceAndStepUsesTheUnscaledGradients) {
  Tensor p = tensor(std::vector<float>{1, 2, 3}, {3}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 0.25});
  optim::GradScaler s;
  // loss = sum(c * p): the scaled gradient is 65536 c, exactly (a power of two).
  Tensor c = tensor(std::vector<float>{0.5f, -3.0f, 0.125f}, {3});
  s.scale((c * p).sum()).backward();
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{32768, -196608, 8192}));
  s.unscale_(opt);
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{0.5f, -3.0f, 0.125f}));
  EXPECT_THROW(s.unscale_(opt), ValueError);
  EXPECT_TRUE(s.step(opt));  // does not unscale again
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1 - 0.125f, 2 + 0.75f, 3 - 0.03125f}));
  EXPECT_THROW(s.step(opt), ValueError);
  EXPECT_THROW(s.unscale_(opt), ValueError);
  s.update();
  EXPECT_THROW(s.update(), ValueError);  // nothing recorded since
  EXPECT_EQ(s.get_scale(), 65536.0);
}

/// Steps opt through scaler with the gradient of sum((model(x) - y)^2) over a fixed batch, times
/// poison in one element of the first parameter's gradient when poison is not 1.
bool scaled_step(nn::Module& m, optim::Optimizer& opt, optim::GradScaler& scaler, double poison = 1) {
  Generator gen(10);
  Tensor x = randn({4, 3}, kFloat32, &gen), y = randn({4, 2}, kFloat32, &gen);
  opt.zero_grad();
  scaler.scale(square(m.forward(x) - y).sum()).backward();
  if (poison != 1) m.parameters()[0].grad().view({-1}).narrow(0, 1, 1).mul_(poison);
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

TEST(GradScaler, SkippedStepLeavesWeightsAndOptimizerStateBitwiseUnchanged) {
  for (const std::string kind : {"SGD", "Adam"}) {
    manual_seed(11);
    nn::Linear m(3, 2);
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == "SGD")
      opt = std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    else
      opt = std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 0.01});
    optim::GradScaler scaler;
    ASSERT_TRUE(scaled_step(m, *opt, scaler));
    ASSERT_TRUE(scaled_step(m, *opt, scaler));  // state now holds momentum / moments
    auto snapshot = [&] {
      std::vector<std::vector<unsigned char>> out;
      for (const Tensor& p : m.parameters()) out.push_back(bytes(p));
      const optim::OptimizerState st = opt->state_dict();
      for (const auto& [k, t] : st.tensors) out.push_back(bytes(t));
      for (const auto& [k, v] : st.scalars) {
        out.emplace_back(sizeof v);
        std::memcpy(out.back().data(), &v, sizeof v);
      }
      return out;
    };
    const auto before = snapshot();
    ASSERT_FALSE(before.empty());
    for (double poison : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      EXPECT_FALSE(scaled_step(m, *opt, scaler, poison)) << kind;
      EXPECT_EQ(snapshot(), before) << kind << " poison " << poison;
    }
    EXPECT_EQ(scaler.get_scale(), 65536.0 / 4) << kind;
    EXPECT_TRUE(scaled_step(m, *opt, scaler)) << kind;
    EXPECT_NE(snapshot(), before) << kind;
  }
}

TEST(GradScaler, CleanStepsEqualUnscaledFloat32Steps) {
  // Scaling by a power of two and back is exact in float32, short of overflow or underflow.
  auto train = [](bool scaled) {
    manual_seed(12);
    nn::Linear m(3, 2);
    optim::Adam opt(m.parameters(), {.lr = 0.01});
    optim::GradScaler scaler({.enabled = scaled});
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(scaled_step(m, opt, scaler));
    EXPECT_EQ(scaler.get_scale(), scaled ? 65536.0 : 1.0);
    std::vector<double> all;
    for (const Tensor& p : m.parameters()) {
      const std::vector<double> v = host(p);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const std::vector<double> plain = train(false), scaled = train(true);
  ASSERT_EQ(plain.size(), scaled.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(scaled[i], plain[i], 1e-7 * std::fabs(plain[i])) << i;
}

TEST(GradScaler, StateDictAndCheckpointRoundTrip) {
  Tensor p = zeros({2}).set_requires_grad();
  optim::SGD opt({p}, {.lr = 0.1});
  optim::GradScaler a({.init_scale = 1024, .growth_factor = 3, .backoff_factor = 0.25, .growth_interval = 4});
  for (float g : {1.0f, 1.0f, std::numeric_limits<float>::infinity(), 1.0f, 1.0f}) {
    set_grad(p, {g, 1});
    a.step(opt);
    a.update();
  }
  EXPECT_EQ(a.get_scale(), 256.0);
  EXPECT_EQ(a.growth_tracker(), 2);
  Checkpoint ckpt;
  store_state(ckpt, "scaler.", a);
  const std::string path = ::testing::TempDir() + "/braid_amp_scaler.ckpt";
  save_checkpoint(path, ckpt);
  optim::GradScaler b;
  restore_state(load_checkpoint(path), "scaler.", b);
  std::remove(path.c_str());
  EXPECT_EQ(b.state_dict(), a.state_dict());
  // Both continue alike: two more clean steps reach the interval of 4 and grow by 3.
  for (optim::GradScaler* s : {&a, &b})
    for (int i = 0; i < 2; ++i) {
      set_grad(p, {1, 1});
      s->step(opt);
      s->update();
    }
  EXPECT_EQ(a.get_scale(), 768.0);
  EXPECT_EQ(b.get_scale(), 768.0);
  // Broken states are refused before anything changes.
  optim::GradScaler c;
  auto st = a.state_dict();
  st.erase("_growth_tracker");
  EXPECT_THROW(c.load_state_dict(st), ValueError);
  EXPECT_THROW(c.load_state_dict({}), ValueError);
  st = a.state_dict();
  st["backoff_factor"] = 2;
  EXPECT_THROW(c.load_state_dict(st), ValueError);
  EXPECT_EQ(c.get_scale(), 65536.0);
  // A disabled scaler has no state and is a plain step.
  optim::GradScaler off({.enabled = false});
  EXPECT_TRUE(off.state_dict().empty());
  EXPECT_EQ(off.get_scale(), 1.0);
  set_grad(p, {std::numeric_limits<float>::infinity(), 1});
  EXPECT_TRUE(off.step(opt));
  EXPECT_TRUE(std::isinf(p.to_vector<float>()[0]));
}

}  // namespace
}  // namespace braid
