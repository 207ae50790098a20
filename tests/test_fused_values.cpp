// Every fused CPU kernel equals its composite on the special values: each op that has a fused
// primitive run with it and under CompositeOnly (the op then composes the same result from the
// required primitives, its definition), on inputs holding +-0, +-inf, NaN, subnormals, the largest
// and smallest normal floats and random values. Bit for bit (NaN matching NaN) where the primitive
// promises the composite's bits (elementwise kernels: quantisation, chains, Adam, the channel
// affine); within float32 reassociation, with the same NaN and infinities, where it sums in another
// order (softmax, layer_norm, batch statistics, the squeeze-and-excitation gate).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "braid/braid.h"
#include "ops/fused.h"
#include "braid/conv.h"
#include "braid/optim.h"

using namespace braid;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> special_values(size_t n, uint64_t seed, float scale = 4) {
  std::vector<float> v = {0.0f,  -0.0f, kInf,  -kInf, std::numeric_limits<float>::quiet_NaN(),
                          1e-40f, -1e-40f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                          -std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), 1.0f, -1.0f, 0.5f, -0.5f, 1e30f, -1e30f, 3.0f, -3.0f};
  Generator gen(seed);
  const std::vector<float> r = (randn({static_cast<int64_t>(n)}, kFloat32, &gen) * scale).to_vector<float>();
  for (size_t i = v.size(); i < n; ++i) v.push_back(r[i]);
  v.resize(n);
  return v;
}

Tensor special(const Shape& shape, uint64_t seed, float scale = 4) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return tensor(special_values(static_cast<size_t>(n), seed, scale), shape);
}

// special() without what a sum in another order treats otherwise: the largest finite values (sums of
// them overflow or not by order) and, with finite_only, the infinities and NaN too.
Tensor special_for_sums(const Shape& shape, uint64_t seed, float scale = 4, bool finite_only = false) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v = special_values(static_cast<size_t>(n), seed, scale);
  for (float& f : v)
    if ((finite_only && !std::isfinite(f)) || (std::isfinite(f) && std::fabs(f) > 1e20f)) f = 2.0f;
  return tensor(v, shape);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Fused against composite: bit for bit (tolerance 0), or within tolerance relative to the
// magnitude with NaN and infinities where the other has them.
void expect_same(const std::string& what, const Tensor& fused, const Tensor& composite, double tolerance = 0) {
  ASSERT_EQ(fused.shape(), composite.shape()) << what;
  const std::vector<float> f = contiguous(fused).to(kFloat32).to_vector<float>();
  const std::vector<float> c = contiguous(composite).to(kFloat32).to_vector<float>();
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string where =
        what + ": element " + std::to_string(i) + ": " + std::to_string(f[i]) + " vs " + std::to_string(c[i]);
    if (std::isnan(c[i]) || std::isnan(f[i])) {
      ASSERT_TRUE(std::isnan(c[i]) && std::isnan(f[i])) << where;
    } else if (tolerance == 0 || std::isinf(c[i]) || std::isinf(f[i])) {
      ASSERT_EQ(bits(f[i]), bits(c[i])) << where;
    } else {
      ASSERT_NEAR(f[i], c[i], tolerance * (1 + std::fabs(c[i]))) << where;
    }
  }
}

// op() with the fused kernels and under CompositeOnly.
void expect_definition(const std::string& what, const std::function<Tensor()>& op, double tolerance = 0) {
  NoGradGuard no_grad;
  const Tensor fused = op();
  Tensor composite;
  {
    detail::CompositeOnly guard;
    composite = op();
  }
  expect_same(what, fused, composite, tolerance);
}

}  // namespace

TEST(FusedValues, QuantisationKernelsEqualTheirComposites) {
  const Tensor x = special({4, 50}, 1);
  for (DType q : {kInt8, kUInt8}) {
    const int64_t zero = q == kUInt8 ? 128 : -3;
    expect_definition("quantize", [&] { return quantize(x, 0.05, zero, q).to(kFloat32); });
    expect_definition("fake_quantize", [&] { return fake_quantize(x, 0.05, zero, q); });
    const Tensor qx = quantize(x, 0.05, zero, q);
    expect_definition("dequantize", [&] { return dequantize(qx, 0.05, zero); });
  }
  // dynamic_quantize reads the range: on finite values (a NaN or inf range has no scale).
  std::vector<float> fv = special_values(200, 2);
  for (float& f : fv)
    if (!std::isfinite(f) || std::fabs(f) > 1e3f) f = 0.25f;
  const Tensor finite = tensor(fv, {4, 50});
  expect_definition("dynamic_quantize", [&] { return dynamic_quantize(finite).values.to(kFloat32); });
  expect_definition("aminmax", [&] {
    auto [lo, hi] = aminmax(x);
    return stack({lo, hi}, 0);
  });
  expect_definition("aminmax of finite values", [&] {
    auto [lo, hi] = aminmax(finite);
    return stack({lo, hi}, 0);
  });
}

TEST(FusedValues, ElementwiseChainEqualsItsSteps) {
  const Tensor x = special({2, 3, 40}, 3);
  Generator gen(4);
  ChainStep fq;
  fq.kind = ChainStep::Kind::FakeQuantize;
  fq.scale = 0.1;
  fq.zero = 7;
  fq.qtype = kInt8;
  ChainStep affine;
  affine.kind = ChainStep::Kind::ChannelAffine;
  affine.channel_scale = randn({3}, kFloat32, &gen);
  affine.channel_shift = randn({3}, kFloat32, &gen);
  affine.a = 0;
  ChainStep add;
  add.kind = ChainStep::Kind::Add;
  add.a = 1;
  add.b = ChainStep::kTensor;
  add.operand = special({40}, 5);
  ChainStep mul;
  mul.kind = ChainStep::Kind::Mul;
  mul.a = 2;
  mul.b = ChainStep::kConstant;
  mul.k = -0.0f;
  ChainStep div;
  div.kind = ChainStep::Kind::Div;
  div.a = 0;
  div.b = 3;
  ChainStep gelu_step;
  gelu_step.kind = ChainStep::Kind::Gelu;
  gelu_step.a = 2;
  ChainStep gelu_last;
  gelu_last.kind = ChainStep::Kind::GeluHalfLast;
  gelu_last.a = 5;
  ChainStep sub;
  sub.kind = ChainStep::Kind::Sub;
  sub.a = ChainStep::kConstant;
  sub.k = 1.5f;
  sub.b = 6;
  fq.a = 7;
  const std::vector<ChainStep> steps = {affine, add, mul, div, gelu_step, gelu_last, sub, fq};
  expect_definition("elementwise_chain", [&] { return detail::elementwise_chain(x, steps); });
  // Each unary step straight on the special values.
  for (ChainStep::Kind kind : {ChainStep::Kind::Gelu, ChainStep::Kind::GeluHalfLast}) {
    ChainStep one;
    one.kind = kind;
    one.a = 0;
    expect_definition("elementwise_chain (one GELU step)", [&] { return detail::elementwise_chain(x, {one}); });
  }
}

TEST(FusedValues, AdamStepEqualsTheOptimizersComposite) {
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(amsgrad ? "amsgrad" : "adam");
    const auto run = [&] {
      Tensor p = special({64}, 6).clone();
      p.set_requires_grad(true);
      optim::Adam opt({p}, {.lr = 0.01, .weight_decay = 0.1, .amsgrad = amsgrad});
      for (int step = 0; step < 3; ++step) {
        p.set_grad(special({64}, 7 + step, 2));
        opt.step();
      }
      return p.detach();
    };
    const Tensor fused = run();
    Tensor composite;
    {
      detail::CompositeOnly guard;
      composite = run();
    }
    expect_same("adam_step", fused, composite);
  }
}

TEST(FusedValues, NormalisationKernelsEqualTheirComposites) {
  Generator gen(8);
  const Tensor rows = special({6, 33}, 9);
  expect_definition("softmax", [&] { return softmax(rows, -1); }, 1e-6);
  expect_definition("log_softmax", [&] { return log_softmax(rows, -1); }, 1e-6);
  {  // log_softmax's gradient (Backend::log_softmax_backward_rows) on random rows
    const Tensor x = randn({5, 40}, kFloat32, &gen) * 3.0, weights = randn({5, 40}, kFloat32, &gen);
    auto grad = [&] {
      Tensor xg = x.clone().set_requires_grad(true);
      (log_softmax(xg, -1) * weights).sum().backward();
      return xg.grad();
    };
    const Tensor fused = grad();
    Tensor composite;
    {
      detail::CompositeOnly guard;
      composite = grad();
    }
    expect_same("log_softmax's gradient", fused, composite, 1e-5);
  }
  const Tensor w = randn({33}, kFloat32, &gen), b = randn({33}, kFloat32, &gen);
  expect_definition("layer_norm", [&] { return layer_norm(rows, 1, w, b, 1e-5); }, 1e-5);
  // Rows of finite values but for one special value each: the row's statistics stay finite where
  // the value is (a subnormal, a zero), and turn NaN in both where it is not.
  const Tensor x = special({2, 3, 4, 5}, 10);
  const Tensor scale = randn({3}, kFloat32, &gen), shift = randn({3}, kFloat32, &gen);
  expect_definition("channel_affine", [&] { return channel_affine(x, scale, shift); });
  expect_definition("batch_norm_training", [&] { return batch_norm_training(x, scale, shift, 1e-5)[0]; }, 1e-5);
}

// The gate sums each channel in double where its composite's mean sums in float32: the two agree
// short of a float32 overflow of the sum, so the largest finite values are left out here.
// (CompositeOnly also turns oneDNN's convolutions off, so the composite is im2col, matmul and the
// activation ops.)
TEST(FusedValues, ChannelGateEqualsItsComposite) {
  Generator gen(11);
  const Tensor x = special_for_sums({2, 8, 3, 3}, 12);
  const Tensor w1 = randn({4, 8, 1, 1}, kFloat32, &gen), b1 = randn({4}, kFloat32, &gen);
  const Tensor w2 = randn({8, 4, 1, 1}, kFloat32, &gen), b2 = randn({8}, kFloat32, &gen);
  expect_definition(
      "channel_gate", [&] { return detail::channel_gate(x, w1, b1, {"relu"}, w2, b2, {"hardsigmoid", 0.2, 0.5}); },
      1e-5);
}

// A convolution with each epilogue oneDNN fuses (as post-ops), against im2col, matmul and the
// activation's op: a 1x1 convolution of one channel, so special inputs reach the epilogue unmixed.
TEST(FusedValues, ConvolutionEpiloguesEqualTheirOps) {
  Generator gen(13);
  // Known difference, left out here: oneDNN's post-op activations are min/max based and give a NaN
  // input the activation of a bound (relu 0, clip its minimum), where braid's ops (and PyTorch's)
  // give NaN. A NaN reaching a fused convolution in inference comes out as a number.
  std::vector<float> v = special_values(2 * 6 * 7, 14);
  for (float& f : v)
    if (std::isnan(f)) f = 7.0f;
  const Tensor x = tensor(v, {2, 1, 6, 7});
  const Tensor w = randn({4, 1, 1, 1}, kFloat32, &gen), b = randn({4}, kFloat32, &gen);
  for (const detail::ConvActivation& act : std::vector<detail::ConvActivation>{
           {"relu"}, {"clip", -1.0, 2.5}, {"hardswish"}, {"hardsigmoid", 0.2, 0.5}}) {
    expect_definition("conv2d_activation " + act.name, [&] {
      return detail::conv2d_activation(x, w, b, {1, 1}, {0, 0}, {1, 1}, 1, act.name, act.a, act.b);
    }, 1e-6);
  }
}

// Products by a weight with their epilogue (a bias, then a scale) and the int8 products with
// theirs, against the product and the steps as ops. The float32 product's sums may be ordered
// otherwise; the int8 product is exact, so its chain is bit for bit. A weight is kept (and its
// epilogue fused) from its second product on (Note [float32 epilogues]), so each runs twice.
TEST(FusedValues, ProductEpiloguesEqualTheirSteps) {
  Generator gen(15);
  const Tensor a = special({6, 16}, 16, 1);
  const Tensor w = randn({16, 24}, kFloat32, &gen);
  ChainStep bias;
  bias.kind = ChainStep::Kind::Add;
  bias.a = 0;
  bias.b = ChainStep::kTensor;
  bias.operand = special({24}, 17);
  ChainStep scale;
  scale.kind = ChainStep::Kind::Mul;
  scale.a = 1;
  scale.k = -0.5f;
  expect_definition("matmul_chain", [&] {
    detail::matmul_chain(a, w, {bias, scale});
    return detail::matmul_chain(a, w, {bias, scale});
  }, 1e-5);
  const Tensor qa = quantize(special({6, 16}, 18, 30), 1.0, 0, kUInt8);
  const Tensor qb = quantize(randn({16, 24}, kFloat32, &gen) * 30.0, 1.0, 0, kInt8);
  ChainStep qscale = scale;
  qscale.a = 0;
  qscale.k = 0.0125f;
  ChainStep qbias = bias;
  qbias.a = 1;
  expect_definition("int_matmul_chain", [&] {
    detail::int_matmul_chain(qa, qb, 3, 0, {qscale, qbias});
    return detail::int_matmul_chain(qa, qb, 3, 0, {qscale, qbias});
  });
}

// Max pooling of channels-last activations in inference (values only) against the NCHW pooling.
TEST(FusedValues, ChannelsLastMaxPoolingEqualsItsComposite) {
  const Tensor x = special({2, 5, 7, 6}, 19);
  const Tensor cl = contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
  ASSERT_TRUE(cl.is_channels_last());
  expect_definition("max_pool2d channels-last", [&] { return contiguous(max_pool2d(cl, {3, 3}, {2, 2}, {1, 1})); });
}

// The backward kernels: a convolution's input and weight gradients (oneDNN's backward passes against
// col2im and the product of the columns) and BatchNorm's gradient sums, on special upstream
// gradients, within reassociation (each sums many products; the largest finite values are left out,
// as sums of them overflow or not depending on the order).
TEST(FusedValues, BackwardKernelsEqualTheirComposites) {
  Generator gen(20);
  const Tensor x = randn({2, 3, 6, 5}, kFloat32, &gen), w = randn({4, 3, 3, 3}, kFloat32, &gen);
  // Known difference, left out here: an inf or NaN upstream gradient at an output whose window
  // reaches into the padding: the composite (im2col) multiplies it by the padding's zeros (NaN),
  // oneDNN's backward-weights pass never reads the padding (a number).
  const Tensor gy = special_for_sums({2, 4, 6, 5}, 21, 1, /*finite_only=*/true);
  const auto grads = [&](int which) {
    Tensor xv = x.clone(), wv = w.clone();
    xv.set_requires_grad(true);
    wv.set_requires_grad(true);
    sum(conv2d(xv, wv, Tensor(), {1, 1}, {1, 1}) * gy).backward();
    return which == 0 ? xv.grad() : wv.grad();
  };
  for (int which : {0, 1}) {
    const Tensor fused = grads(which);
    Tensor composite;
    {
      detail::CompositeOnly guard;
      composite = grads(which);
    }
    expect_same(which == 0 ? "conv2d_backward_input" : "conv2d_backward_weight", fused, composite, 1e-5);
  }
  const Tensor bx = randn({2, 3, 4, 5}, kFloat32, &gen), scale = rand({3}, kFloat32, &gen, 0.5, 1.5);
  const Tensor bg = special_for_sums({2, 3, 4, 5}, 22, 1);
  const auto bn_grad = [&] {
    Tensor xv = bx.clone();
    xv.set_requires_grad(true);
    sum(batch_norm_training(xv, scale, Tensor(), 1e-5)[0] * bg).backward();
    return xv.grad();
  };
  const Tensor fused = bn_grad();
  Tensor composite;
  {
    detail::CompositeOnly guard;
    composite = bn_grad();
  }
  expect_same("channel_grad_sums", fused, composite, 1e-5);
}
