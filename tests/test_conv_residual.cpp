// conv2d_activation with a residual added before the activation (Note [Residual as a post-op] in
// src/backend/cpu/conv.cpp), against the float64 composition of braid's ops.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "braid/config.h"
#include "gradcheck.h"
#include "test_device.h"
#include "ops/fused.h"

namespace braid {
namespace {

// Note [Residual as a post-op]: a residual added before the activation, fused (the suite sends every
// float32 convolution to oneDNN), against the float64 composition; in NCHW and channels-last, into
// new memory or (channels-last) into the residual's own when it is given up; a residual that
// broadcasts, or that is the input's own memory, is added after; with gradients recording it is
// the composition.
TEST(ConvActivation, ResidualBeforeTheActivationIsTheAddThenTheActivation) {
  Generator gen(23);
  const Tensor x = randn({2, 8, 9, 10}, kFloat32, &gen), b = randn({16}, kFloat32, &gen);
  const Tensor w = randn({16, 8, 3, 3}, kFloat32, &gen, 0, 0.3), r = randn({2, 16, 9, 10}, kFloat32, &gen);
  const Tensor z = conv2d(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), {1, 1}, {1, 1});
  const Tensor want = relu(z + r.to(kFloat64));
  const auto fused = [&](const Tensor& xin, const Tensor& res, bool writable) {
    return detail::conv2d_activation(xin, w, b, {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0, res, writable);
  };
  const auto close = [](const Tensor& got, const Tensor& ref) { return allclose(got.to(kFloat64), ref, 1e-5, 1e-5); };
  NoGradGuard no_grad;
  EXPECT_TRUE(close(fused(x, r, false), want));
  // Bit for bit the unfused Add and Relu after the same float32 convolution.
  const Tensor unfused = relu(conv2d(x, w, b, {1, 1}, {1, 1}) + r);
  EXPECT_TRUE(equal(fused(x, r, false), unfused));
  // Given up, in NCHW: oneDNN's kernel writes a blocked layout here, so the Add runs after it.
  EXPECT_TRUE(equal(fused(x, r.clone(), true), unfused));
  // Channels-last activations, as the ONNX executor runs them: given up, the result is written
  // into the residual's memory.
  {
    ChannelsLastGuard cl;
    const Tensor xc = x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    Tensor rc = r.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
    const Tensor kept = fused(xc, rc, false);
    EXPECT_TRUE(equal(kept, unfused));
    EXPECT_TRUE(equal(rc, r)) << "a residual not given up is left as it was";
    const Tensor in_place = fused(xc, rc, true);
    EXPECT_TRUE(equal(in_place, unfused));
    // Where oneDNN's kernels run (the CPU and the shadow device, unless turned off) the epilogue
    // is fused, on channels-last activations, into the residual's memory.
    const char* onednn = std::getenv("BRAID_ONEDNN");
#ifdef BRAID_HAVE_DNNL
    const bool fuses =
        test::runs_cpu_conv_kernels(x.device()) && !(onednn && std::string(onednn) == "0");
#else
    const bool fuses = false;
#endif
    if (fuses) {
      EXPECT_TRUE(kept.is_channels_last());
      EXPECT_EQ(in_place.storage(), rc.storage());
    }
  }
  // A residual that broadcasts (one value per channel) is added after the convolution.
  const Tensor per_channel = randn({1, 16, 1, 1}, kFloat32, &gen);
  EXPECT_TRUE(close(fused(x, per_channel, true), relu(z + per_channel.to(kFloat64))));
  // The input as its own residual, even when given up, is not overwritten while it is read.
  const Tensor square = randn({1, 16, 6, 6}, kFloat32, &gen);
  const Tensor w16 = randn({16, 16, 3, 3}, kFloat32, &gen, 0, 0.2);
  const Tensor before = square.clone();
  const Tensor self =
      detail::conv2d_activation(square, w16, Tensor(), {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0, square, true);
  EXPECT_TRUE(equal(square, before));
  EXPECT_TRUE(
      close(self, relu(conv2d(before.to(kFloat64), w16.to(kFloat64), Tensor(), {1, 1}, {1, 1}) + before.to(kFloat64))));
}

TEST(ConvActivation, ResidualWithGradientsRecordingIsTheComposition) {
  Generator gen(24);
  const Tensor x = randn({1, 4, 6, 6}, kFloat64, &gen), r = randn({1, 6, 6, 6}, kFloat64, &gen);
  Tensor w = randn({6, 4, 3, 3}, kFloat64, &gen, 0, 0.3).set_requires_grad(true);
  const Tensor y = detail::conv2d_activation(x, w, Tensor(), {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0, r, true);
  ASSERT_TRUE(y.requires_grad());
  EXPECT_TRUE(allclose(y.detach(), relu(conv2d(x, w.detach(), Tensor(), {1, 1}, {1, 1}) + r), 1e-12, 1e-12));
  sum(y).backward();
  Tensor w2 = w.detach().clone().set_requires_grad(true);
  sum(relu(conv2d(x, w2, Tensor(), {1, 1}, {1, 1}) + r)).backward();
  EXPECT_TRUE(allclose(w.grad(), w2.grad(), 1e-12, 1e-12));
}

// Note [Winograd convolutions in inference]: a dense 3x3 convolution of stride 1 over 64 channels in
// and out on channels-last activations (oneDNN's Winograd kernels where the CPU has AVX-512, else its
// direct ones), with and without a bias, the residual (kept and given up) and the activation, at
// batch 1 and 4 (F(2x2,3x3) and F(4x4,3x3)), against the float64 composition.
TEST(ConvActivation, WinogradGeometriesMatchFloat64) {
  Generator gen(25);
  for (int64_t n : {1, 4}) {
    const Tensor x = relu(randn({n, 64, 10, 12}, kFloat32, &gen));  // post-ReLU activations, as in a ResNet
    const Tensor w = randn({64, 64, 3, 3}, kFloat32, &gen, 0, 0.06), b = randn({64}, kFloat32, &gen, 0, 0.1);
    const Tensor r = randn({n, 64, 10, 12}, kFloat32, &gen);
    const Tensor z = conv2d(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), {1, 1}, {1, 1});
    const auto close = [](const Tensor& got, const Tensor& ref) {
      return allclose(contiguous(got).to(kFloat64), ref, 1e-5, 1e-5);
    };
    NoGradGuard no_grad;
    ChannelsLastGuard cl;
    const auto last = [](const Tensor& t) { return t.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2}); };
    const Tensor xc = last(x);
    const Tensor plain = conv2d(xc, w, b, {1, 1}, {1, 1});
    EXPECT_TRUE(close(plain, z)) << n;
    EXPECT_TRUE(close(detail::conv2d_activation(xc, w, Tensor(), {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0),
                      relu(conv2d(x.to(kFloat64), w.to(kFloat64), Tensor(), {1, 1}, {1, 1}))))
        << n;
    Tensor rc = last(r);
    const Tensor kept = detail::conv2d_activation(xc, w, b, {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0, rc, false);
    EXPECT_TRUE(close(kept, relu(z + r.to(kFloat64)))) << n;
    EXPECT_TRUE(equal(rc, r)) << "a residual not given up is left as it was";
    const Tensor in_place = detail::conv2d_activation(xc, w, b, {1, 1}, {1, 1}, {1, 1}, 1, "relu", 0, 0, 1, 0, rc, true);
    EXPECT_TRUE(close(in_place, relu(z + r.to(kFloat64)))) << n;
  }
}

}  // namespace
}  // namespace braid
