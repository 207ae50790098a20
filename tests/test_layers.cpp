// Feed-forward layers (linear, convolution, pooling, normalisation, activations, dropout,
// embedding, shape, residual): outputs, gradients and running statistics against PyTorch
// (tests/data/layers_feedforward.txt, layers_norm.txt), float64 finite-difference gradient checks
// w.r.t. inputs and parameters, PyTorch's default initialisation as distribution bounds and moments,
// PyTorch's printed form, and the errors a wrong input gives.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "layer_check.h"

namespace braid {
namespace {

using namespace nn;
using testing::LayerCase;
using testing::RunFn;
using V = const std::vector<Tensor>&;

const std::string kFF = "layers_feedforward.txt";
const std::string kNorm = "layers_norm.txt";

template <typename M, typename... Args>
std::function<ModulePtr()> make(Args... args) {
  return [=] { return std::make_shared<M>(args...); };
}

std::vector<LayerCase> feedforward_rows() {
  std::vector<LayerCase> rows = {
      {kFF, "linear/basic", make<Linear>(5, 4)},
      {kFF, "linear/no_bias_batched", make<Linear>(5, 4, false)},
      {kFF, "conv1d/strided_groups", [] { return std::make_shared<Conv1d>(4, 6, 3, 2, 1, 1, 2); }},
      {kFF, "conv1d/same_even_kernel", [] { return std::make_shared<Conv1d>(3, 4, 4, 1, "same"); }},
      {kFF, "conv1d/same_dilated_no_bias", [] { return std::make_shared<Conv1d>(3, 4, 3, 1, "same", 2, 1, false); }},
      {kFF, "conv1d/unbatched", [] { return std::make_shared<Conv1d>(3, 2, 2); }},
      {kFF, "conv2d/basic", [] { return std::make_shared<Conv2d>(3, 4, 3, 1, 1); }},
      {kFF, "conv2d/strided_dilated_groups",
       [] { return std::make_shared<Conv2d>(4, 6, Ints{3, 2}, Ints{2, 1}, Padding{1, 0}, Ints{1, 2}, 2); }},
      {kFF, "conv2d/depthwise", [] { return std::make_shared<Conv2d>(4, 4, 3, 1, 1, 1, 4, false); }},
      {kFF, "conv2d/same_even_kernel", [] { return std::make_shared<Conv2d>(2, 3, Ints{4, 3}, 1, "same", Ints{1, 2}); }},
      {kFF, "conv2d/valid_unbatched", [] { return std::make_shared<Conv2d>(2, 3, 2, 1, "valid"); }},
      {kFF, "conv_transpose2d/strided_groups", [] { return std::make_shared<ConvTranspose2d>(4, 6, 3, 2, 1, 1, 2); }},
      {kFF, "conv_transpose2d/dilated",
       [] { return std::make_shared<ConvTranspose2d>(3, 2, Ints{2, 3}, Ints{1, 2}, 0, 0, 1, true, Ints{2, 1}); }},
      {kFF, "max_pool2d/basic", [] { return std::make_shared<MaxPool2d>(2); }},
      {kFF, "max_pool2d/ceil_padding", [] { return std::make_shared<MaxPool2d>(3, 2, 1, 1, true); }},
      {kFF, "max_pool2d/dilated", [] { return std::make_shared<MaxPool2d>(Ints{2, 3}, Ints{1, 2}, 0, Ints{2, 1}); }},
      {kFF, "avg_pool2d/basic", [] { return std::make_shared<AvgPool2d>(2); }},
      {kFF, "avg_pool2d/ceil_exclude_pad", [] { return std::make_shared<AvgPool2d>(3, 2, 1, true, false); }},
      {kFF, "avg_pool2d/include_pad", [] { return std::make_shared<AvgPool2d>(Ints{3, 2}, Ints{2, 1}, Ints{1, 1}); }},
      {kFF, "adaptive_avg_pool2d/uneven", [] { return std::make_shared<AdaptiveAvgPool2d>(Ints{3, 2}); }},
      {kFF, "adaptive_avg_pool2d/global", [] { return std::make_shared<AdaptiveAvgPool2d>(1); }},
      {kFF, "activation/relu", make<ReLU>()},
      {kFF, "activation/leaky_relu", make<LeakyReLU>(0.2)},
      {kFF, "activation/gelu", make<GELU>()},
      {kFF, "activation/gelu_tanh", make<GELU>("tanh")},
      {kFF, "activation/silu", make<SiLU>()},
      {kFF, "activation/relu6", make<ReLU6>()},
      {kFF, "activation/sigmoid", make<Sigmoid>()},
      {kFF, "activation/tanh", make<Tanh>()},
      {kFF, "activation/softmax", make<Softmax>(1)},
      {kFF, "embedding/basic", make<Embedding>(10, 4)},
      // PyTorch gives the padding row no gradient although the output depends on it.
      {kFF, "embedding/padding_idx", [] { return std::make_shared<Embedding>(10, 4, 2); }, nullptr, false},
      {kFF, "flatten/default", make<Flatten>()},
      {kFF, "flatten/range", make<Flatten>(0, 2)},
      {kFF, "residual/shortcut",
       [] {
         auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
             std::make_shared<Linear>(4, 6), std::make_shared<ReLU>(), std::make_shared<Linear>(6, 5)});
         return std::make_shared<Residual>(body, std::make_shared<Linear>(4, 5));
       }},
      {kFF, "residual/identity",
       [] {
         return std::make_shared<Residual>(std::make_shared<Sequential>(
             std::vector<ModulePtr>{std::make_shared<Linear>(4, 4), std::make_shared<Tanh>()}));
       }},
      {kFF, "sequential/small_cnn",
       [] {
         return std::make_shared<Sequential>(std::vector<ModulePtr>{
             std::make_shared<Conv2d>(2, 4, 3, 1, 1), std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(),
             std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(), std::make_shared<Linear>(4 * 3 * 3, 5)});
       }},
      {kNorm, "batchnorm1d/train_2d", make<BatchNorm1d>(4)},
      {kNorm, "batchnorm1d/train_3d_momentum", [] { return std::make_shared<BatchNorm1d>(3, 1e-3, 0.3); }},
      {kNorm, "batchnorm1d/eval", make<BatchNorm1d>(4)},
      {kNorm, "batchnorm1d/cumulative_average", [] { return std::make_shared<BatchNorm1d>(3, 1e-5, std::nullopt); }},
      {kNorm, "batchnorm1d/no_affine_no_stats_train", [] { return std::make_shared<BatchNorm1d>(3, 1e-5, 0.1, false, false); }},
      {kNorm, "batchnorm1d/no_affine_no_stats_eval", [] { return std::make_shared<BatchNorm1d>(3, 1e-5, 0.1, false, false); }},
      {kNorm, "batchnorm2d/train", make<BatchNorm2d>(3)},
      {kNorm, "batchnorm2d/eval", make<BatchNorm2d>(3)},
      {kNorm, "layernorm/basic", [] { return std::make_shared<LayerNorm>(6); }},
      {kNorm, "layernorm/multi_no_affine", [] { return std::make_shared<LayerNorm>(Ints{3, 4}, 1e-3, false); }},
      {kNorm, "groupnorm/basic", make<GroupNorm>(2, 6)},
      {kNorm, "groupnorm/no_affine_3d", make<GroupNorm>(3, 6, 1e-5, false)},
  };
  return rows;
}

class LayerReference : public ::testing::TestWithParam<LayerCase> {};
TEST_P(LayerReference, MatchesPyTorch) { testing::check_reference_row(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Layers, LayerReference, ::testing::ValuesIn(feedforward_rows()), testing::layer_case_name);

class LayerGradient : public ::testing::TestWithParam<LayerCase> {};
TEST_P(LayerGradient, MatchesFiniteDifferences) { testing::check_gradient_row(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Layers, LayerGradient, ::testing::ValuesIn(testing::differentiable_rows(feedforward_rows())),
                         testing::layer_case_name);

// ---- LayerNorm's two paths: the backend's fused rows (inference) and the composite (autograd) ----

TEST(LayerNorm, FusedRowsAndTheCompositeMatchAClosedFormInDouble) {
  manual_seed(7);
  const Tensor x = randn({3, 5, 4, 6}) * 3.0 + 1.5, w = randn({4, 6}), b = randn({4, 6});
  const std::vector<double> xs = x.to_vector<double>(), ws = w.to_vector<double>(), bs = b.to_vector<double>();
  const int64_t n = 24, rows = 15;
  std::vector<double> want(xs.size()), want_mean(rows), want_inv(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; ++i) m += xs[r * n + i] / n;
    for (int64_t i = 0; i < n; ++i) v += (xs[r * n + i] - m) * (xs[r * n + i] - m) / n;
    want_mean[r] = m;
    want_inv[r] = 1 / std::sqrt(v + 1e-5);
    for (int64_t i = 0; i < n; ++i) want[r * n + i] = (xs[r * n + i] - m) * want_inv[r] * ws[i] + bs[i];
  }
  auto near = [](const std::vector<double>& got, const std::vector<double>& ref, const char* what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], ref[i], 2e-5 * (1 + std::abs(ref[i]))) << what << " " << i;
  };
  {
    NoGradGuard inference;  // the fused rows where the backend has them
    const std::vector<Tensor> y = layer_norm_with_stats(x, 2, w, b, 1e-5);
    EXPECT_EQ(y[1].shape(), (Shape{3, 5, 1, 1}));
    near(y[0].to_vector<double>(), want, "inference y");
    near(y[1].to_vector<double>(), want_mean, "inference mean");
    near(y[2].to_vector<double>(), want_inv, "inference inverse std");
  }
  Tensor xg = x.clone();
  xg.set_requires_grad();  // the composite, which autograd differentiates
  const Tensor y = layer_norm(xg, 2, w, b, 1e-5);
  near(y.detach().to_vector<double>(), want, "composite y");
  y.sum().backward();
  ASSERT_TRUE(xg.grad().defined());
  // Without an affine: the normalised rows alone.
  NoGradGuard inference;
  const std::vector<double> plain = layer_norm(x, 2).to_vector<double>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(plain[r * n + i], (xs[r * n + i] - want_mean[r]) * want_inv[r], 2e-5) << r << " " << i;
}

// ---- BatchNorm beyond one step: running statistics against a closed form computed here ----

TEST(BatchNorm, RunningStatisticsOverTwoStepsAndEval) {
  BatchNorm1d bn(2);
  bn.to(kFloat64);
  const std::vector<double> a{1, 2, 4, -1, 0, 5}, b{3, 0, -2, 2, 1, 1};  // two batches of (3, 2)
  bn.forward(tensor(a, {3, 2}));
  bn.forward(tensor(b, {3, 2}));
  auto stats = [](const std::vector<double>& x, int c) {
    double m = (x[c] + x[2 + c] + x[4 + c]) / 3, v = 0;
    for (int i = 0; i < 3; ++i) v += (x[2 * i + c] - m) * (x[2 * i + c] - m);
    return std::pair<double, double>{m, v / 2};  // unbiased
  };
  StateDict s = bn.state_dict();
  for (int c = 0; c < 2; ++c) {
    auto [ma, va] = stats(a, c);
    auto [mb, vb] = stats(b, c);
    const double rm = 0.9 * (0.1 * ma) + 0.1 * mb, rv = 0.9 * (0.9 * 1 + 0.1 * va) + 0.1 * vb;
    EXPECT_NEAR(s["running_mean"].to_vector<double>()[c], rm, 1e-15);
    EXPECT_NEAR(s["running_var"].to_vector<double>()[c], rv, 1e-15);
  }
  EXPECT_EQ(s["num_batches_tracked"].item(), 2);
  EXPECT_EQ(s["num_batches_tracked"].dtype(), kInt64);
  bn.eval();
  Tensor y = bn.forward(tensor(std::vector<double>{0.5, -0.5}, {1, 2}));
  for (int c = 0; c < 2; ++c) {
    const double rm = s["running_mean"].to_vector<double>()[c], rv = s["running_var"].to_vector<double>()[c];
    EXPECT_NEAR(y.to_vector<double>()[c], ((c ? -0.5 : 0.5) - rm) / std::sqrt(rv + 1e-5), 1e-14);
  }
  EXPECT_EQ(s["num_batches_tracked"].item(), 2) << "eval must not count batches";
}

TEST(BatchNorm, WithoutRunningStatsHasNoBuffers) {
  BatchNorm2d bn(3, 1e-5, 0.1, false, false);
  EXPECT_TRUE(bn.state_dict().empty());
  EXPECT_EQ(bn.num_parameters(), 0);
}

// ---- Dropout: seeded Bernoulli masks ----

TEST(DropoutLayer, DropsAtRateAndScalesKeptValues) {
  Generator gen(7);
  Dropout d(0.3, &gen);
  Tensor y = d.forward(ones({100000}, kFloat64));
  int64_t zeros_count = 0;
  for (double v : y.to_vector<double>()) {
    if (v == 0) ++zeros_count;
    else ASSERT_DOUBLE_EQ(v, 1.0 / 0.7);
  }
  // Binomial(1e5, 0.3): standard deviation 145; 5 sigma.
  EXPECT_NEAR(static_cast<double>(zeros_count), 30000.0, 725.0);
}

TEST(DropoutLayer, SameSeedSameMaskAndGradientIsTheMask) {
  Generator g1(11), g2(11), g3(12);
  Dropout d1(0.5, &g1), d2(0.5, &g2), d3(0.5, &g3);
  Tensor x = ones({64}, kFloat64).set_requires_grad(true);
  Tensor y1 = d1.forward(x), y2 = d2.forward(x), y3 = d3.forward(x);
  EXPECT_TRUE(equal(y1, y2));
  EXPECT_FALSE(equal(y1, y3));
  sum(y1).backward();
  EXPECT_TRUE(equal(x.grad(), y1.detach())) << "for x = 1, dy/dx = mask / (1 - p) = y";
}

TEST(DropoutLayer, EvalIsIdentityAndEdgeProbabilities) {
  Dropout d(0.5);
  d.eval();
  Tensor x = randn({10});
  EXPECT_TRUE(d.forward(x).is_same(x));
  Dropout all(1.0), none(0.0);
  Tensor xg = randn({5}, kFloat64).set_requires_grad(true);
  Tensor y = all.forward(xg);
  EXPECT_EQ(y.to_vector<double>(), std::vector<double>(5, 0.0));
  sum(y).backward();
  EXPECT_EQ(xg.grad().to_vector<double>(), std::vector<double>(5, 0.0));
  EXPECT_TRUE(none.forward(x).is_same(x));
}

TEST(DropoutLayer, GradientMatchesFiniteDifferencesWithFixedMask) {
  Generator gen(3);
  Dropout d(0.4, &gen);
  testing::expect_gradcheck(d, {randn({4, 5}, kFloat64)}, [&gen](Module& m, V in) {
    gen.manual_seed(3);
    return std::vector<Tensor>{m.forward(in[0])};
  });
}

// ---- Default initialisation: PyTorch's distributions, checked by bounds and moments ----

struct Moments {
  double mean = 0, var = 0, max_abs = 0;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to(kFloat64).to_vector<double>();
  Moments m;
  for (double x : v) m.mean += x / static_cast<double>(v.size());
  for (double x : v) {
    m.var += (x - m.mean) * (x - m.mean) / static_cast<double>(v.size());
    m.max_abs = std::max(m.max_abs, std::fabs(x));
  }
  return m;
}

/// Uniform(-bound, bound): every value inside (up to float32 rounding), the largest near the bound,
/// mean 0 and variance bound^2 / 3 within 5 standard errors.
void expect_uniform(const Tensor& t, double bound, const std::string& what) {
  Moments m = moments(t);
  const double n = static_cast<double>(t.numel()), var = bound * bound / 3;
  EXPECT_LE(m.max_abs, bound * (1 + 1e-7)) << what;
  EXPECT_GE(m.max_abs, bound * (1 - 20 / n)) << what;
  EXPECT_NEAR(m.mean, 0.0, 5 * std::sqrt(var / n)) << what;
  EXPECT_NEAR(m.var, var, 5 * var * std::sqrt(0.8 / n)) << what;  // Var(X^2) = 4/5 var^2 for a uniform
}

TEST(LayerInit, LinearAndConvAreKaimingUniformWithAEqualsSqrt5) {
  manual_seed(1);
  Linear lin(400, 300);
  expect_uniform(lin.weight(), 1 / std::sqrt(400.0), "Linear weight");
  expect_uniform(lin.bias(), 1 / std::sqrt(400.0), "Linear bias");
  Conv2d conv(8, 64, 3, 1, 0, 1, 2);  // fan_in = 8 / 2 * 9 = 36
  StateDict s = conv.state_dict();
  expect_uniform(s["weight"], 1 / 6.0, "Conv2d weight");
  expect_uniform(s["bias"], 1 / 6.0, "Conv2d bias");
  ConvTranspose2d tconv(64, 12, 3);  // weight (64, 12, 3, 3): fan_in = 12 * 9 = 108
  expect_uniform(tconv.state_dict()["weight"], 1 / std::sqrt(108.0), "ConvTranspose2d weight");
  Conv1d c1(16, 32, 5);  // fan_in 80
  expect_uniform(c1.state_dict()["weight"], 1 / std::sqrt(80.0), "Conv1d weight");
}

TEST(LayerInit, EmbeddingIsStandardNormalAndNormsAreOnesAndZeros) {
  manual_seed(2);
  Embedding emb(1000, 64, 5);
  Moments m = moments(emb.weight());
  const double n = 64000;
  EXPECT_NEAR(m.mean, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(m.var, 1.0, 5 * std::sqrt(2 / n));
  EXPECT_EQ(emb.weight().select(0, 5).to_vector<float>(), std::vector<float>(64, 0.0f)) << "padding row";
  for (ModulePtr norm : std::vector<ModulePtr>{std::make_shared<BatchNorm2d>(5), std::make_shared<LayerNorm>(5),
                                               std::make_shared<GroupNorm>(1, 5)}) {
    StateDict s = norm->state_dict();
    EXPECT_EQ(s["weight"].to_vector<float>(), std::vector<float>(5, 1.0f)) << norm->type_name();
    EXPECT_EQ(s["bias"].to_vector<float>(), std::vector<float>(5, 0.0f)) << norm->type_name();
  }
}

TEST(LayerInit, SameSeedSameWeights) {
  manual_seed(42);
  Linear a(20, 10);
  manual_seed(42);
  Linear b(20, 10);
  Linear c(20, 10);
  EXPECT_TRUE(equal(a.weight(), b.weight()));
  EXPECT_FALSE(equal(a.weight(), c.weight()));
}

TEST(InitFunctions, GainsAndFans) {
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("tanh"), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu", std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("conv2d"), 1.0);
  auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(empty({6, 4, 3, 2}));
  EXPECT_EQ(fan_in, 24);
  EXPECT_EQ(fan_out, 36);
}

TEST(InitFunctions, DistributionsHaveTheirClosedFormMoments) {
  Generator gen(5);
  Tensor w = empty({500, 200}, kFloat64);  // fan_in 200, fan_out 500
  const double n = 100000;
  init::kaiming_normal_(w, 0.0, "fan_in", "relu", &gen);
  Moments m = moments(w);
  EXPECT_NEAR(m.var, 2.0 / 200, 5 * (2.0 / 200) * std::sqrt(2 / n));
  init::kaiming_uniform_(w, 0.0, "fan_out", "relu", &gen);
  expect_uniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 500), "kaiming_uniform_ fan_out");
  init::xavier_uniform_(w, 2.0, &gen);
  expect_uniform(w, 2.0 * std::sqrt(6.0 / 700), "xavier_uniform_");
  init::xavier_normal_(w, 1.0, &gen);
  m = moments(w);
  EXPECT_NEAR(m.var, 2.0 / 700, 5 * (2.0 / 700) * std::sqrt(2 / n));
  init::normal_(w, 3.0, 0.5, &gen);
  m = moments(w);
  EXPECT_NEAR(m.mean, 3.0, 5 * 0.5 / std::sqrt(n));
  EXPECT_NEAR(m.var, 0.25, 5 * 0.25 * std::sqrt(2 / n));
  init::uniform_(w, 1.0, 2.0, &gen);
  m = moments(w);
  EXPECT_NEAR(m.mean, 1.5, 5 * std::sqrt(1.0 / 12 / n));
  init::constant_(w, 0.25);
  EXPECT_EQ(w.to_vector<double>(), std::vector<double>(100000, 0.25));
  Generator a(9), b(9);
  EXPECT_TRUE(equal(init::normal_(empty({8}), 0, 1, &a), init::normal_(empty({8}), 0, 1, &b)));
}

TEST(InitFunctions, ReinitialisesTrackedParameters) {
  Linear lin(3, 2);
  init::zeros_(lin.weight());
  EXPECT_EQ(lin.weight().to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_TRUE(lin.weight().requires_grad());
}

// ---- Module::to ----

TEST(ModuleTo, ConvertsParametersInPlaceKeepingHandles) {
  Linear lin(3, 2);
  Tensor held = lin.weight();
  std::vector<float> before = held.to_vector<float>();
  lin.to(kFloat64);
  EXPECT_EQ(held.dtype(), kFloat64);
  EXPECT_TRUE(held.is_same(lin.named_parameters()[0].second));
  EXPECT_TRUE(held.requires_grad());
  std::vector<double> after = held.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], static_cast<double>(before[i]));
  Tensor x = tensor(std::vector<double>{1, 2, 3}, {1, 3});
  Tensor y = lin.forward(x);
  EXPECT_EQ(y.dtype(), kFloat64);
  std::vector<double> b = lin.bias().to_vector<double>();
  EXPECT_NEAR(y.to_vector<double>()[1], after[3] + 2 * after[4] + 3 * after[5] + b[1], 1e-15);
  BatchNorm1d bn(2);
  bn.to(kFloat64);
  EXPECT_EQ(bn.state_dict()["running_mean"].dtype(), kFloat64);
  EXPECT_EQ(bn.state_dict()["num_batches_tracked"].dtype(), kInt64);
  EXPECT_LAYER_ERROR(TypeError, lin.to(kInt64), "Linear", "float32 or float64");
}

// ---- Residual ----

TEST(ResidualBlock, AddsInputAndFollowsReplacedChildren) {
  Residual r(std::make_shared<Linear>(3, 3));
  r.replace_child("body", std::make_shared<Identity>());
  Tensor x = tensor(std::vector<float>{1, -2, 3}, {1, 3});
  EXPECT_EQ(r.forward(x).to_vector<float>(), (std::vector<float>{2, -4, 6}));
  Residual bad(std::make_shared<Linear>(3, 2));
  EXPECT_LAYER_ERROR(ValueError, bad.forward(x), "Residual", "[1, 2]", "[1, 3]", "shortcut");
}

// ---- The printed form equals PyTorch's ----

TEST(LayerDescribe, MatchesPyTorchRepr) {
  EXPECT_EQ(Linear(784, 10).describe(), "Linear(in_features=784, out_features=10, bias=True)");
  EXPECT_EQ(Conv2d(3, 16, 3, 1, 1).describe(), "Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))");
  EXPECT_EQ(Conv2d(4, 6, Ints{3, 2}, Ints{2, 1}, Padding{1, 0}, Ints{1, 2}, 2, false).describe(),
            "Conv2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, bias=False)");
  EXPECT_EQ(Conv2d(2, 3, 3, 1, "same").describe(), "Conv2d(2, 3, kernel_size=(3, 3), stride=(1, 1), padding=same)");
  EXPECT_EQ(Conv1d(4, 6, 3, 2, 1, 1, 2).describe(),
            "Conv1d(4, 6, kernel_size=(3,), stride=(2,), padding=(1,), groups=2)");
  EXPECT_EQ(ConvTranspose2d(4, 6, 3, 2, 1, 1, 2).describe(),
            "ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), groups=2)");
  EXPECT_EQ(AdaptiveAvgPool2d(Ints{3, 2}).describe(), "AdaptiveAvgPool2d(output_size=(3, 2))");
  EXPECT_EQ(BatchNorm2d(16).describe(), "BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  EXPECT_EQ(BatchNorm1d(3, 1e-5, std::nullopt, false).describe(),
            "BatchNorm1d(3, eps=1e-05, momentum=None, affine=False, track_running_stats=True)");
  EXPECT_EQ(LayerNorm(6).describe(), "LayerNorm((6,), eps=1e-05, elementwise_affine=True)");
  EXPECT_EQ(LayerNorm(Ints{3, 4}, 1e-3).describe(), "LayerNorm((3, 4), eps=0.001, elementwise_affine=True)");
  EXPECT_EQ(GroupNorm(2, 6).describe(), "GroupNorm(2, 6, eps=1e-05, affine=True)");
  EXPECT_EQ(LeakyReLU(0.2).describe(), "LeakyReLU(negative_slope=0.2)");
  EXPECT_EQ(GELU("tanh").describe(), "GELU(approximate='tanh')");
  EXPECT_EQ(Softmax(1).describe(), "Softmax(dim=1)");
  EXPECT_EQ(Embedding(10, 4, 2).describe(), "Embedding(10, 4, padding_idx=2)");
  EXPECT_EQ(Flatten().describe(), "Flatten(start_dim=1, end_dim=-1)");
}

// ---- Errors name the layer, the shapes and what was expected ----

TEST(LayerErrors, WrongInputShapes) {
  EXPECT_LAYER_ERROR(ValueError, Linear(5, 4).forward(zeros({3, 6})), "Linear", "5 (in_features)", "[3, 6]");
  Conv2d conv(3, 4, 3);
  EXPECT_LAYER_ERROR(ValueError, conv.forward(zeros({1, 2, 5, 5})), "Conv2d", "3 channels", "[1, 2, 5, 5]");
  EXPECT_LAYER_ERROR(ValueError, conv.forward(zeros({5, 5})), "Conv2d", "4-d", "[5, 5]");
  EXPECT_LAYER_ERROR(ValueError, Conv1d(3, 4, 3).forward(zeros({2, 4, 8})), "Conv1d", "3 channels", "[2, 4, 8]");
  EXPECT_LAYER_ERROR(ValueError, ConvTranspose2d(3, 4, 3).forward(zeros({1, 4, 5, 5})), "ConvTranspose2d", "3 channels");
  EXPECT_LAYER_ERROR(ValueError, MaxPool2d(2).forward(zeros({4, 4})), "MaxPool2d", "[4, 4]");
  EXPECT_LAYER_ERROR(ValueError, BatchNorm2d(3).forward(zeros({2, 4, 5, 5})), "BatchNorm2d", "3 channels",
                     "[2, 4, 5, 5]");
  EXPECT_LAYER_ERROR(ValueError, BatchNorm2d(3).forward(zeros({2, 3})), "BatchNorm2d", "4-d", "[2, 3]");
  EXPECT_LAYER_ERROR(ValueError, BatchNorm1d(3).forward(zeros({1, 3})), "BatchNorm1d", "more than 1 value per channel");
  EXPECT_LAYER_ERROR(ValueError, LayerNorm(Ints{3, 4}).forward(zeros({2, 4, 3})), "LayerNorm", "[3, 4]", "[2, 4, 3]");
  EXPECT_LAYER_ERROR(ValueError, GroupNorm(2, 6).forward(zeros({2, 4, 3})), "GroupNorm", "6", "[2, 4, 3]");
}

TEST(LayerErrors, BadConstructorArguments) {
  EXPECT_LAYER_ERROR(ValueError, Conv2d(3, 4, 3, 1, 0, 1, 2), "Conv2d", "groups=2", "in_channels=3");
  EXPECT_LAYER_ERROR(ValueError, Conv2d(3, 4, 3, 2, "same"), "Conv2d", "'same'", "strided");
  EXPECT_LAYER_ERROR(ValueError, Conv2d(3, 4, Ints{3, 3, 3}), "Conv2d", "kernel_size", "1 or 2 values");
  EXPECT_LAYER_ERROR(ValueError, Conv2d(3, 4, 0), "Conv2d", "kernel_size", ">= 1");
  EXPECT_LAYER_ERROR(ValueError, Conv2d(3, 4, 3, 1, "full"), "padding", "'same' or 'valid'", "full");
  EXPECT_LAYER_ERROR(ValueError, ConvTranspose2d(3, 4, 3, 1, 0, 1), "ConvTranspose2d", "output_padding");
  EXPECT_LAYER_ERROR(ValueError, MaxPool2d(2, Ints{}, 2), "MaxPool2d", "padding", "half");
  EXPECT_LAYER_ERROR(ValueError, GroupNorm(4, 6), "GroupNorm", "num_groups (4)");
  EXPECT_LAYER_ERROR(ValueError, Dropout(1.5), "Dropout", "[0, 1]", "1.5");
  EXPECT_LAYER_ERROR(ValueError, GELU("fast"), "GELU", "'none' or 'tanh'", "fast");
  EXPECT_LAYER_ERROR(IndexError, Embedding(10, 4, 10), "Embedding", "padding_idx 10");
}

TEST(LayerErrors, EmbeddingIndices) {
  Embedding emb(10, 4);
  EXPECT_LAYER_ERROR(IndexError, emb.forward(tensor(std::vector<int64_t>{1, 10}, {2})), "Embedding", "index 10",
                     "10 embeddings");
  EXPECT_LAYER_ERROR(IndexError, emb.forward(tensor(std::vector<int64_t>{-1}, {1})), "Embedding", "index -1");
  EXPECT_LAYER_ERROR(TypeError, emb.forward(zeros({2})), "Embedding", "int64 or int32", "float32");
}

TEST(LayerErrors, Initialisers) {
  EXPECT_LAYER_ERROR(ValueError, init::calculate_gain("swish"), "calculate_gain", "swish", "known:", "leaky_relu");
  EXPECT_LAYER_ERROR(ValueError, init::kaiming_uniform_(empty({5})), "calculate_fan_in_and_fan_out", "[5]");
  EXPECT_LAYER_ERROR(ValueError, init::kaiming_normal_(empty({5, 5}), 0, "fan_avg"), "kaiming_normal_", "fan_avg");
  EXPECT_LAYER_ERROR(TypeError, init::uniform_(zeros({3}, kInt64)), "uniform_", "int64");
}

TEST(Layers, SkipStashAndAddAreAResidualConnection) {
  // y = W2 tanh(W1 x) + W1 x: a skip from after the first Linear to after the second.
  manual_seed(3);
  auto l1 = std::make_shared<Linear>(4, 4), l2 = std::make_shared<Linear>(4, 4);
  Sequential net;
  net.add(l1).add(std::make_shared<SkipStash>("h")).add(std::make_shared<Tanh>()).add(l2);
  net.add(std::make_shared<SkipAdd>("h"));
  Tensor x = randn({2, 4});
  Tensor h = l1->forward(x);
  EXPECT_LE(amax(abs(net.forward(x) - (l2->forward(tanh(h)) + h))).item(), 1e-6);
  Sequential cat;
  cat.add(std::make_shared<SkipStash>("in")).add(std::make_shared<Tanh>()).add(std::make_shared<SkipConcat>("in", 1));
  EXPECT_LE(amax(abs(cat.forward(x) - concat({tanh(x), x}, 1))).item(), 0.0);
}

TEST(Layers, SkipErrorsNameTheSkip) {
  Tensor x = randn({2, 4});
  Sequential missing;
  missing.add(std::make_shared<Tanh>()).add(std::make_shared<SkipAdd>("h"));
  EXPECT_LAYER_ERROR(ValueError, missing.forward(x), "SkipAdd('h')", "nothing is stashed", "SkipStash('h')");
  Sequential unused;
  unused.add(std::make_shared<SkipStash>("h")).add(std::make_shared<Tanh>());
  EXPECT_LAYER_ERROR(ValueError, unused.forward(x), "stashed but never used", "'h'");
  Sequential twice;
  twice.add(std::make_shared<SkipStash>("h")).add(std::make_shared<SkipStash>("h"));
  EXPECT_LAYER_ERROR(ValueError, twice.forward(x), "SkipStash('h')", "already stashed");
  Sequential shape;
  shape.add(std::make_shared<SkipStash>("h")).add(std::make_shared<Linear>(4, 3)).add(std::make_shared<SkipAdd>("h"));
  EXPECT_LAYER_ERROR(ValueError, shape.forward(x), "SkipAdd('h')", "[2, 3]", "[2, 4]");
  // A failed forward leaves no stale stash behind: the next forward of a good model works.
  Sequential ok;
  ok.add(std::make_shared<SkipStash>("h")).add(std::make_shared<SkipAdd>("h"));
  EXPECT_LE(amax(abs(ok.forward(x) - x * 2.0)).item(), 0.0);
}


// Note [Layer options]: each options constructor builds the layer its positional one builds (the
// same configuration as PyTorch prints it, the same parameters in name and shape), for settings
// away from every default.
TEST(LayerOptions, EqualThePositionalConstructors) {
  auto same = [](const Module& a, const Module& b) {
    EXPECT_EQ(a.describe(), b.describe());
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    ASSERT_EQ(pa.size(), pb.size()) << a.describe();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i].first, pb[i].first) << a.describe();
      EXPECT_EQ(pa[i].second.shape(), pb[i].second.shape()) << a.describe() << " " << pa[i].first;
    }
  };
  same(Conv1d(4, 6, 3, {.stride = 2, .padding = 1, .dilation = 2, .groups = 2, .bias = false}),
       Conv1d(4, 6, 3, 2, 1, 2, 2, false));
  same(Conv2d(4, 6, {3, 5}, {.stride = {2, 1}, .padding = {1, 2}, .dilation = 2, .groups = 2, .bias = false}),
       Conv2d(4, 6, {3, 5}, {2, 1}, {1, 2}, 2, 2, false));
  same(Conv2d(3, 8, 3, {.padding = 1, .bias = false}), Conv2d(3, 8, 3, 1, 1, 1, 1, false));
  same(Conv2d(3, 8, 3, Conv2dOptions{.padding = 1}), Conv2d(3, 8, 3, 1, 1));  // one field: see the Note
  same(ConvTranspose2d(4, 6, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2, .bias = false, .dilation = 1}),
       ConvTranspose2d(4, 6, 3, 2, 1, 1, 2, false, 1));
  same(MaxPool2d(3, {.stride = 2, .padding = 1, .dilation = 1, .ceil_mode = true}), MaxPool2d(3, 2, 1, 1, true));
  same(AvgPool2d(3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false}),
       AvgPool2d(3, 2, 1, true, false));
  same(BatchNorm2d(8, {.eps = 1e-3, .momentum = std::nullopt, .affine = false, .track_running_stats = true}),
       BatchNorm2d(8, 1e-3, std::nullopt, false, true));
  same(BatchNorm1d(8, {.eps = 1e-4, .momentum = 0.2}), BatchNorm1d(8, 1e-4, 0.2));
  same(BatchNorm1d(8, BatchNormOptions{.affine = false}), BatchNorm1d(8, 1e-5, 0.1, false));
  same(MultiheadAttention(8, 2, {.dropout = 0.1, .bias = false, .batch_first = true}),
       MultiheadAttention(8, 2, 0.1, false, true));
  same(TransformerEncoderLayer(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .activation = "gelu",
                                      .layer_norm_eps = 1e-6, .batch_first = true, .norm_first = true}),
       TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", 1e-6, true, true));
  same(LSTM(5, 7, {.num_layers = 2, .bias = false, .batch_first = true, .dropout = 0.0, .bidirectional = true}),
       LSTM(5, 7, 2, false, true, 0.0, true));
  same(GRU(5, 7, {.num_layers = 2, .bidirectional = true}), GRU(5, 7, 2, true, false, 0.0, true));
  same(MaxPool2d(3, MaxPool2dOptions{.stride = 2}), MaxPool2d(3, 2));
}

// Note [Layer config]: config() gives back what the constructor got, sizes expanded per axis.
TEST(LayerConfig, ReturnsTheConstructorArguments) {
  Conv2dConfig c = Conv2d(4, 8, {3, 5}, Conv2dOptions{.stride = 2, .padding = {1, 2}, .groups = 2, .bias = false}).config();
  EXPECT_EQ(c.in_channels, 4);
  EXPECT_EQ(c.out_channels, 8);
  EXPECT_EQ(c.kernel_size, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(c.options.stride.values(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.options.padding.sizes().values(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.options.dilation.values(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(c.options.groups, 2);
  EXPECT_FALSE(c.options.bias);
  EXPECT_TRUE(Conv1d(2, 2, 3, Conv1dOptions{.padding = "same"}).config().options.padding.is_same());
  EXPECT_EQ(MaxPool2d(3).config().options.stride.values(), (std::vector<int64_t>{3, 3}));  // stride defaults to the kernel
  BatchNormConfig b = BatchNorm2d(6, BatchNormOptions{.momentum = std::nullopt, .affine = false}).config();
  EXPECT_EQ(b.num_features, 6);
  EXPECT_FALSE(b.options.momentum.has_value());
  EXPECT_FALSE(b.options.affine);
  EXPECT_TRUE(b.options.track_running_stats);
  EXPECT_EQ(Linear(3, 2, false).config().bias, false);
  EXPECT_EQ(LayerNorm({4, 5}, 1e-3).config().normalized_shape, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(GELU("tanh").config().approximate, "tanh");
  EXPECT_EQ(Flatten(2, 3).config().end_dim, 3);
  RNNConfig r = LSTM(3, 5, RNNOptions{.num_layers = 2, .bidirectional = true}).config();
  EXPECT_EQ(r.hidden_size, 5);
  EXPECT_EQ(r.options.num_layers, 2);
  EXPECT_TRUE(r.options.bidirectional);
  EXPECT_EQ(TransformerEncoderLayer(8, 2, TransformerEncoderLayerOptions{.dim_feedforward = 16, .norm_first = true})
                .config().options.dim_feedforward,
            16);
}

}  // namespace
}  // namespace braid
