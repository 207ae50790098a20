// Channels-last activations in inference (Note [Channels-last activations in inference] in
// src/ops/conv.cpp): the layout predicate, elementwise ops keeping their first operand's layout, and
// a residual block run without gradients (its wide convolutions then hand channels-last outputs to
// each other) giving bit for bit what the same block gives with gradients on, where everything is
// NCHW. On the device under test (tests/test_device.h); the family also runs with oneDNN off, where
// every output stays NCHW and the values must still agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "braid/braid.h"
#include "braid/config.h"
#include "test_device.h"
#include "ops/fused.h"

namespace braid {
namespace {

// x's values in memory order NHWC, viewed as (N, C, H, W): what a channels-last tensor is.
Tensor channels_last_copy(const Tensor& x) { return contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}); }

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

TEST(ChannelsLast, Predicate) {
  Tensor x = randn({2, 3, 4, 5});
  EXPECT_FALSE(x.is_channels_last());
  Tensor cl = channels_last_copy(x);
  EXPECT_TRUE(cl.is_channels_last());
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(same_values(cl, x));
  // One channel, or one pixel: both layouts are the same memory.
  EXPECT_TRUE(randn({2, 1, 4, 5}).is_channels_last());
  EXPECT_TRUE(randn({2, 7, 1, 1}).is_channels_last());
  EXPECT_FALSE(randn({2, 3, 4}).is_channels_last());
  EXPECT_FALSE(x.permute({0, 1, 3, 2}).is_channels_last());
}

TEST(ChannelsLast, ElementwiseOpsKeepTheFirstOperandsLayout) {
  Generator g(3);
  Tensor a = randn({2, 8, 5, 6}, kFloat32, &g), b = randn({2, 8, 5, 6}, kFloat32, &g);
  Tensor bias = randn({1, 8, 1, 1}, kFloat32, &g);
  Tensor a_cl = channels_last_copy(a);
  const Tensor r = relu(a_cl), s = a_cl + b, t = b + a_cl, u = a_cl * bias, v = bias * a_cl;
  for (const Tensor* y : {&r, &s, &u, &v}) EXPECT_TRUE(y->is_channels_last() && !y->is_contiguous());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(same_values(r, relu(a)));
  EXPECT_TRUE(same_values(s, a + b));
  EXPECT_TRUE(same_values(t, b + a));
  EXPECT_TRUE(same_values(u, a * bias));
  EXPECT_TRUE(same_values(v, bias * a));
  // Reductions, reshapes and copies read it through its strides.
  EXPECT_TRUE(same_values(mean(a_cl, {2, 3}, true), mean(a, {2, 3}, true)));
  EXPECT_TRUE(same_values(a_cl.reshape({2, -1}), a.reshape({2, -1})));
}

// relu(conv(relu(conv(x))) + x) with 3x1 convolutions of 32 channels: the kind whose kernels
// prefer channels-last where oneDNN is built in, run in a ChannelsLastGuard as the ONNX executor
// runs inference. (3x3 ones of stride 1 would take Winograd's kernels there, whose sums differ from
// the direct kernels' by rounding: Note [Winograd convolutions in inference].)
TEST(ChannelsLast, ResidualBlockWithoutGradientsIsTheBlockWithThem) {
  Generator g(5);
  Tensor x = randn({2, 32, 9, 9}, kFloat32, &g);
  Tensor w1 = randn({32, 32, 3, 1}, kFloat32, &g) * 0.1, w2 = randn({32, 32, 3, 1}, kFloat32, &g) * 0.1;
  Tensor b1 = randn({32}, kFloat32, &g), b2 = randn({32}, kFloat32, &g);
  auto block = [&](const Tensor& in, Tensor* inner) {
    *inner = relu(conv2d(in, w1, b1, {1, 1}, {1, 0}));
    return relu(conv2d(*inner, w2, b2, {1, 1}, {1, 0}) + in);
  };
  Tensor inner_grad, inner_free;
  Tensor xg = x.detach();
  xg.set_requires_grad();
  const Tensor with_grads = block(xg, &inner_grad);
  EXPECT_TRUE(inner_grad.is_contiguous()) << "training keeps NCHW";
  Tensor without, plain_inner;
  {
    NoGradGuard no_grad;
    (void)block(x, &plain_inner);  // outside a ChannelsLastGuard: NCHW in, NCHW out, as in PyTorch
    ChannelsLastGuard prefer;
    without = block(x, &inner_free);
  }
  EXPECT_TRUE(plain_inner.is_contiguous());
  EXPECT_FALSE(ChannelsLastGuard::active());
  EXPECT_TRUE(same_values(without, with_grads.detach()));
  EXPECT_TRUE(same_values(inner_free, inner_grad.detach()));
  const char* onednn = std::getenv("BRAID_ONEDNN");
#ifdef BRAID_HAVE_DNNL
  const bool expect_cl = test::runs_cpu_conv_kernels(x.device());
#else
  const bool expect_cl = false;
#endif
  if (expect_cl && !(onednn && std::string(onednn) == "0")) {
    EXPECT_TRUE(inner_free.is_channels_last() && !inner_free.is_contiguous());
    EXPECT_TRUE(without.is_channels_last() && !without.is_contiguous());
  } else {
    EXPECT_TRUE(without.is_contiguous());
  }
  // A model's backward is unchanged: the gradient still flows through the NCHW block.
  sum(with_grads).backward();
  EXPECT_TRUE(xg.grad().defined());
}

TEST(ChannelsLast, AChannelsLastInputGivesAChannelsLastOutput) {
  Generator g(7);
  Tensor x = randn({1, 32, 8, 8}, kFloat32, &g), w = randn({32, 32, 3, 1}, kFloat32, &g) * 0.1;  // not Winograd's
  Tensor bias = randn({32}, kFloat32, &g);
  NoGradGuard no_grad;
  const Tensor want = conv2d(x, w, bias, {1, 1}, {1, 0});
  EXPECT_TRUE(want.is_contiguous());
  const Tensor got = conv2d(channels_last_copy(x), w, bias, {1, 1}, {1, 0});
  EXPECT_TRUE(same_values(got, want));
#ifdef BRAID_HAVE_DNNL
  const char* onednn = std::getenv("BRAID_ONEDNN");
  if (test::runs_cpu_conv_kernels(x.device()) && !(onednn && std::string(onednn) == "0")) {
    EXPECT_TRUE(got.is_channels_last() && !got.is_contiguous());
  }
#endif
}

// A network's stem (Note [A stem convolution on NCHW input] in src/backend/cpu/conv.cpp): an NCHW
// image of 3 channels into 16 or 8 channels, HardSwish after, in a ChannelsLastGuard as the ONNX
// executor runs it. The output is channels-last and equals the convolution summed in float64 by the
// definition, to float32 rounding; the same holds without the guard (NCHW out).
TEST(ChannelsLast, AStemOnAnNchwImageGivesAChannelsLastOutput) {
  for (const int64_t c_out : {16, 8, 12}) {
    Generator g(11);
    // Above oneDNN's size threshold (BRAID_ONEDNN_MIN_MACS) at every c_out: 3x3, stride 2, padding 1.
    const int64_t n = 4, c = 3, h = 71, wd = 66, oh = 36, ow = 33;
    Tensor x = randn({n, c, h, wd}, kFloat32, &g), w = randn({c_out, c, 3, 3}, kFloat32, &g) * 0.3;
    Tensor bias = randn({c_out}, kFloat32, &g);
    const std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = bias.to_vector<float>();
    std::vector<double> want(static_cast<size_t>(n * c_out * oh * ow));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t o = 0; o < c_out; ++o)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            double acc = bv[static_cast<size_t>(o)];
            for (int64_t ci = 0; ci < c; ++ci)
              for (int64_t ki = 0; ki < 3; ++ki)
                for (int64_t kj = 0; kj < 3; ++kj) {
                  const int64_t r = i * 2 - 1 + ki, q = j * 2 - 1 + kj;
                  if (r < 0 || r >= h || q < 0 || q >= wd) continue;
                  acc += static_cast<double>(xv[static_cast<size_t>(((b * c + ci) * h + r) * wd + q)]) *
                         wv[static_cast<size_t>(((o * c + ci) * 3 + ki) * 3 + kj)];
                }
            want[static_cast<size_t>(((b * c_out + o) * oh + i) * ow + j)] = acc * std::clamp(acc + 3, 0.0, 6.0) / 6;
          }
    NoGradGuard no_grad;
    const Tensor plain = detail::conv2d_activation(x, w, bias, {2, 2}, {1, 1}, {1, 1}, 1, "hardswish");
    Tensor guarded;
    {
      ChannelsLastGuard prefer;
      guarded = detail::conv2d_activation(x, w, bias, {2, 2}, {1, 1}, {1, 1}, 1, "hardswish");
    }
    for (const Tensor* y : {&plain, static_cast<const Tensor*>(&guarded)}) {
      ASSERT_EQ(y->shape(), (Shape{n, c_out, oh, ow})) << c_out;
      const std::vector<float> got = y->to_vector<float>();
      for (size_t k = 0; k < want.size(); ++k)
        ASSERT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << "c_out " << c_out << " at " << k;
    }
    EXPECT_TRUE(plain.is_contiguous());
#ifdef BRAID_HAVE_DNNL
    const char* onednn = std::getenv("BRAID_ONEDNN");
    if (test::runs_cpu_conv_kernels(x.device()) && !(onednn && std::string(onednn) == "0")) {
      EXPECT_TRUE(guarded.is_channels_last() && !guarded.is_contiguous()) << c_out;
    }
#endif
  }
}

// Channels-last parts join into a channels-last result, along the channels as along the rows, with
// the values of the NCHW concat.
TEST(ChannelsLast, ConcatKeepsTheLayout) {
  Generator g(10);
  const Tensor a = randn({2, 3, 4, 5}, kFloat32, &g), b = randn({2, 5, 4, 5}, kFloat32, &g),
               c = randn({2, 3, 2, 5}, kFloat32, &g);
  const Tensor channels = concat({channels_last_copy(a), channels_last_copy(b)}, 1);
  EXPECT_TRUE(channels.is_channels_last() && !channels.is_contiguous());
  EXPECT_TRUE(same_values(contiguous(channels), concat({a, b}, 1)));
  const Tensor rows = concat({channels_last_copy(a), c}, 2);  // the first part's layout
  EXPECT_TRUE(rows.is_channels_last() && !rows.is_contiguous());
  EXPECT_TRUE(same_values(contiguous(rows), concat({a, c}, 2)));
  EXPECT_TRUE(concat({a, b}, 1).is_contiguous());
}

// A transposed convolution whose stride is its kernel (Note [Transposed convolution without
// overlap]) keeps a channels-last input so in inference, with the values of the closed form
// y[n, o, i kh + a, j kw + b] = bias[o] + sum_c x[n, c, i, j] w[c, o, a, b] (summed here in double),
// and gives NCHW where a gradient is recorded.
TEST(ChannelsLast, ATiledTransposedConvolutionKeepsTheLayout) {
  Generator g(9);
  const int64_t n = 2, c = 6, h = 3, wd = 5, o = 4, kh = 2, kw = 3;
  const Tensor x = randn({n, c, h, wd}, kFloat32, &g), w = randn({c, o, kh, kw}, kFloat32, &g),
               bias = randn({o}, kFloat32, &g);
  const std::vector<float> xs = x.to_vector<float>(), ws = w.to_vector<float>(), bs = bias.to_vector<float>();
  Tensor got;
  {
    NoGradGuard no_grad;
    got = conv_transpose2d(channels_last_copy(x), w, bias, {kh, kw});
  }
  EXPECT_TRUE(got.is_channels_last() && !got.is_contiguous());
  ASSERT_EQ(got.shape(), (Shape{n, o, h * kh, wd * kw}));
  const std::vector<float> ys = contiguous(got).to_vector<float>();
  for (int64_t s = 0; s < n; ++s)
    for (int64_t q = 0; q < o; ++q)
      for (int64_t y = 0; y < h * kh; ++y)
        for (int64_t z = 0; z < wd * kw; ++z) {
          double want = bs[static_cast<size_t>(q)];
          for (int64_t k = 0; k < c; ++k)
            want += static_cast<double>(xs[static_cast<size_t>(((s * c + k) * h + y / kh) * wd + z / kw)]) *
                    ws[static_cast<size_t>(((k * o + q) * kh + y % kh) * kw + z % kw)];
          ASSERT_NEAR(ys[static_cast<size_t>(((s * o + q) * h * kh + y) * wd * kw + z)], want,
                      1e-5 * (1 + std::fabs(want)));
        }
  Tensor xg = x.detach();
  xg.set_requires_grad();
  const Tensor recorded = conv_transpose2d(xg, w, bias, {kh, kw});
  EXPECT_TRUE(recorded.is_contiguous());
  EXPECT_TRUE(same_values(recorded.detach(), contiguous(got)));
}

// Max pooling keeps a channels-last input so (where the backend pools that layout) with the NCHW
// kernel's values bit for bit: windows clipped by padding, 2x2 and 3x3 windows, NaN, and ties of
// zeros of both signs (the first tap in the window's order wins, as there).
TEST(ChannelsLast, MaxPoolingKeepsTheLayoutAndTheValues) {
  Generator g(9);
  Tensor x = randn({2, 5, 9, 11}, kFloat32, &g);
  std::vector<float> v = x.to_vector<float>();
  v[3] = NAN;
  for (size_t i = 40; i < 60; ++i) v[i] = i % 2 ? 0.0f : -0.0f;
  x = tensor(v, {2, 5, 9, 11});
  const Tensor x_cl = channels_last_copy(x);
  NoGradGuard no_grad;
  for (auto [k, s, p] : {std::tuple{3, 2, 1}, std::tuple{2, 2, 0}, std::tuple{3, 1, 1}}) {
    SCOPED_TRACE("kernel " + std::to_string(k) + " stride " + std::to_string(s) + " pad " + std::to_string(p));
    const Tensor want = max_pool2d(x, {k, k}, {s, s}, {p, p});
    const Tensor got = max_pool2d(x_cl, {k, k}, {s, s}, {p, p});
    ASSERT_EQ(got.shape(), want.shape());
    const std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(b[i])) {
        ASSERT_TRUE(std::isnan(a[i])) << i;
      } else {
        ASSERT_EQ(a[i], b[i]) << i;
        ASSERT_EQ(std::signbit(a[i]), std::signbit(b[i])) << i;
      }
    }
    if (test::runs_cpu_fused_kernels(x.device())) {
      EXPECT_TRUE(got.is_channels_last() && !got.is_contiguous());
    }
    // And the closed form, a loop here: the max of each window's elements inside the input.
    const int64_t oh = got.shape()[2], ow = got.shape()[3];
    for (int64_t plane = 0; plane < 10; ++plane)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          float m = -INFINITY;
          bool nan = false;
          for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t y = oy * s - p + i, xx = ox * s - p + j;
              if (y < 0 || y >= 9 || xx < 0 || xx >= 11) continue;
              const float e = v[static_cast<size_t>((plane * 9 + y) * 11 + xx)];
              nan = nan || std::isnan(e);
              m = std::max(m, e);
            }
          const float at = a[static_cast<size_t>((plane * oh + oy) * ow + ox)];
          if (nan) {
            ASSERT_TRUE(std::isnan(at));
          } else {
            ASSERT_EQ(at, m) << "plane " << plane << " (" << oy << ", " << ox << ")";
          }
        }
  }
}

}  // namespace
}  // namespace braid
