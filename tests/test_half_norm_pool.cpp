// BatchNorm and pooling of float16/bfloat16 activations (autocast's half activations on a GPU, Note
// [Autocast] in src/ops/autocast.cpp) against the same ops on the widened float32 values, rounded
// once to the half dtype (Note [Half arithmetic] in src/backend/backend.h). A training BatchNorm
// keeps float32 statistics and parameters whichever path computes it: a backend's half passes, or
// the float32 node on a float32 copy where the backend declines them (the CPU, the shadow device),
// which gives these values exactly; on a GPU the statistics may differ in float32's last bits, so
// y and dL/dx are held to a half ulp. Both paths are held too to an independent float64 BatchNorm
// written out here from its definition. Pooling goes to the backend's primitives in the half dtype
// (a maximum exact, an average summed in float32 and rounded once; a max-pooling gradient that
// several windows send to one element sums in float32 and is rounded once): exact on every device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "braid/braid.h"
#include "braid/nn/layers.h"
#include "core/internal.h"
#include "test_device.h"

namespace braid {
namespace {

const DType kHalfTypes[] = {kFloat16, kBFloat16};

// Seeded values in [lo, hi) of shape, in dtype t, on the device under test.
Tensor drawn(const Shape& shape, DType t, unsigned seed, double lo = -3, double hi = 3) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  unsigned state = seed * 2654435761u + 12345u;
  for (double& x : v) {
    state = state * 1664525u + 1013904223u;
    x = lo + (hi - lo) * static_cast<double>(state >> 8) / static_cast<double>(1u << 24);
  }
  return tensor(v, shape, test::test_device()).to(t);
}

std::vector<double> host(const Tensor& t) { return t.to(kFloat64).cpu().to_vector<double>(); }

// got (any dtype) against want within rtol * |want| + atol, NaN matching NaN.
void expect_near(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = host(got), w = host(want);
  int reported = 0;
  for (size_t i = 0; i < g.size() && reported < 5; ++i) {
    const bool ok = (std::isnan(g[i]) && std::isnan(w[i])) || g[i] == w[i] ||
                    std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i]);
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", want " << w[i];
      ++reported;
    }
  }
}

// A training BatchNorm of an (N, C, H, W) x in float64, from the definition and not from braid: per
// channel the batch mean and the biased variance, x^ = (x - mean) / sqrt(var + eps), y = w x^ + b;
// for the upstream gradient g the closed forms dL/db = sum g, dL/dw = sum g x^ and
// dL/dx = w / sqrt(var + eps) (g - mean(g) - x^ mean(g x^)), sums and means over N, H and W.
struct BatchNormReference {
  Tensor y, dx, dweight, dbias;  // float64, on the CPU
};

BatchNormReference batch_norm_reference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& g,
                                        double eps) {
  const Shape& s = x.shape();
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  const std::vector<double> xv = host(x), gv = host(g), w = host(weight), b = host(bias);
  std::vector<double> y(xv.size()), dx(xv.size()), dw(static_cast<size_t>(c)), db(static_cast<size_t>(c));
  const double count = static_cast<double>(n * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto each = [&](const auto& f) {  // f(element index) over the channel's elements
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < hw; ++j) f(static_cast<size_t>((i * c + ch) * hw + j));
    };
    const size_t k = static_cast<size_t>(ch);
    double mean = 0, var = 0;
    each([&](size_t e) { mean += xv[e]; });
    mean /= count;
    each([&](size_t e) { var += (xv[e] - mean) * (xv[e] - mean); });
    var /= count;
    const double inv = 1 / std::sqrt(var + eps);
    each([&](size_t e) {
      y[e] = w[k] * (xv[e] - mean) * inv + b[k];
      db[k] += gv[e];
      dw[k] += gv[e] * (xv[e] - mean) * inv;
    });
    each([&](size_t e) { dx[e] = w[k] * inv * (gv[e] - db[k] / count - (xv[e] - mean) * inv * dw[k] / count); });
  }
  return {tensor(y, s, Device::cpu()), tensor(dx, s, Device::cpu()), tensor(dw, {c}, Device::cpu()),
          tensor(db, {c}, Device::cpu())};
}

// A half ulp of dtype t, relative: exact (0) on devices whose half BatchNorm is the float32 node.
double half_rtol(DType t) {
  if (test::test_device().type != DeviceType::CUDA) return 0;
  return t == kFloat16 ? 1e-3 : 8e-3;
}

TEST(HalfBatchNorm, TrainingStepIsTheFloat32StepRoundedOnce) {
  for (DType t : kHalfTypes)
    for (bool channels_last : {false, true}) {
      const std::string what = dtype_name(t) + (channels_last ? " channels-last" : "");
      Tensor xh = drawn({4, 3, 5, 6}, t, 1, 2, 6);  // off 0, so the statistics are worth keeping in float32
      if (channels_last) xh = xh.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
      const Tensor up = drawn({4, 3, 5, 6}, t, 2);  // the upstream gradient, a half tensor
      Tensor xf = xh.to(kFloat32);
      xh.set_requires_grad(true);
      xf.set_requires_grad(true);
      nn::BatchNorm2d bh(3), bf(3);
      {
        NoGradGuard no_grad;  // the same parameters on both, not the defaults
        for (nn::BatchNorm2d* b : {&bh, &bf}) {
          b->named_parameters()[0].second.copy_(drawn({3}, kFloat32, 3));
          b->named_parameters()[1].second.copy_(drawn({3}, kFloat32, 4));
        }
      }
      const Tensor yh = bh.forward(xh), yf = bf.forward(xf);
      ASSERT_EQ(yh.dtype(), t) << what;
      expect_near(yh, yf.to(t), half_rtol(t), 0, what + " y");
      (yh * up).sum().backward();
      (yf * up.to(kFloat32)).sum().backward();
      ASSERT_EQ(xh.grad().dtype(), t) << what;
      const double grad_atol = half_rtol(t) == 0 ? 0 : 1e-2;  // dL/dx cancels: room near 0
      expect_near(xh.grad(), xf.grad().to(t), half_rtol(t), grad_atol, what + " dL/dx");
      const double stat_rtol = half_rtol(t) == 0 ? 0 : 1e-5;
      for (size_t i = 0; i < 2; ++i) {
        const Tensor ph = bh.named_parameters()[i].second, pf = bf.named_parameters()[i].second;
        ASSERT_EQ(ph.grad().dtype(), kFloat32) << what;
        expect_near(ph.grad(), pf.grad(), stat_rtol, stat_rtol, what + " " + bh.named_parameters()[i].first + " grad");
      }
      // The float64 reference. y and dL/dx are a float32 computation rounded once to t: within the
      // rounding, u |want| (u = 2^-11 for float16, 2^-8 for bfloat16: half of t's ulp relative), plus the
      // float32 computation's own error. Here |x| <= 6, |w|, |b|, |g| <= 3, channels of 120 elements,
      // var ~ 1.3: float32 sums of 120 terms err by at most 120 * 2^-24 = 7.2e-6 of their magnitude, so
      // the mean by <= 4.3e-5, x^ by <= 4e-5 and y by <= 1.2e-4 < 2e-4; dL/dx's means of g (|g| <= 3) and
      // g x^ (<= 6, times |x^| <= 2) by <= 2e-5 and 9e-5, times w / sqrt(var + eps) <= 2.7: < 5e-4. The
      // parameters' gradients stay float32 sums of 120 terms: 7.2e-6 of sum |g| <= 360 (2.6e-3) for
      // dL/db, and for dL/dw that of sum |g x^| <= 720 plus sum |g| times x^'s 4e-5: 5.2e-3 + 1.4e-2 < 2e-2
      // (worst cases; seen on the CPU: y and dL/dx within 0.95 of their bounds, dL/dw off by 4e-6, dL/db
      // exact). The same reference with the unbiased variance misses each of y, dL/dx and dL/dw by 7x-48x.
      const double u = t == kFloat16 ? 0x1p-11 : 0x1p-8;
      const BatchNormReference ref =
          batch_norm_reference(xh, bh.named_parameters()[0].second, bh.named_parameters()[1].second, up, bh.eps());
      expect_near(yh, ref.y, u, 2e-4, what + " y against float64");
      expect_near(xh.grad(), ref.dx, u, 5e-4, what + " dL/dx against float64");
      expect_near(bh.named_parameters()[0].second.grad(), ref.dweight, 0, 2e-2, what + " dL/dweight against float64");
      expect_near(bh.named_parameters()[1].second.grad(), ref.dbias, 0, 2.6e-3, what + " dL/dbias against float64");
      const auto bufs_h = bh.named_buffers(), bufs_f = bf.named_buffers();
      ASSERT_EQ(bufs_h.size(), bufs_f.size());
      for (size_t i = 0; i < bufs_h.size(); ++i) {
        EXPECT_EQ(bufs_h[i].second.dtype(), bufs_f[i].second.dtype()) << what << " " << bufs_h[i].first;
        expect_near(bufs_h[i].second, bufs_f[i].second, stat_rtol, stat_rtol, what + " " + bufs_h[i].first);
      }
      // Inference with the running statistics: channel_affine on the half x, rounded once.
      bh.eval();
      bf.eval();
      NoGradGuard no_grad;
      expect_near(bh.forward(xh.detach()), bf.forward(xf.detach()).to(t), half_rtol(t), 0, what + " eval y");
    }
}

// The CPU's passes take float32 and float64 only: the mixed dtypes (half x, float32 statistics) are
// declined, not misread, and batch_norm_training takes the float32 node (the test above).
TEST(HalfBatchNorm, TheCpuPassesDeclineHalfOperands) {
  detail::FusedKernels& f = detail::backend_for(Device::cpu()).fused();
  const auto fresh = [](const Shape& s, DType t) { return detail::new_tensor(s, t, Device::cpu()); };
  for (DType t : kHalfTypes) {
    const Tensor x = drawn({2, 3, 4}, t, 8).cpu(), g = drawn({2, 3, 4}, t, 9).cpu();
    const Tensor m = drawn({3}, kFloat32, 10).cpu(), s = drawn({3}, kFloat32, 11).cpu();
    EXPECT_FALSE(f.channel_moments(x, fresh({3}, kFloat32), fresh({3}, kFloat32))) << dtype_name(t);
    EXPECT_FALSE(f.channel_grad_sums(g, x, m, fresh({3}, kFloat32), fresh({3}, kFloat32))) << dtype_name(t);
    EXPECT_FALSE(f.channel_affine(x, s, m, Tensor(), Tensor(), Tensor(), fresh({2, 3, 4}, t))) << dtype_name(t);
    EXPECT_FALSE(f.channel_affine(x, s, m, g, m, s, fresh({2, 3, 4}, t))) << dtype_name(t);
  }
}

struct PoolCase {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode;
};

// Overlapping windows (stride under the kernel), so that a max-pooling gradient sums several
// contributions into one element, padding, dilation and ceil mode.
const PoolCase kPoolCases[] = {{{3, 3}, {1, 1}, {1, 1}, {1, 1}, false},
                               {{3, 2}, {2, 1}, {1, 0}, {1, 1}, true},
                               {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
                               {{3, 3}, {1, 2}, {0, 1}, {2, 1}, false}};

TEST(HalfPooling, IsTheFloat32PoolingRoundedOnce) {
  for (DType t : kHalfTypes)
    for (const PoolCase& c : kPoolCases)
      for (bool max : {true, false}) {
        if (!max && (c.dilation[0] != 1 || c.dilation[1] != 1)) continue;  // average pooling has no dilation
        const std::string what = dtype_name(t) + (max ? " max_pool2d k" : " avg_pool2d k") +
                                 std::to_string(c.kernel[0]) + " s" + std::to_string(c.stride[0]) +
                                 (c.ceil_mode ? " ceil" : "");
        Tensor xh = drawn({2, 3, 7, 8}, t, 5, -2, 2);
        {
          NoGradGuard no_grad;
          xh = where(lt(abs(xh), full_like(xh, 0.25)), round(xh), xh);  // ties for the maximum
        }
        Tensor xf = xh.to(kFloat32);
        xh.set_requires_grad(true);
        xf.set_requires_grad(true);
        const auto pool = [&](const Tensor& x) {
          return max ? max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode)
                     : avg_pool2d(x, c.kernel, c.stride, c.padding, c.ceil_mode, /*count_include_pad=*/c.ceil_mode);
        };
        const Tensor yh = pool(xh), yf = pool(xf);
        ASSERT_EQ(yh.dtype(), t) << what;
        expect_near(yh, yf.to(t), 0, 0, what);
        const Tensor up = drawn(yh.shape(), t, 6);
        (yh * up).sum().backward();
        (yf * up.to(kFloat32)).sum().backward();
        ASSERT_EQ(xh.grad().dtype(), t) << what;
        expect_near(xh.grad(), xf.grad().to(t), 0, 0, what + " gradient");
      }
}

// Channels-last half input in inference (the backend's channels-last max pooling where it takes
// half, else the contiguous primitive): the same maxima.
TEST(HalfPooling, ChannelsLastMaxPoolingInInference) {
  NoGradGuard no_grad;
  for (DType t : kHalfTypes) {
    const Tensor x = drawn({2, 7, 8, 3}, t, 7).permute({0, 3, 1, 2});
    ASSERT_TRUE(x.is_channels_last());
    const Tensor y = max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    ASSERT_EQ(y.dtype(), t);
    expect_near(y.contiguous(), max_pool2d(x.to(kFloat32).contiguous(), {3, 3}, {2, 2}, {1, 1}).to(t), 0, 0,
                dtype_name(t) + " channels-last");
  }
}

}  // namespace
}  // namespace braid
