// Channels-last training (Note [Channels-last training] in src/ops/conv.cpp). Where a device's
// convolutions prefer NHWC in training (CUDA's half convolutions under autocast; the shadow device
// with BRAID_SHADOW_CAPS=cuda, which applies that rule on the CPU's kernels and composites), a small
// ResNet-style step under autocast keeps its activations channels-last from the first convolution
// on: convolution (with a bias, and a depthwise and a strided 1x1 one), BatchNorm, ReLU, max
// pooling, a residual add. Its values and gradients must be those of the same step with
// braid::set_channels_last(false), where every tensor is NCHW. Where the CPU's kernels and
// composites run (the CPU, the shadow device) the two runs read the same numbers through other
// strides, and BatchNorm's channel sums accumulate in double in either order: they agree bit for
// bit. On a GPU, cuDNN's NHWC and NCHW algorithms sum in different orders: a few half roundings.
// On the CPU, training stays NCHW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "braid/amp.h"
#include "braid/braid.h"
#include "test_device.h"

namespace braid {
namespace {

bool nhwc(const Tensor& t) { return t.dim() == 4 && !t.is_contiguous() && t.is_channels_last(); }

struct Step {
  std::vector<std::pair<std::string, Tensor>> activations, grads;
};

// One step of the small network on the device under test, with channels-last allowed or not.
Step run_step(DType half, bool channels_last) {
  set_channels_last(channels_last);
  const Device d = test::test_device();
  Generator gen(7);
  const auto param = [&](const Shape& s, double scale) {
    Tensor p = randn(s, kFloat32, &gen, 0.0, scale, d);
    p.set_requires_grad(true);
    return p;
  };
  Tensor x = param({4, 3, 12, 12}, 1.0);
  Tensor w1 = param({8, 3, 3, 3}, 0.4), b1 = param({8}, 0.1), g1 = param({8}, 1.0), be1 = param({8}, 0.1);
  Tensor w2 = param({8, 8, 3, 3}, 0.2), g2 = param({8}, 1.0), be2 = param({8}, 0.1);
  Tensor wd = param({8, 1, 3, 3}, 0.3), w3 = param({16, 8, 1, 1}, 0.3);
  const Tensor probe3 = randn({4, 16, 3, 3}, kFloat32, &gen, 0.0, 1.0, d);
  const Tensor probe_d = randn({4, 8, 6, 6}, kFloat32, &gen, 0.0, 1.0, d);
  Step s;
  Tensor loss;
  {
    autocast scope(half);
    const Tensor a1 = conv2d(x, w1, b1, {1, 1}, {1, 1});
    const Tensor r1 = relu(batch_norm_training(a1, g1, be1, 1e-5)[0]);
    const Tensor p = max_pool2d(r1, {3, 3}, {2, 2}, {1, 1});  // (4, 8, 6, 6)
    const Tensor a2 = conv2d(p, w2, Tensor(), {1, 1}, {1, 1});
    const Tensor r2 = relu(batch_norm_training(a2, g2, be2, 1e-5)[0] + p);
    const Tensor a3 = conv2d(r2, w3, Tensor(), {2, 2}, {0, 0});            // 1x1, stride 2: (4, 16, 3, 3)
    const Tensor ad = conv2d(r2, wd, Tensor(), {1, 1}, {1, 1}, {1, 1}, 8);  // depthwise
    loss = (a3 * probe3).sum() + (ad * probe_d).sum();
    s.activations = {{"conv1", a1}, {"relu1", r1}, {"max_pool", p}, {"conv2", a2},
                     {"residual relu", r2}, {"conv 1x1 stride 2", a3}, {"depthwise", ad}};
  }
  loss.backward();
  s.grads = {{"x", x},   {"w1", w1}, {"b1", b1}, {"bn1 weight", g1}, {"bn1 bias", be1}, {"w2", w2},
             {"bn2 weight", g2}, {"bn2 bias", be2}, {"depthwise weight", wd}, {"w3", w3}};
  for (auto& [name, t] : s.grads) t = t.grad();
  set_channels_last(true);
  return s;
}

std::vector<double> host(const Tensor& t) { return t.to(kFloat64).cpu().contiguous().to_vector<double>(); }

// got against want: each element within rtol of the larger of |want| and the tensor's largest
// magnitude times a floor (a gradient near zero inherits its neighbours' rounding), or equal.
void expect_close(const Tensor& got, const Tensor& want, double rtol, double floor, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host(got), w = host(want);
  double top = 0;
  for (double v : w) top = std::max(top, std::fabs(v));
  int reported = 0;
  for (size_t i = 0; i < g.size() && reported < 5; ++i)
    if (g[i] != w[i] && std::fabs(g[i] - w[i]) > rtol * std::max(std::fabs(w[i]), floor * top)) {
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", want " << w[i];
      ++reported;
    }
}

// Whether the device under test trains convolutions channels-last under autocast: CUDA's rule.
bool trains_channels_last() { return test::autocast_keeps_half(test::test_device()); }

TEST(ChannelsLastTraining, ActivationsStayChannelsLastAndMatchTheNchwStep) {
  for (DType half : {kBFloat16, kFloat16}) {
    const Step cl = run_step(half, true), nchw = run_step(half, false);
    const bool want_cl = trains_channels_last();
    // One rounding of a half value, relative, on a GPU; exact where the CPU's kernels run.
    const double ulp = test::runs_cpu_conv_kernels(test::test_device()) ? 0 : half == kFloat16 ? 1.0 / 1024 : 1.0 / 128;
    for (size_t i = 0; i < cl.activations.size(); ++i) {
      const auto& [name, a] = cl.activations[i];
      const std::string what = dtype_name(half) + " " + name;
      EXPECT_EQ(nhwc(a), want_cl) << what << " layout";
      EXPECT_FALSE(nhwc(nchw.activations[i].second)) << what << " with set_channels_last(false)";
      // On a GPU a sum in another order moves an element by a rounding, and what follows by the
      // like: a few ulps of the tensor's scale.
      expect_close(a, nchw.activations[i].second, 4 * ulp, 0.05, what);
    }
    for (size_t i = 0; i < cl.grads.size(); ++i) {
      const auto& [name, g] = cl.grads[i];
      ASSERT_TRUE(g.defined()) << name;
      EXPECT_EQ(g.dtype(), kFloat32) << name << ": a float32 parameter's gradient";
      // Gradients sum many such products: a few percent of the largest for bfloat16 at most.
      expect_close(g, nchw.grads[i].second, 8 * ulp, 0.05, dtype_name(half) + " gradient of " + name);
    }
  }
}

// conv1d runs as conv2d over a height of 1, but keeps NCHW in training wherever conv2d would go
// channels-last: a 3-d tensor has no channels-last layout, and a strided (N, C, L) output would
// surprise what follows (a view of it, as in PyTorch, where conv1d's output is contiguous).
TEST(ChannelsLastTraining, Conv1dKeepsItsLayout) {
  const Device d = test::test_device();
  Generator gen(11);
  Tensor x = randn({2, 4, 9}, kFloat32, &gen, 0.0, 1.0, d), w = randn({6, 4, 3}, kFloat32, &gen, 0.0, 0.3, d);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor y;
  {
    autocast scope(kBFloat16);
    y = conv1d(x, w, Tensor(), 1, 1);
  }
  EXPECT_TRUE(y.is_contiguous()) << "strides " << shape_str(y.strides());
  EXPECT_EQ(y.shape(), (Shape{2, 6, 9}));
  y.to(kFloat32).sum().backward();
  EXPECT_TRUE(x.grad().defined() && x.grad().shape() == x.shape());
}

}  // namespace
}  // namespace braid
