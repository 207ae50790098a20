// Squeeze-and-excitation as one op (Note [Channel gates as one op]): braid::squeeze_excite
// and its gate against the block written out in double arithmetic in this file (the mean, the two
// 1x1 products with their biases, each activation by its formula), in both layouts and at sizes on
// either side of the parallel grain, against the ops one by one, and its refusals. On the device
// under test (tests/test_device.h); the family also runs with the fused kernels off (tests/meson.build),
// which takes the composite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "braid/braid.h"
#include "ops/fused.h"
#include "error_of.h"

namespace braid {
namespace {

Tensor channels_last_copy(const Tensor& x) { return contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}); }

double activated(const detail::ConvActivation& a, double v) {
  if (a.name == "relu") return std::max(v, 0.0);
  if (a.name == "clip") return std::min(std::max(v, a.a), a.b);
  if (a.name == "hardswish") return v * std::min(std::max(v / 6 + 0.5, 0.0), 1.0);
  if (a.name == "hardsigmoid") return std::min(std::max(a.a * v + a.b, 0.0), 1.0);
  return v;
}

// The gate (N * C values) of x (N, C, H, W), in double from the tensors' float values.
std::vector<double> reference_gate(const Tensor& x, const Tensor& w1, const Tensor& b1, const detail::ConvActivation& a1,
                                   const Tensor& w2, const Tensor& b2, const detail::ConvActivation& a2) {
  const int64_t n = x.size(0), c = x.size(1), r = x.size(2) * x.size(3), mid = w1.size(0);
  const std::vector<float> xs = contiguous(x).to_vector<float>(), v1 = w1.to_vector<float>(),
                           v2 = w2.to_vector<float>();
  const std::vector<float> c1 = b1.defined() ? b1.to_vector<float>() : std::vector<float>(mid, 0.0f);
  const std::vector<float> c2 = b2.defined() ? b2.to_vector<float>() : std::vector<float>(c, 0.0f);
  std::vector<double> gate(static_cast<size_t>(n * c));
  for (int64_t s = 0; s < n; ++s) {
    std::vector<double> m(c, 0.0), h(mid, 0.0);
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t i = 0; i < r; ++i) m[k] += xs[static_cast<size_t>((s * c + k) * r + i)];
      m[k] /= static_cast<double>(r);
    }
    for (int64_t j = 0; j < mid; ++j) {
      double acc = c1[j];
      for (int64_t k = 0; k < c; ++k) acc += static_cast<double>(v1[static_cast<size_t>(j * c + k)]) * m[k];
      h[j] = activated(a1, acc);
    }
    for (int64_t k = 0; k < c; ++k) {
      double acc = c2[k];
      for (int64_t j = 0; j < mid; ++j) acc += static_cast<double>(v2[static_cast<size_t>(k * mid + j)]) * h[j];
      gate[static_cast<size_t>(s * c + k)] = activated(a2, acc);
    }
  }
  return gate;
}

struct Block {
  Tensor w1, b1, w2, b2;
  detail::ConvActivation a1, a2;
};

Block random_block(int64_t c, int64_t mid, Generator& gen, detail::ConvActivation a1, detail::ConvActivation a2, bool biases = true) {
  Block b;
  b.w1 = randn({mid, c, 1, 1}, kFloat32, &gen, 0, 0.3);
  b.w2 = randn({c, mid, 1, 1}, kFloat32, &gen, 0, 0.3);
  if (biases) {
    b.b1 = randn({mid}, kFloat32, &gen, 0, 0.5);
    b.b2 = randn({c}, kFloat32, &gen, 0, 0.5);
  }
  b.a1 = std::move(a1);
  b.a2 = std::move(a2);
  return b;
}

// Each block against the closed form: the gate to a few float32 roundings of the sums (the op sums
// in double, the composite in float32), and x times it, in x's layout.
TEST(SqueezeExcite, MatchesTheBlockWrittenOut) {
  Generator gen(31);
  struct Case {
    std::vector<int64_t> shape;
    int64_t mid;
    detail::ConvActivation a1, a2;
    bool biases;
  };
  const std::vector<Case> cases = {
      {{2, 12, 5, 7}, 3, {"relu"}, {"hardsigmoid", 0.2, 0.5}, true},       // PP-LCNet's block
      {{1, 40, 6, 9}, 10, {"relu"}, {"hardsigmoid", 1.0 / 6, 0.5}, true},  // MobileNetV3's
      {{3, 20, 4, 4}, 5, {"clip", -0.5, 0.5}, {"hardswish"}, false},       // other activations, no biases
      {{1, 64, 24, 32}, 16, {"hardswish"}, {"", 0, 0}, true},              // above the parallel grain
  };
  for (const Case& k : cases) {
    const Tensor x = randn(k.shape, kFloat32, &gen) + 0.3;
    const Block b = random_block(k.shape[1], k.mid, gen, k.a1, k.a2, k.biases);
    const std::vector<double> want = reference_gate(x, b.w1, b.b1, b.a1, b.w2, b.b2, b.a2);
    const int64_t n = k.shape[0], c = k.shape[1], r = k.shape[2] * k.shape[3];
    for (bool cl : {false, true}) {
      const Tensor xin = cl ? channels_last_copy(x) : x;
      const Tensor gate = detail::channel_gate_values(xin, b.w1, b.b1, b.a1, b.w2, b.b2, b.a2);
      ASSERT_EQ(gate.shape(), (Shape{n, c, 1, 1}));
      const std::vector<float> got = gate.to_vector<float>();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::fabs(want[i]))) << i;
      const Tensor y = detail::channel_gate(xin, b.w1, b.b1, b.a1, b.w2, b.b2, b.a2);
      ASSERT_EQ(y.shape(), x.shape());
      EXPECT_EQ(!y.is_contiguous() && y.is_channels_last(), cl) << "the result keeps x's layout";
      const std::vector<float> ys = contiguous(y).to_vector<float>(), xs = x.to_vector<float>();
      for (int64_t i = 0; i < n * c * r; ++i) {
        const double w = static_cast<double>(xs[static_cast<size_t>(i)]) * want[static_cast<size_t>(i / r)];
        ASSERT_NEAR(ys[static_cast<size_t>(i)], w, 4e-6 * (1 + std::fabs(w))) << i << (cl ? " channels-last" : "");
      }
    }
  }
}

// The op and the ops it stands for (what the ONNX executor ran before it) agree to float32
// reassociation; x's gradient flag does not matter in inference.
TEST(SqueezeExcite, AgreesWithTheOpsOneByOne) {
  Generator gen(32);
  const Tensor x = randn({2, 24, 9, 11}, kFloat32, &gen);
  const Block b = random_block(24, 6, gen, {"relu"}, {"hardsigmoid", 0.2, 0.5});
  const Tensor gate =
      detail::conv2d_activation(detail::conv2d_activation(mean(x, {2, 3}, true), b.w1, b.b1, {1, 1}, {0, 0}, {1, 1}, 1, "relu"), b.w2,
                        b.b2, {1, 1}, {0, 0}, {1, 1}, 1, "hardsigmoid", 0.2, 0.5);
  const std::vector<float> want = (x * gate).to_vector<float>();
  Tensor xg = x.detach();
  xg.set_requires_grad();
  NoGradGuard no_grad;
  const std::vector<float> got = detail::channel_gate(xg, b.w1, b.b1, b.a1, b.w2, b.b2, b.a2).to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 3e-6 * (1 + std::fabs(want[i]))) << i;
}

TEST(SqueezeExcite, RefusesWhatItCannotRunNamingIt) {
  Generator gen(33);
  const Tensor x = randn({1, 8, 3, 3}, kFloat32, &gen);
  const Block b = random_block(8, 2, gen, {"relu"}, {"hardsigmoid", 0.2, 0.5});
  const auto message = [&](const auto& f) { return error_of<ValueError>(f); };
  EXPECT_NE(message([&] {
              detail::channel_gate(x, randn({2, 7, 1, 1}), b.b1, b.a1, b.w2, b.b2, b.a2);
            }).find("w1 must be (C_mid, 8, 1, 1) for x of shape [1, 8, 3, 3], got [2, 7, 1, 1]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              detail::channel_gate(x, b.w1, b.b1, b.a1, randn({8, 3, 1, 1}), b.b2, b.a2);
            }).find("w2 must be (8, 2, 1, 1)"),
            std::string::npos);
  EXPECT_NE(message([&] { detail::channel_gate(x, b.w1, randn({3}), b.a1, b.w2, b.b2, b.a2); }).find("b1 must be (2)"),
            std::string::npos);
  EXPECT_NE(
      message([&] { detail::channel_gate(x, b.w1, b.b1, {"gelu"}, b.w2, b.b2, b.a2); }).find("unknown activation 'gelu'"),
      std::string::npos);
  EXPECT_NE(message([&] {
              detail::channel_gate(x.reshape({8, 3, 3}), b.w1, b.b1, b.a1, b.w2, b.b2, b.a2);
            }).find("x must be (N, C, H, W)"),
            std::string::npos);
  EXPECT_NE(error_of<TypeError>([&] {
              detail::channel_gate(x.to(kFloat64), b.w1, b.b1, b.a1, b.w2, b.b2, b.a2);
            }).find("must be float32"),
            std::string::npos);
  Tensor w = b.w1.detach();
  w.set_requires_grad();
  EXPECT_NE(message([&] { detail::channel_gate(x, w, b.b1, b.a1, b.w2, b.b2, b.a2); }).find("inference only"),
            std::string::npos);
}

}  // namespace
}  // namespace braid
