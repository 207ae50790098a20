// Loss tests: outputs and gradients against PyTorch for every option combination
// (tests/data/loss_reference.txt, from make_optim_reference.py), float64 central-difference
// gradient checks, closed forms for the numerically delicate cases, and the error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "braid/nn/loss.h"
#include "error_of.h"
#include "gradcheck.h"
#include "reference_file.h"
#include "test_paths.h"

namespace braid {
namespace {

using testing::RefCase;

const std::vector<RefCase>& loss_cases() {
  static const std::vector<RefCase> cases = testing::load_reference(std::string(braid::test::data_dir()) + "/loss_reference.txt");
  return cases;
}

const RefCase& find_case(const std::string& name) {
  for (const RefCase& c : loss_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no reference case " + name);
}

Tensor optional_tensor(const RefCase& c, const std::string& key) { return c.has_tensor(key) ? c.tensor(key) : Tensor(); }

Tensor run_loss(const RefCase& c, const Tensor& input, const Tensor& target) {
  const std::string loss = c.str("loss"), red = c.str("reduction");
  if (loss == "cross_entropy")
    return nn::cross_entropy(input, target, optional_tensor(c, "weight"), static_cast<int64_t>(c.num("ignore_index")),
                             red, c.num("label_smoothing"));
  if (loss == "nll_loss")
    return nn::nll_loss(input, target, optional_tensor(c, "weight"), static_cast<int64_t>(c.num("ignore_index")), red);
  if (loss == "mse_loss") return nn::mse_loss(input, target, red);
  if (loss == "l1_loss") return nn::l1_loss(input, target, red);
  if (loss == "smooth_l1_loss") return nn::smooth_l1_loss(input, target, red, c.num("beta"));
  if (loss == "bce_with_logits")
    return nn::binary_cross_entropy_with_logits(input, target, optional_tensor(c, "weight"), red,
                                                optional_tensor(c, "pos_weight"));
  throw std::runtime_error("unknown loss " + loss);
}

class LossReference : public ::testing::TestWithParam<std::string> {};

TEST_P(LossReference, MatchesPyTorch) {
  const RefCase& c = find_case(GetParam());
  const bool f32 = c.ref("input").dtype == "float32";
  // float64 agrees to rounding; float32 log-softmax and reductions differ from PyTorch's by a few ulp.
  const double rtol = f32 ? 2e-5 : 1e-10, atol = f32 ? 2e-6 : 1e-12;
  Tensor input = c.tensor("input").set_requires_grad(true);
  Tensor target = c.tensor("target");
  if (c.has_tensor("target_grad")) target.set_requires_grad(true);
  Tensor out = run_loss(c, input, target);
  out.backward(c.tensor("grad_out"));
  std::string where;
  EXPECT_LE(testing::tolerance_ratio(out, c.ref("output"), rtol, atol, &where), 1.0) << "output " << where;
  EXPECT_LE(testing::tolerance_ratio(input.grad(), c.ref("input_grad"), rtol, atol, &where), 1.0)
      << "input gradient " << where;
  if (c.has_tensor("target_grad")) {
    ASSERT_TRUE(target.grad().defined());
    EXPECT_LE(testing::tolerance_ratio(target.grad(), c.ref("target_grad"), rtol, atol, &where), 1.0)
        << "target gradient " << where;
  }
}

INSTANTIATE_TEST_SUITE_P(PyTorch, LossReference, ::testing::ValuesIn(testing::reference_names(loss_cases(), "")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

// The loss modules (Note [Loss modules]) built from each case's settings give PyTorch's values.
std::shared_ptr<nn::Loss> loss_module(const RefCase& c) {
  const std::string loss = c.str("loss"), red = c.str("reduction");
  if (loss == "cross_entropy")
    return std::make_shared<nn::CrossEntropyLoss>(optional_tensor(c, "weight"), static_cast<int64_t>(c.num("ignore_index")),
                                                  red, c.num("label_smoothing"));
  if (loss == "nll_loss")
    return std::make_shared<nn::NLLLoss>(optional_tensor(c, "weight"), static_cast<int64_t>(c.num("ignore_index")), red);
  if (loss == "mse_loss") return std::make_shared<nn::MSELoss>(red);
  if (loss == "l1_loss") return std::make_shared<nn::L1Loss>(red);
  if (loss == "smooth_l1_loss") return std::make_shared<nn::SmoothL1Loss>(red, c.num("beta"));
  if (loss == "bce_with_logits")
    return std::make_shared<nn::BCEWithLogitsLoss>(optional_tensor(c, "weight"), red, optional_tensor(c, "pos_weight"));
  throw std::runtime_error("unknown loss " + loss);
}

class LossModuleReference : public ::testing::TestWithParam<std::string> {};

TEST_P(LossModuleReference, MatchesPyTorch) {
  const RefCase& c = find_case(GetParam());
  const bool f32 = c.ref("input").dtype == "float32";
  const double rtol = f32 ? 2e-5 : 1e-10, atol = f32 ? 2e-6 : 1e-12;
  Tensor input = c.tensor("input").set_requires_grad(true);
  std::shared_ptr<nn::Loss> m = loss_module(c);
  Tensor out = (*m)(input, c.tensor("target"));
  out.backward(c.tensor("grad_out"));
  std::string where;
  EXPECT_LE(testing::tolerance_ratio(out, c.ref("output"), rtol, atol, &where), 1.0) << "output " << where;
  EXPECT_LE(testing::tolerance_ratio(input.grad(), c.ref("input_grad"), rtol, atol, &where), 1.0)
      << "input gradient " << where;
}

INSTANTIATE_TEST_SUITE_P(PyTorch, LossModuleReference, ::testing::ValuesIn(testing::reference_names(loss_cases(), "")),
                         [](const auto& info) { return testing::gtest_name(info.param); });

TEST(LossModules, KeepWeightsAsBuffersAndCheckTheirSettings) {
  const Tensor w = tensor(std::vector<double>{0.5, 2.0}, {2});
  nn::CrossEntropyLoss ce(w, -100, "sum");
  const nn::StateDict sd = ce.state_dict();
  ASSERT_EQ(sd.size(), 1u);
  EXPECT_EQ(sd.at("weight").to_vector<double>(), (std::vector<double>{0.5, 2.0}));
  EXPECT_EQ(ce.describe(), "CrossEntropyLoss(reduction='sum')");
  // -log softmax([0, 0])[1] * 2.0: 2 log 2.
  EXPECT_NEAR(ce(zeros({1, 2}, kFloat64), tensor(std::vector<int64_t>{1}, {1})).item(), 2.0 * std::log(2.0), 1e-12);
  nn::BCEWithLogitsLoss bce(Tensor(), "mean", tensor(std::vector<double>{3.0}, {1}));
  EXPECT_EQ(bce.state_dict().count("pos_weight"), 1u);
  EXPECT_TRUE(nn::MSELoss().state_dict().empty());
  EXPECT_NE(error_of<ValueError>([] { nn::L1Loss("avg"); }).find("L1Loss: unknown reduction 'avg'"), std::string::npos);
  // What a Sequential would call: Module::forward with one input.
  std::shared_ptr<nn::Module> mse = std::make_shared<nn::MSELoss>();
  EXPECT_NE(error_of<TypeError>([&] { mse->forward(zeros({2, 3})); }).find("MSELoss.forward: a loss takes (input, target)"),
            std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { nn::MSELoss()(zeros({2}), zeros({3})); }).find("mse_loss"), std::string::npos);
}

TEST(LossReferenceFile, CoversEveryLossAndReduction) {
  std::map<std::string, std::set<std::string>> seen;
  for (const RefCase& c : loss_cases()) seen[c.str("loss")].insert(c.str("reduction"));
  for (const char* loss : {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "bce_with_logits"})
    EXPECT_EQ(seen[loss], (std::set<std::string>{"none", "mean", "sum"})) << loss;
}

// ---- float64 central differences ----

struct GradCase {
  std::string name;
  std::vector<Shape> shapes;
  testing::Fn f;
};

using V = const std::vector<Tensor>&;

Tensor classes(std::vector<int64_t> v, Shape s) { return tensor(v, s); }
Tensor probs(Shape s, uint64_t seed) {
  Generator g(seed);
  return softmax(randn(s, kFloat64, &g), 1);
}

std::vector<GradCase> grad_cases() {
  const Tensor t5 = classes({0, 3, -100, 2, 1}, {5});
  const Tensor t_kdim = classes({0, 2, 1, -1, 2, 0, 1, 1, -1, 0, 2, 2}, {2, 2, 3});
  const Tensor w4 = tensor(std::vector<double>{0.5, 1.5, 1.0, 2.0}, {4});
  const Tensor w3 = tensor(std::vector<double>{0.7, 1.3, 2.0}, {3});
  return {
      {"ce_mean", {{5, 4}}, [=](V x) { return nn::cross_entropy(x[0], t5); }},
      {"ce_none_weight", {{5, 4}}, [=](V x) { return nn::cross_entropy(x[0], t5, w4, -100, "none"); }},
      {"ce_mean_weight_smoothing", {{5, 4}}, [=](V x) { return nn::cross_entropy(x[0], t5, w4, -100, "mean", 0.2); }},
      {"ce_sum_ignore_class", {{5, 4}}, [=](V x) { return nn::cross_entropy(x[0], classes({0, 3, 1, 2, 1}, {5}), w4, 1, "sum", 0.1); }},
      {"ce_kdim", {{2, 3, 2, 3}}, [=](V x) { return nn::cross_entropy(x[0], t_kdim, w3, -1, "mean", 0.3); }},
      {"ce_unbatched", {{4}}, [=](V x) { return nn::cross_entropy(x[0], classes({2}, {}), w4, -100, "mean", 0.1); }},
      // Probability targets: both the logits and the target get gradients.
      {"ce_prob", {{3, 4}, {3, 4}}, [](V x) { return nn::cross_entropy(x[0], softmax(x[1], 1)); }},
      {"ce_prob_weight_smoothing_none", {{3, 4}, {3, 4}},
       [=](V x) { return nn::cross_entropy(x[0], softmax(x[1], 1), w4, -100, "none", 0.25); }},
      {"ce_prob_kdim_sum", {{2, 3, 4}}, [=](V x) { return nn::cross_entropy(x[0], probs({2, 3, 4}, 7), w3, -100, "sum", 0.1); }},
      {"nll_mean_weight", {{5, 4}}, [=](V x) { return nn::nll_loss(x[0], t5, w4); }},
      {"nll_kdim_none", {{2, 3, 2, 3}}, [=](V x) { return nn::nll_loss(x[0], t_kdim, Tensor(), -1, "none"); }},
      {"mse_mean", {{3, 4}, {3, 4}}, [](V x) { return nn::mse_loss(x[0], x[1]); }},
      {"mse_none", {{3, 4}, {3, 4}}, [](V x) { return nn::mse_loss(x[0], x[1], "none"); }},
      {"l1_sum", {{3, 4}, {3, 4}}, [](V x) { return nn::l1_loss(x[0], x[1], "sum"); }},
      {"smooth_l1_mean", {{4, 5}, {4, 5}}, [](V x) { return nn::smooth_l1_loss(x[0], x[1], "mean", 1.0); }},
      {"smooth_l1_none_beta", {{4, 5}, {4, 5}}, [](V x) { return nn::smooth_l1_loss(x[0], x[1], "none", 0.3); }},
      {"bce_mean", {{3, 4}, {3, 4}}, [](V x) { return nn::binary_cross_entropy_with_logits(x[0], sigmoid(x[1])); }},
      {"bce_weight_pos_weight_none", {{3, 4}, {3, 4}, {4}, {3, 1}},
       [](V x) { return nn::binary_cross_entropy_with_logits(x[0], sigmoid(x[1]), x[3], "none", exp(x[2])); }},
      {"bce_pos_weight_sum_large", {{2, 3}},
       [](V x) {
         Tensor far = tensor(std::vector<double>{30, -40, 0, 25, -30, 5}, {2, 3});
         return nn::binary_cross_entropy_with_logits(x[0] + far, tensor(std::vector<double>{0.2, 0.9, 0.5, 1, 0, 0.3}, {2, 3}),
                                                     Tensor(), "sum", tensor(std::vector<double>{2.0, 0.5, 3.0}, {3}));
       }},
  };
}

class LossGradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(LossGradCheck, MatchesCentralDifferences) {
  const GradCase& c = GetParam();
  Generator gen(99);
  std::vector<Tensor> inputs;
  for (const Shape& s : c.shapes) inputs.push_back(randn(s, kFloat64, &gen));
  std::string where;
  const double err = testing::gradcheck_error(c.f, inputs, 1e-6, &where);
  // l1 and smooth l1 have kinks at |d| = 0 and beta; random normal inputs stay well away from them.
  EXPECT_LE(err, 1e-6) << c.name << ": worst at " << where;
}

INSTANTIATE_TEST_SUITE_P(Losses, LossGradCheck, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- closed forms ----

TEST(LossClosedForm, CrossEntropyOfEqualLogitsIsLogC) {
  Tensor x = zeros({4, 7}, kFloat64).set_requires_grad(true);
  Tensor loss = nn::cross_entropy(x, classes({0, 6, 3, 3}, {4}));
  EXPECT_NEAR(loss.item(), std::log(7.0), 1e-15);
  loss.backward();
  // d/dx = (softmax - onehot) / N: 1/28 off target, (1/7 - 1)/4 on it.
  std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[0], (1.0 / 7 - 1) / 4, 1e-15);
  EXPECT_NEAR(g[1], 1.0 / 28, 1e-15);
}

TEST(LossClosedForm, AllTargetsIgnoredMeanIsNaN) {
  Tensor loss = nn::cross_entropy(zeros({2, 3}), classes({-100, -100}, {2}));
  EXPECT_TRUE(std::isnan(loss.item()));
  EXPECT_EQ(nn::cross_entropy(zeros({2, 3}), classes({-100, -100}, {2}), Tensor(), -100, "sum").item(), 0.0);
}

TEST(LossClosedForm, CrossEntropyLargeLogitsFloat32StaysFinite) {
  // log_softmax of (200, -200, 0) at class 1 is -400; exp would overflow float32.
  Tensor x = tensor(std::vector<float>{200, -200, 0}, {1, 3}).set_requires_grad(true);
  Tensor loss = nn::cross_entropy(x, classes({1}, {1}));
  EXPECT_FLOAT_EQ(static_cast<float>(loss.item()), 400.0f);
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, -1, 0}));
}

TEST(LossClosedForm, BceWithLogitsLargeLogitsFloat32) {
  // loss(x, t) = (1 - t) x + softplus(-x): at x = 100, t = 0 it is 100; at x = -100, t = 1 also 100;
  // at x = 100, t = 1 it is softplus(-100) = 3.72e-44 (a float32 denormal), not 0 and not NaN.
  Tensor x = tensor(std::vector<float>{100, -100, 100}, {3}).set_requires_grad(true);
  Tensor t = tensor(std::vector<float>{0, 1, 1}, {3});
  Tensor loss = nn::binary_cross_entropy_with_logits(x, t, Tensor(), "none");
  std::vector<float> l = loss.to_vector<float>();
  EXPECT_FLOAT_EQ(l[0], 100.0f);
  EXPECT_FLOAT_EQ(l[1], 100.0f);
  EXPECT_NEAR(l[2], std::exp(-100.0), 1e-45);
  sum(loss).backward();
  // d/dx = sigmoid(x) - t.
  std::vector<float> g = x.grad().to_vector<float>();
  EXPECT_FLOAT_EQ(g[0], 1.0f);
  EXPECT_FLOAT_EQ(g[1], -1.0f);
  EXPECT_NEAR(g[2], 0.0f, 1e-30);
}

TEST(LossClosedForm, SmoothL1Branches) {
  Tensor x = tensor(std::vector<double>{0.2, -3.0, 0.5}, {3});
  std::vector<double> l = nn::smooth_l1_loss(x, zeros({3}, kFloat64), "none", 0.5).to_vector<double>();
  EXPECT_DOUBLE_EQ(l[0], 0.5 * 0.04 / 0.5);
  EXPECT_DOUBLE_EQ(l[1], 3.0 - 0.25);
  EXPECT_DOUBLE_EQ(l[2], 0.5 - 0.25);  // |d| = beta takes the linear branch, as PyTorch
}

// ---- errors ----

template <typename E, typename F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(LossErrors, TargetShapeMismatchNamesLossAndShapes) {
  std::string m = message_of<ValueError>([] { nn::cross_entropy(zeros({3, 4, 5}), zeros({3, 4}, kInt64)); });
  EXPECT_NE(m.find("cross_entropy"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 4, 5]"), std::string::npos) << m;
  EXPECT_NE(m.find("expected [3, 5]"), std::string::npos) << m;
  m = message_of<ValueError>([] { nn::mse_loss(zeros({4}), zeros({4, 1})); });
  EXPECT_NE(m.find("mse_loss: target shape [4, 1] does not match input shape [4]"), std::string::npos) << m;
  m = message_of<ValueError>([] { nn::cross_entropy(zeros({2, 3}), zeros({2, 4})); });
  EXPECT_NE(m.find("class-probability target"), std::string::npos) << m;
}

TEST(LossErrors, ClassIndexOutOfRangeNamesIndexAndClasses) {
  std::string m = message_of<IndexError>([] { nn::cross_entropy(zeros({3, 5}), classes({1, 7, 2}, {3})); });
  EXPECT_NE(m.find("cross_entropy: target class index 7"), std::string::npos) << m;
  EXPECT_NE(m.find("position 1"), std::string::npos) << m;
  EXPECT_NE(m.find("5 classes"), std::string::npos) << m;
  m = message_of<IndexError>([] { nn::nll_loss(zeros({2, 5}), classes({-3, 0}, {2})); });
  EXPECT_NE(m.find("nll_loss: target class index -3"), std::string::npos) << m;
}

TEST(LossErrors, BadOptions) {
  std::string m = message_of<ValueError>([] { nn::l1_loss(zeros({2}), zeros({2}), "avg"); });
  EXPECT_NE(m.find("l1_loss: unknown reduction 'avg'; known: none, mean, sum"), std::string::npos) << m;
  m = message_of<ValueError>([] { nn::cross_entropy(zeros({2, 3}), classes({0, 1}, {2}), ones({4})); });
  EXPECT_NE(m.find("weight must be 1-d with one entry per class (3), got shape [4]"), std::string::npos) << m;
  m = message_of<ValueError>([] { nn::cross_entropy(zeros({2, 3}), classes({0, 1}, {2}), Tensor(), -100, "mean", 1.5); });
  EXPECT_NE(m.find("label_smoothing must be in [0, 1]"), std::string::npos) << m;
  m = message_of<TypeError>([] { nn::cross_entropy(zeros({2, 3}), tensor_bool({true, false}, {2})); });
  EXPECT_NE(m.find("int64"), std::string::npos) << m;
  m = message_of<ValueError>([] { nn::binary_cross_entropy_with_logits(zeros({2, 3}), zeros({2, 3}), Tensor(), "mean", ones({2})); });
  EXPECT_NE(m.find("pos_weight"), std::string::npos) << m;
}

}  // namespace
}  // namespace braid
