// Float64 central-difference gradient checks for every differentiable op, over several shapes,
// broadcast operands and non-contiguous views. One test case per (op, shapes) row of the table.
#include <gtest/gtest.h>

#include "gradcheck.h"

namespace braid {
namespace {

using testing::Fn;
using V = const std::vector<Tensor>&;

enum class Domain { Any, Positive, AwayFromZero, Unit };

struct Case {
  std::string name;
  std::vector<Shape> shapes;
  Fn f;
  Domain domain = Domain::Any;
};

Tensor idx(std::vector<int64_t> v, Shape s) { return tensor(v, s); }

std::vector<Case> cases() {
  return {
      // ---- unary ----
      {"neg", {{3, 4}}, [](V x) { return neg(x[0]); }},
      {"abs", {{3, 4}}, [](V x) { return abs(x[0]); }, Domain::AwayFromZero},
      {"exp", {{2, 3, 4}}, [](V x) { return exp(x[0]); }},
      {"log", {{5}}, [](V x) { return log(x[0]); }, Domain::Positive},
      {"log1p", {{5}}, [](V x) { return log1p(x[0]); }, Domain::Positive},
      {"expm1", {{5}}, [](V x) { return expm1(x[0]); }},
      {"sqrt", {{3, 3}}, [](V x) { return sqrt(x[0]); }, Domain::Positive},
      {"rsqrt", {{3, 3}}, [](V x) { return rsqrt(x[0]); }, Domain::Positive},
      {"square", {{4}}, [](V x) { return square(x[0]); }},
      {"reciprocal", {{4}}, [](V x) { return reciprocal(x[0]); }, Domain::AwayFromZero},
      {"sin", {{6}}, [](V x) { return sin(x[0]); }},
      {"cos", {{6}}, [](V x) { return cos(x[0]); }},
      {"tanh", {{2, 5}}, [](V x) { return tanh(x[0]); }},
      {"sigmoid", {{2, 5}}, [](V x) { return sigmoid(x[0]); }},
      {"relu", {{3, 4}}, [](V x) { return relu(x[0]); }, Domain::AwayFromZero},
      {"leaky_relu", {{3, 4}}, [](V x) { return leaky_relu(x[0], 0.2); }, Domain::AwayFromZero},
      {"hardsigmoid", {{3, 4}}, [](V x) { return hardsigmoid(x[0] * 4.0, 0.2, 0.5); }},
      {"hardswish", {{3, 4}}, [](V x) { return hardswish(x[0] * 4.0); }},
      {"elu", {{3, 4}}, [](V x) { return elu(x[0], 0.7); }, Domain::AwayFromZero},
      {"silu", {{3, 4}}, [](V x) { return silu(x[0]); }},
      {"softplus", {{3, 4}}, [](V x) { return softplus(x[0]); }},
      {"gelu", {{3, 4}}, [](V x) { return gelu(x[0]); }},
      {"gelu_tanh", {{3, 4}}, [](V x) { return gelu(x[0], "tanh"); }},
      {"erf", {{7}}, [](V x) { return erf(x[0]); }},
      {"asin", {{7}}, [](V x) { return asin(x[0]); }, Domain::Unit},
      {"acos", {{7}}, [](V x) { return acos(x[0]); }, Domain::Unit},
      {"atan", {{2, 5}}, [](V x) { return atan(x[0]); }},
      {"pow_scalar", {{5}}, [](V x) { return pow(x[0], 2.5); }, Domain::Positive},
      {"pow_scalar_int", {{5}}, [](V x) { return pow(x[0], 3.0); }},
      {"clamp", {{4, 4}}, [](V x) { return clamp(x[0], -0.5, 0.7); }, Domain::AwayFromZero},
      {"clamp_min_only", {{4, 4}}, [](V x) { return clamp(x[0], 0.25, std::nullopt); }, Domain::AwayFromZero},
      // ---- binary, with broadcasting ----
      {"add", {{3, 4}, {3, 4}}, [](V x) { return x[0] + x[1]; }},
      {"add_broadcast", {{3, 4}, {4}}, [](V x) { return x[0] + x[1]; }},
      {"add_alpha", {{2, 3}, {2, 1}}, [](V x) { return add(x[0], x[1], -2.5); }},
      {"sub_broadcast", {{2, 1, 3}, {4, 1}}, [](V x) { return x[0] - x[1]; }},
      {"mul", {{3, 4}, {3, 4}}, [](V x) { return x[0] * x[1]; }},
      {"mul_broadcast", {{2, 1, 3}, {1, 4, 1}}, [](V x) { return x[0] * x[1]; }},
      {"mul_scalar", {{5}}, [](V x) { return 3.0 * x[0] * 2.0; }},
      {"div", {{3, 4}, {3, 4}}, [](V x) { return x[0] / x[1]; }, Domain::Positive},
      {"div_broadcast", {{3, 4}, {3, 1}}, [](V x) { return x[0] / x[1]; }, Domain::Positive},
      {"rdiv_scalar", {{4}}, [](V x) { return 1.5 / x[0]; }, Domain::Positive},
      {"pow_tensor", {{3, 4}, {3, 4}}, [](V x) { return pow(x[0], x[1]); }, Domain::Positive},
      {"pow_broadcast", {{3, 4}, {4}}, [](V x) { return pow(x[0], x[1]); }, Domain::Positive},
      {"maximum", {{3, 4}, {3, 4}}, [](V x) { return maximum(x[0], x[1]); }},
      {"minimum_broadcast", {{3, 4}, {1, 4}}, [](V x) { return minimum(x[0], x[1]); }},
      {"where", {{3, 4}, {3, 4}, {3, 4}},
       [](V x) { return where(gt(x[2].detach(), zeros({})), x[0], x[1]); }},
      {"where_broadcast", {{3, 1}, {4}},
       [](V x) { return where(tensor_bool({true, false, true, true}, {4}), x[0], x[1]); }},
      // ---- reductions ----
      {"sum_all", {{3, 4}}, [](V x) { return sum(x[0]); }},
      {"sum_axis", {{2, 3, 4}}, [](V x) { return sum(x[0], {1}); }},
      {"sum_axes_keepdim", {{2, 3, 4}}, [](V x) { return sum(x[0], {0, 2}, true); }},
      {"mean", {{2, 3, 4}}, [](V x) { return mean(x[0], {-1}); }},
      {"mean_all", {{5, 2}}, [](V x) { return mean(x[0]); }},
      {"prod", {{3, 4}}, [](V x) { return prod(x[0], {1}); }},
      {"prod_with_zero", {{2, 3}},
       [](V x) { return prod(x[0] * tensor(std::vector<double>{1, 0, 1, 0, 0, 1}, {2, 3}), {1}); }},
      {"amax", {{3, 5}}, [](V x) { return amax(x[0], {1}); }},
      {"amin_all", {{3, 5}}, [](V x) { return amin(x[0]); }},
      {"var", {{4, 5}}, [](V x) { return var(x[0], {1}); }},
      {"var_population", {{4, 5}}, [](V x) { return var(x[0], {0}, 0, true); }},
      {"std", {{4, 5}}, [](V x) { return std(x[0], {}); }},
      {"logsumexp", {{3, 6}}, [](V x) { return logsumexp(x[0], {1}); }},
      {"logsumexp_large", {{2, 3}}, [](V x) { return logsumexp(x[0] * 300.0, {0, 1}); }},
      {"softmax", {{3, 5}}, [](V x) { return softmax(x[0], -1); }},
      {"softmax_axis0", {{4, 3}}, [](V x) { return softmax(x[0], 0); }},
      {"log_softmax", {{3, 5}}, [](V x) { return log_softmax(x[0], 1); }},
      {"sum_to", {{2, 3, 4}}, [](V x) { return sum_to(x[0], {3, 1}); }},
      // ---- matmul ----
      {"matmul", {{3, 4}, {4, 5}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_transposed_views", {{4, 3}, {5, 4}}, [](V x) { return matmul(x[0].mT(), x[1].mT()); }},
      {"matmul_batched", {{2, 3, 4}, {2, 4, 2}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_broadcast_batch", {{2, 1, 3, 4}, {3, 4, 2}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_vec_mat", {{4}, {4, 3}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_mat_vec", {{3, 4}, {4}}, [](V x) { return matmul(x[0], x[1]); }},
      {"matmul_dot", {{4}, {4}}, [](V x) { return matmul(x[0], x[1]); }},
      // ---- views ----
      {"reshape", {{2, 6}}, [](V x) { return x[0].reshape({3, -1}) * x[0].reshape({3, 4}); }},
      {"reshape_of_transposed", {{3, 4}}, [](V x) { return exp(x[0].mT().reshape({12})); }},
      {"permute", {{2, 3, 4}}, [](V x) { return sin(x[0].permute({2, 0, 1})); }},
      {"transpose", {{3, 4}}, [](V x) { return x[0].transpose(0, 1) * tensor(std::vector<double>{1, 2, 3}, {3}); }},
      {"narrow", {{5, 4}}, [](V x) { return exp(x[0].narrow(0, 1, 3)); }},
      {"slice_step", {{7, 3}}, [](V x) { return square(x[0].slice(0, 1, 7, 2)); }},
      {"select", {{3, 4}}, [](V x) { return x[0].select(1, -1) * 2.0; }},
      {"expand", {{3, 1}}, [](V x) { return x[0].expand({2, 3, 4}) * randn({2, 3, 4}, kFloat64); }},
      {"squeeze_unsqueeze", {{3, 1, 2}}, [](V x) { return exp(x[0].squeeze().unsqueeze(0)); }},
      {"flatten", {{2, 3, 2}}, [](V x) { return x[0].flatten(1) * exp(x[0].flatten().reshape({2, 6})); }},
      {"contiguous", {{3, 4}}, [](V x) { return x[0].mT().contiguous() * 3.0; }},
      {"clone", {{3}}, [](V x) { return x[0].clone() * x[0]; }},
      // ---- assembling and indexing ----
      {"concat", {{2, 3}, {4, 3}}, [](V x) { return sin(concat({x[0], x[1]}, 0)); }},
      {"concat_axis1", {{2, 3}, {2, 1}, {2, 2}}, [](V x) { return exp(concat({x[0], x[1], x[2]}, -1)); }},
      {"stack", {{2, 3}, {2, 3}}, [](V x) { return square(stack({x[0], x[1]}, 1)); }},
      {"split", {{5, 2}}, [](V x) { auto p = split(x[0], {2, 3}, 0); return p[0].sum() * p[1]; }},
      {"chunk", {{6}}, [](V x) { auto p = chunk(x[0], 3, 0); return p[0] * p[1] * p[2]; }},
      {"gather", {{3, 4}}, [](V x) { return gather(x[0], 1, idx({0, 3, 3, 1, 2, 2}, {3, 2})); }},
      {"gather_axis0", {{3, 2}}, [](V x) { return gather(x[0], 0, idx({2, 0, 1, 1}, {2, 2})); }},
      {"index_select", {{4, 3}}, [](V x) { return index_select(x[0], 0, idx({3, 0, 3}, {3})); }},
      {"index_select_axis1", {{2, 5}}, [](V x) { return index_select(x[0], 1, idx({-1, 2}, {2})); }},
      {"scatter_add", {{3, 4}, {2, 4}},
       [](V x) { return scatter_add(x[0], 0, idx({0, 2, 2, 1, 0, 0, 1, 1}, {2, 4}), x[1]); }},
      {"pad_constant", {{2, 3}}, [](V x) { return exp(pad(x[0], {1, 2, 0, 1}, "constant", 0.5)); }},
      {"pad_crop", {{3, 4}}, [](V x) { return square(pad(x[0], {-1, 1})); }},
      {"pad_reflect", {{2, 4}}, [](V x) { return square(pad(x[0], {2, 3}, "reflect")); }},
      {"pad_replicate", {{2, 3}}, [](V x) { return square(pad(x[0], {2, 1, 1, 0}, "replicate")); }},
      {"tril", {{3, 3}}, [](V x) { return tril(x[0]) * 2.0; }},
      {"triu", {{3, 4}}, [](V x) { return triu(x[0], 1) * 2.0; }},
      // ---- layer normalisation: one node with a closed-form backward (Note [LayerNorm as one node]) ----
      {"layer_norm_affine", {{3, 5}, {5}, {5}}, [](V x) { return layer_norm(x[0], 1, x[1], x[2], 1e-5); }},
      {"layer_norm_two_axes", {{2, 3, 4}, {3, 4}}, [](V x) { return layer_norm(x[0], 2, x[1], Tensor(), 1e-3); }},
      {"layer_norm_plain_far_from_zero", {{4, 6}}, [](V x) { return layer_norm(x[0] + 30.0, 1); }},
      {"layer_norm_bias_only_strided", {{4, 3}, {4}},
       [](V x) { return layer_norm(x[0].mT(), 1, Tensor(), x[1], 1e-5); }},
      // ---- batch normalisation: one node with a closed-form backward (Note [BatchNorm as one node]) ----
      {"batch_norm_4d", {{3, 2, 2, 3}, {2}, {2}},
       [](V x) { return batch_norm_training(x[0], x[1], x[2], 1e-5)[0]; }},
      {"batch_norm_2d_no_affine", {{5, 3}}, [](V x) { return batch_norm_training(x[0], Tensor(), Tensor(), 1e-3)[0]; }},
      {"batch_norm_3d_weight_only", {{2, 3, 4}, {3}},
       [](V x) { return batch_norm_training(x[0], x[1], Tensor(), 1e-5)[0]; }},
      {"batch_norm_strided_input", {{2, 3, 4, 2}, {3}, {3}},
       [](V x) { return batch_norm_training(x[0].permute({0, 1, 3, 2}), x[1], x[2], 1e-5)[0]; }},
      {"batch_norm_far_from_zero", {{4, 2, 3}, {2}, {2}},
       [](V x) { return batch_norm_training(x[0] + 20.0, x[1], x[2], 1e-5)[0]; }},
      // ---- composites: gradients come from the pieces ----
      {"composite_mlp", {{4, 3}, {3, 5}, {5}},
       [](V x) { return log_softmax(tanh(matmul(x[0], x[1]) + x[2]), 1); }},
      {"composite_layernorm", {{3, 6}},
       [](V x) { return (x[0] - mean(x[0], {1}, true)) * rsqrt(var(x[0], {1}, 0, true) + 1e-5); }},
      {"used_twice", {{4}}, [](V x) { return x[0] * exp(x[0]) + x[0]; }},
  };
}

// gtest prints a parameter with this instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GradCheck : public ::testing::TestWithParam<Case> {};

TEST_P(GradCheck, MatchesCentralDifferences) {
  const Case& c = GetParam();
  Generator gen(std::hash<std::string>{}(c.name));
  std::vector<Tensor> inputs;
  for (const Shape& s : c.shapes) {
    Tensor x = randn(s, kFloat64, &gen);
    switch (c.domain) {
      case Domain::Positive: x = abs(x) + 0.5; break;
      case Domain::AwayFromZero: x = x + sign(x) * 0.3; break;
      case Domain::Unit: x = tanh(x) * 0.9; break;
      case Domain::Any: break;
    }
    inputs.push_back(x);
  }
  manual_seed(7);  // ops inside f that draw (expand's weights) draw the same on every call
  std::string where;
  double err = testing::gradcheck_error(
      [&](V x) {
        manual_seed(7);
        return c.f(x);
      },
      inputs, 1e-6, &where);
  EXPECT_LE(err, 1e-6) << c.name << ": worst at " << where;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(GradCheckTies, MaximumSplitsTiesEvenly) {
  Tensor a = tensor(std::vector<double>{1, 2, 3}, {3}).set_requires_grad();
  Tensor b = tensor(std::vector<double>{1, 5, 0}, {3}).set_requires_grad();
  maximum(a, b).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.5, 1, 0}));
}

TEST(GradCheckTies, AmaxSharesGradientAmongTies) {
  Tensor a = tensor(std::vector<double>{4, 1, 4, 2}, {4}).set_requires_grad();
  amax(a).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.5, 0, 0.5, 0}));
}

TEST(GradCheckTies, ReluKinkHasZeroGradient) {
  Tensor a = tensor(std::vector<double>{-1, 0, 2}, {3}).set_requires_grad();
  relu(a).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0, 0, 1}));
}

}  // namespace
}  // namespace braid
