// torch.autocast's op lists, held to braid's autocast op by op: the dtype each op returns inside a
// scope on the device under test. The lists are PyTorch's own (tests/data/autocast_lists.txt, made by
// make_autocast_lists.py from torch.testing's AutocastTestLists, the lists PyTorch's CUDA tests
// check). Note [Autocast] in src/ops/autocast.cpp: on a GPU the lower-precision list returns the
// scope's dtype, as PyTorch's CUDA autocast does; the CPU returns float32 there (braid's rule for a
// device whose half arithmetic widens anyway). Every other list is the same on every device. And a
// bfloat16 and a float16 training run, under either rule, must track float32 training of one model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "braid/amp.h"
#include "braid/conv.h"
#include "braid/nn/layers.h"
#include "braid/nn/loss.h"
#include "braid/ops.h"
#include "braid/nn/nn.h"
#include "braid/random.h"
#include "braid/optim.h"
#include "test_device.h"
#include "test_paths.h"

namespace braid {
namespace {

// op -> list ("lower", "float32", "promote" or "builtin_promote").
const std::map<std::string, std::string>& torch_lists() {
  static const std::map<std::string, std::string> lists = [] {
    std::map<std::string, std::string> m;
    for (const std::vector<std::string>& row : test::data_rows("autocast_lists.txt")) m[row.at(1)] = row.at(0);
    return m;
  }();
  return lists;
}

// Whether the device follows PyTorch's CUDA rule (test_device.h).
bool gpu_rule(const Device& d) { return test::autocast_keeps_half(d); }

Tensor input(const Shape& s, DType t, double lo = -1, double hi = 1) {
  return rand(s, kFloat32, nullptr, lo, hi, test::test_device()).to(t);
}

struct Case {
  const char* op;  // PyTorch's name in the lists
  // Runs braid's op on inputs of the dtype PyTorch's list gives it (float32 for the lower-precision
  // list, the half dtype for the float32 list, both for the promote lists).
  std::function<Tensor(DType half)> run;
};

std::vector<Case> listed_cases() {
  const Shape mat{8, 8};
  return {
      // lower-precision list: float32 operands
      {"matmul", [=](DType) { return matmul(input(mat, kFloat32), input(mat, kFloat32)); }},
      {"mm", [=](DType) { return matmul(input(mat, kFloat32), input(mat, kFloat32)); }},
      {"bmm", [](DType) { return matmul(input({2, 8, 8}, kFloat32), input({2, 8, 8}, kFloat32)); }},
      {"__matmul__", [=](DType) { return matmul(input(mat, kFloat32), input(mat, kFloat32)); }},
      {"linear", [=](DType) { return nn::linear(input(mat, kFloat32), input(mat, kFloat32), input({8}, kFloat32)); }},
      {"conv1d", [](DType) { return conv1d(input({2, 4, 8}, kFloat32), input({4, 4, 3}, kFloat32)); }},
      {"conv2d", [](DType) { return conv2d(input({2, 4, 8, 8}, kFloat32), input({4, 4, 3, 3}, kFloat32)); }},
      {"conv_transpose2d",
       [](DType) { return conv_transpose2d(input({2, 4, 8, 8}, kFloat32), input({4, 4, 3, 3}, kFloat32)); }},
      // float32 list: half operands
      {"exp", [](DType h) { return exp(input({8}, h)); }},
      {"expm1", [](DType h) { return expm1(input({8}, h)); }},
      {"log", [](DType h) { return log(input({8}, h, 0.1, 2)); }},
      {"log1p", [](DType h) { return log1p(input({8}, h)); }},
      {"reciprocal", [](DType h) { return reciprocal(input({8}, h, 0.5, 2)); }},
      {"rsqrt", [](DType h) { return rsqrt(input({8}, h, 0.5, 2)); }},
      {"acos", [](DType h) { return acos(input({8}, h, -0.9, 0.9)); }},
      {"asin", [](DType h) { return asin(input({8}, h, -0.9, 0.9)); }},
      {"pow", [](DType h) { return pow(input({8}, h, 1, 2), input({8}, h)); }},
      {"__pow__", [](DType h) { return pow(input({8}, h, 1, 2), 1.5); }},
      {"softmax", [](DType h) { return softmax(input({8}, h), 0); }},
      {"log_softmax", [](DType h) { return log_softmax(input({8}, h), 0); }},
      {"layer_norm", [](DType h) { return layer_norm(input({8}, h), 1); }},
      {"prod", [](DType h) { return prod(input({8}, h)); }},
      {"sum", [=](DType h) { return sum(input(mat, h), {1}); }},
      {"logsumexp", [=](DType h) { return logsumexp(input(mat, h), {1}); }},
      {"softplus", [](DType h) { return softplus(input({8}, h)); }},
      {"group_norm", [](DType h) { return nn::GroupNorm(2, 4).forward(input({2, 4, 3}, h)); }},
      {"binary_cross_entropy_with_logits",
       [=](DType h) { return nn::binary_cross_entropy_with_logits(input(mat, h), input(mat, h, 0, 1)); }},
      {"nll_loss", [=](DType) { return nn::nll_loss(input(mat, kFloat32), zeros({8}, kInt64, test::test_device())); }},
      {"l1_loss", [=](DType h) { return nn::l1_loss(input(mat, h), input(mat, h)); }},
      {"smooth_l1_loss", [=](DType h) { return nn::smooth_l1_loss(input(mat, h), input(mat, h)); }},
      {"mse_loss", [=](DType h) { return nn::mse_loss(input(mat, h), input(mat, h)); }},
      // ops whose own promotion autocast relies on: a float32 and a half operand
      {"add", [](DType h) { return add(input({8}, kFloat32), input({8}, h)); }},
      {"mul", [](DType h) { return mul(input({8}, kFloat32), input({8}, h)); }},
      {"div", [](DType h) { return div(input({8}, kFloat32), input({8}, h, 0.5, 2)); }},
      {"eq", [](DType h) { return eq(input({8}, kFloat32), input({8}, h)); }},
      {"lt", [](DType h) { return lt(input({8}, kFloat32), input({8}, h)); }},
      {"cat", [](DType h) { return concat({input({8}, h), input({8}, kFloat32)}, 0); }},
      {"stack", [](DType h) { return stack({input({8}, h), input({8}, kFloat32)}, 0); }},
      {"scatter_add",
       [](DType h) {
         return scatter_add(zeros({2, 2}, kFloat32, test::test_device()), 0, zeros({2, 2}, kInt64, test::test_device()),
                            input({2, 2}, h));
       }},
  };
}

// The dtype PyTorch's list gives, on this device, inside a scope of dtype half.
DType expected(const std::string& list, const std::string& op, DType half) {
  if (list == "lower") return gpu_rule(test::test_device()) ? half : kFloat32;
  if (op == "eq" || op == "lt") return kBool;
  return kFloat32;  // the float32 list, and the widest of a float32 and a half operand
}

class AutocastLists : public ::testing::TestWithParam<DType> {};

TEST_P(AutocastLists, EveryListedOpReturnsTorchsDtype) {
  const DType half = GetParam();
  const auto& lists = torch_lists();
  for (const Case& c : listed_cases()) {
    const auto it = lists.find(c.op);
    ASSERT_NE(it, lists.end()) << c.op << " is not on any of PyTorch's autocast lists";
    Tensor y;
    {
      autocast scope(half);
      y = c.run(half);
    }
    EXPECT_EQ(y.dtype(), expected(it->second, c.op, half))
        << c.op << " (" << it->second << " list) under autocast(" << dtype_name(half) << ") on "
        << test::test_device().str();
  }
}

// PyTorch's scaled_dot_product_attention (2.0 and later) is on the CUDA lower-precision list
// (aten/src/ATen/autocast_mode.cpp); the test lists of the PyTorch that made the file predate it.
TEST_P(AutocastLists, AttentionIsOnTheLowerPrecisionList) {
  const DType half = GetParam();
  autocast scope(half);
  const Tensor q = input({2, 4, 8}, kFloat32);
  EXPECT_EQ(scaled_dot_product_attention(q, q, q).dtype(), gpu_rule(test::test_device()) ? half : kFloat32);
}

// cross_entropy is log_softmax then nll_loss in PyTorch, both on the float32 list.
TEST_P(AutocastLists, CrossEntropyOfHalfLogitsIsFloat32) {
  const DType half = GetParam();
  ASSERT_EQ(torch_lists().at("log_softmax"), "float32");
  ASSERT_EQ(torch_lists().at("nll_loss"), "float32");
  autocast scope(half);
  EXPECT_EQ(nn::cross_entropy(input({4, 8}, half), zeros({4}, kInt64, test::test_device())).dtype(), kFloat32);
}

// Ops on no list run in their inputs' dtype, a half one included (Note [Half arithmetic]).
TEST_P(AutocastLists, UnlistedOpsKeepTheHalfDtype) {
  const DType half = GetParam();
  const std::vector<Case> unlisted = {
      {"relu", [](DType h) { return relu(input({8}, h)); }},
      {"gelu", [](DType h) { return gelu(input({8}, h)); }},
      {"sigmoid", [](DType h) { return sigmoid(input({8}, h)); }},
      {"tanh", [](DType h) { return tanh(input({8}, h)); }},
      {"neg", [](DType h) { return neg(input({8}, h)); }},
      {"sqrt", [](DType h) { return sqrt(input({8}, h, 0, 2)); }},
      {"mean", [](DType h) { return mean(input({4, 8}, h), {1}); }},
      {"amax", [](DType h) { return amax(input({4, 8}, h), {1}); }},
      {"maximum", [](DType h) { return maximum(input({8}, h), input({8}, h)); }},
      {"where", [](DType h) { return where(gt(input({8}, h), input({8}, h)), input({8}, h), input({8}, h)); }},
      {"max_pool2d", [](DType h) { return max_pool2d(input({1, 2, 4, 4}, h), {2, 2}); }},
      {"avg_pool2d", [](DType h) { return avg_pool2d(input({1, 2, 4, 4}, h), {2, 2}); }},
      {"batch_norm",
       [](DType h) {
         return batch_norm_training(input({4, 2, 3}, h), ones({2}, kFloat32, test::test_device()),
                                    zeros({2}, kFloat32, test::test_device()), 1e-5)[0];
       }},
      {"dropout", [](DType h) { return nn::dropout(input({64}, h), 0.5, true); }},
      {"transpose", [](DType h) { return input({4, 8}, h).transpose(0, 1).contiguous(); }},
  };
  for (const Case& c : unlisted) {
    EXPECT_EQ(torch_lists().count(c.op), 0u) << c.op << " is on one of PyTorch's lists";
    autocast scope(half);
    EXPECT_EQ(c.run(half).dtype(), half) << c.op << " under autocast(" << dtype_name(half) << ")";
  }
}

// ---- training with autocast: half activations on a GPU's rule, float32 ones on the CPU's ----

/// Full-batch Adam on a fixed regression problem (a random teacher MLP's outputs); the loss of each
/// step. low = float32 means no autocast and no scaler.
std::vector<double> train_mlp(DType low, int steps) {
  Generator data(13);
  Tensor x = randn({256, 8}, kFloat32, &data);
  manual_seed(14);
  nn::Sequential teacher;
  teacher.add(std::make_shared<nn::Linear>(8, 16)).add(std::make_shared<nn::Tanh>());
  teacher.add(std::make_shared<nn::Linear>(16, 4));
  Tensor y;
  {
    NoGradGuard no_grad;
    y = teacher.forward(x) * 2.0;
  }
  manual_seed(15);
  nn::Sequential m;
  m.add(std::make_shared<nn::Linear>(8, 32)).add(std::make_shared<nn::Tanh>());
  m.add(std::make_shared<nn::Linear>(32, 32)).add(std::make_shared<nn::Tanh>());
  m.add(std::make_shared<nn::Linear>(32, 4));
  optim::Adam opt(m.parameters(), {.lr = 0.01});
  optim::GradScaler scaler({.enabled = low != kFloat32});
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    Tensor loss;
    {
      autocast guard(low == kFloat32 ? kBFloat16 : low, low != kFloat32);
      loss = nn::mse_loss(m.forward(x), y);
    }
    losses.push_back(loss.item());
    scaler.scale(loss).backward();
    EXPECT_TRUE(scaler.step(opt)) << dtype_name(low) << " step " << s;
    scaler.update();
  }
  return losses;
}

TEST(Amp, BFloat16AndFloat16TrainingTrackFloat32Training) {
  const int steps = 100;
  const std::vector<double> f32 = train_mlp(kFloat32, steps);
  EXPECT_LT(f32.back(), f32.front() / 20) << "float32 training must make progress for the comparison to mean much";
  for (DType low : {kBFloat16, kFloat16}) {
    const std::vector<double> l = train_mlp(low, steps);
    EXPECT_NE(l, f32) << dtype_name(low) << ": autocast changed nothing";
    EXPECT_LT(l.back(), l.front() / 20) << dtype_name(low);
    // Seen: within 0.2% (bfloat16) and 0.03% (float16) at every step.
    for (int s = 0; s < steps; s += 9)
      EXPECT_NEAR(l[static_cast<size_t>(s)], f32[static_cast<size_t>(s)], 0.02 * f32[static_cast<size_t>(s)])
          << dtype_name(low) << " step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Half, AutocastLists, ::testing::Values(kFloat16, kBFloat16),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace braid
