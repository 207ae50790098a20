// Sequence layers (MultiheadAttention, TransformerEncoderLayer, LSTM, GRU): outputs, final states,
// attention weights and gradients against PyTorch (tests/data/layers_attention.txt,
// layers_recurrent.txt) with padding and causal masks, bidirectional multi-layer batch_first RNNs;
// float64 finite-difference gradient checks; initialisation bounds; seeded dropout; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "layer_check.h"

namespace braid {
namespace {

using namespace nn;
using testing::LayerCase;
using V = const std::vector<Tensor>&;

const std::string kAttn = "layers_attention.txt";
const std::string kRnn = "layers_recurrent.txt";

template <typename M>
M& as(Module& m) {
  return dynamic_cast<M&>(m);
}

std::vector<LayerCase> sequence_rows() {
  return {
      {kAttn, "mha/self_seq_first", [] { return std::make_shared<MultiheadAttention>(8, 2); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0]); }},
      {kAttn, "mha/cross_batch_first_masks", [] { return std::make_shared<MultiheadAttention>(8, 4, 0.0, true, true); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[1], in[2], in[3], in[4], false); }},
      {kAttn, "mha/causal_bool_masks", [] { return std::make_shared<MultiheadAttention>(6, 3, 0.0, true, true); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0], in[1], in[2]); }},
      {kAttn, "mha/float_padding_mask", [] { return std::make_shared<MultiheadAttention>(6, 3, 0.0, true, true); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0], in[1]); }},
      {kAttn, "mha/no_bias_3d_mask", [] { return std::make_shared<MultiheadAttention>(4, 2, 0.0, false); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0], Tensor(), in[1]); }},
      {kAttn, "mha/unbatched", [] { return std::make_shared<MultiheadAttention>(4, 2); },
       [](Module& m, V in) { return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0], in[1]); }},
      {kAttn, "transformer/post_norm_relu", [] { return std::make_shared<TransformerEncoderLayer>(8, 2, 16, 0.0); },
       [](Module& m, V in) { return std::vector<Tensor>{as<TransformerEncoderLayer>(m).forward(in[0], in[1])}; }},
      {kAttn, "transformer/pre_norm_gelu_batch_first",
       [] { return std::make_shared<TransformerEncoderLayer>(8, 4, 12, 0.0, "gelu", 1e-5, true, true); },
       [](Module& m, V in) {
         return std::vector<Tensor>{as<TransformerEncoderLayer>(m).forward(in[0], Tensor(), in[1])};
       }},
      {kRnn, "lstm/single_with_state", [] { return std::make_shared<LSTM>(3, 4); },
       [](Module& m, V in) { return as<LSTM>(m).forward_all(in[0], in[1], in[2]); }},
      {kRnn, "lstm/bidirectional_2layer_batch_first",
       [] { return std::make_shared<LSTM>(3, 4, 2, true, true, 0.0, true); },
       [](Module& m, V in) { return as<LSTM>(m).forward_all(in[0]); }},
      {kRnn, "lstm/no_bias_unbatched", [] { return std::make_shared<LSTM>(3, 4, 1, false); },
       [](Module& m, V in) { return as<LSTM>(m).forward_all(in[0], in[1], in[2]); }},
      {kRnn, "gru/single", [] { return std::make_shared<GRU>(3, 4); },
       [](Module& m, V in) { return as<GRU>(m).forward_all(in[0]); }},
      {kRnn, "gru/bidirectional_2layer_batch_first_state",
       [] { return std::make_shared<GRU>(3, 5, 2, true, true, 0.0, true); },
       [](Module& m, V in) { return as<GRU>(m).forward_all(in[0], in[1]); }},
      {kRnn, "gru/no_bias", [] { return std::make_shared<GRU>(2, 3, 1, false); },
       [](Module& m, V in) { return as<GRU>(m).forward_all(in[0]); }},
  };
}

class SequenceReference : public ::testing::TestWithParam<LayerCase> {};
TEST_P(SequenceReference, MatchesPyTorch) { testing::check_reference_row(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Layers, SequenceReference, ::testing::ValuesIn(sequence_rows()), testing::layer_case_name);

class SequenceGradient : public ::testing::TestWithParam<LayerCase> {};
TEST_P(SequenceGradient, MatchesFiniteDifferences) { testing::check_gradient_row(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Layers, SequenceGradient, ::testing::ValuesIn(testing::differentiable_rows(sequence_rows())),
                         testing::layer_case_name);

// ---- masks and dropout ----

TEST(Attention, SquareSubsequentMaskIsMinusInfinityAboveTheDiagonal) {
  Tensor m = generate_square_subsequent_mask(3, kFloat64);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(m.to_vector<double>(), (std::vector<double>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}));
}

TEST(Attention, CausalMaskMakesEarlyOutputsIndependentOfLaterInputs) {
  // Closed-form property: with a causal mask, output position 0 attends only to position 0.
  MultiheadAttention mha(4, 2, 0.0, true, true);
  mha.to(kFloat64);
  Tensor x = randn({1, 3, 4}, kFloat64).set_requires_grad(true);
  std::vector<Tensor> out = mha.forward_all(x, x, x, Tensor(), generate_square_subsequent_mask(3, kFloat64));
  std::vector<double> w = out[1].to_vector<double>();  // (1, 3, 3)
  EXPECT_EQ(w[1], 0.0);
  EXPECT_EQ(w[2], 0.0);
  EXPECT_EQ(w[5], 0.0);
  EXPECT_NEAR(w[0], 1.0, 1e-15);
  sum(out[0].select(1, 0)).backward();
  std::vector<double> g = x.grad().to_vector<double>();
  for (size_t i = 4; i < g.size(); ++i) EXPECT_EQ(g[i], 0.0) << "input element " << i;
}

TEST(Attention, DropoutIsSeededAndOffInEval) {
  Generator gen(21);
  MultiheadAttention mha(8, 2, 0.5, true, false, &gen);
  Tensor x = randn({5, 2, 8});
  gen.manual_seed(21);
  Tensor a = mha.forward_all(x, x, x)[1];
  gen.manual_seed(21);
  Tensor b = mha.forward_all(x, x, x)[1];
  Tensor c = mha.forward_all(x, x, x)[1];
  EXPECT_TRUE(equal(a, b));
  EXPECT_FALSE(equal(a, c));
  mha.eval();
  Tensor e1 = mha.forward_all(x, x, x)[1], e2 = mha.forward_all(x, x, x)[1];
  EXPECT_TRUE(equal(e1, e2));
  // Without dropout every row of the averaged weights sums to one.
  for (double s : sum(e1, {-1}).to_vector<float>()) EXPECT_NEAR(s, 1.0, 1e-6);
}

TEST(Attention, GradientWithDropoutMatchesFiniteDifferences) {
  Generator gen(4);
  MultiheadAttention mha(4, 2, 0.3, true, true, &gen);
  testing::expect_gradcheck(mha, {randn({2, 3, 4}, kFloat64)}, [&gen](Module& m, V in) {
    gen.manual_seed(4);
    return as<MultiheadAttention>(m).forward_all(in[0], in[0], in[0]);
  });
}

TEST(Transformer, EvalIsDeterministicAndTrainingDropoutIsSeeded) {
  Generator gen(8);
  TransformerEncoderLayer layer(8, 2, 16, 0.2, "relu", 1e-5, true, false, &gen);
  Tensor x = randn({2, 4, 8});
  gen.manual_seed(8);
  Tensor a = layer.forward(x);
  gen.manual_seed(8);
  Tensor b = layer.forward(x);
  EXPECT_TRUE(equal(a, b));
  EXPECT_FALSE(equal(a, layer.forward(x)));
  layer.eval();
  EXPECT_TRUE(equal(layer.forward(x), layer.forward(x)));
}

TEST(Recurrent, ForwardIsTheOutputOfForwardAllAndDropoutActsBetweenLayers) {
  Generator gen(2);
  LSTM lstm(3, 4, 2, true, false, 0.5, false, &gen);
  Tensor x = randn({5, 2, 3});
  lstm.eval();
  std::vector<Tensor> all = lstm.forward_all(x);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(equal(lstm.forward(x), all[0]));
  EXPECT_EQ(all[1].shape(), (Shape{2, 2, 4}));
  // The last step's output of the top layer is that layer's final hidden state.
  EXPECT_TRUE(equal(all[0].select(0, 4), all[1].select(0, 1)));
  lstm.train();
  Tensor t1 = lstm.forward(x), t2 = lstm.forward(x);
  EXPECT_FALSE(equal(t1, t2));
  GRU gru(3, 4, 1, true, true, 0.0, true);
  std::vector<Tensor> g = gru.forward_all(randn({2, 5, 3}));
  ASSERT_EQ(g.size(), 2u);
  // Bidirectional: forward direction ends at the last step, the reverse one at the first.
  EXPECT_TRUE(equal(g[0].select(1, 4).narrow(-1, 0, 4), g[1].select(0, 0)));
  EXPECT_TRUE(equal(g[0].select(1, 0).narrow(-1, 4, 4), g[1].select(0, 1)));
}

// ---- initialisation ----

void expect_within(const Tensor& t, double bound, const std::string& what) {
  double max_abs = 0;
  for (float v : t.to_vector<float>()) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
  EXPECT_LE(max_abs, bound * (1 + 1e-7)) << what;
  EXPECT_GE(max_abs, bound * (1 - 20.0 / static_cast<double>(t.numel()))) << what;
}

TEST(SequenceInit, RecurrentWeightsAreUniformOverOneOverSqrtHidden) {
  manual_seed(3);
  LSTM lstm(30, 50, 2, true, false, 0.0, true);
  GRU gru(30, 50);
  for (Module* m : std::vector<Module*>{&lstm, &gru})
    for (const auto& [name, p] : m->named_parameters()) expect_within(p, 1 / std::sqrt(50.0), m->type_name() + " " + name);
  std::vector<std::string> names;
  for (const auto& [name, p] : lstm.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse",
                       "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse", "weight_ih_l1",
                       "weight_hh_l1", "bias_ih_l1", "bias_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse",
                       "bias_ih_l1_reverse", "bias_hh_l1_reverse"}));
  EXPECT_EQ(lstm.state_dict()["weight_ih_l1"].shape(), (Shape{200, 100}));
}

TEST(SequenceInit, AttentionIsXavierWithZeroBiases) {
  manual_seed(4);
  MultiheadAttention mha(64, 4);
  StateDict s = mha.state_dict();
  expect_within(s["in_proj_weight"], std::sqrt(6.0 / (64 + 192)), "in_proj_weight");
  expect_within(s["out_proj.weight"], 1 / 8.0, "out_proj.weight");
  EXPECT_EQ(s["in_proj_bias"].to_vector<float>(), std::vector<float>(192, 0.0f));
  EXPECT_EQ(s["out_proj.bias"].to_vector<float>(), std::vector<float>(64, 0.0f));
  EXPECT_EQ(s.size(), 4u);
}

TEST(SequenceDescribe, MatchesPyTorchRepr) {
  EXPECT_EQ(LSTM(3, 4, 2, true, true, 0.0, true).describe(), "LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)");
  EXPECT_EQ(GRU(3, 4).describe(), "GRU(3, 4)");
}

// ---- errors ----

TEST(SequenceErrors, Attention) {
  EXPECT_LAYER_ERROR(ValueError, MultiheadAttention(10, 3), "MultiheadAttention", "embed_dim (10)", "num_heads (3)");
  MultiheadAttention mha(8, 2, 0.0, true, true);
  Tensor x = zeros({2, 5, 8});
  EXPECT_LAYER_ERROR(ValueError, mha.forward(zeros({2, 5, 6})), "MultiheadAttention", "8 features", "[2, 5, 6]");
  EXPECT_LAYER_ERROR(ValueError, mha.forward(x, zeros({3, 4, 8}), zeros({3, 4, 8})), "MultiheadAttention", "batch size");
  EXPECT_LAYER_ERROR(ValueError, mha.forward(x, x, x, Tensor(), zeros({5, 4})), "attn_mask", "[5, 5]", "[4, 5, 5]",
                     "[5, 4]");
  EXPECT_LAYER_ERROR(ValueError, mha.forward(x, x, x, zeros({2, 4}, kBool)), "key_padding_mask", "[2, 5]", "[2, 4]");
  EXPECT_LAYER_ERROR(TypeError, mha.forward(x, x, x, zeros({2, 5}, kInt64)), "key_padding_mask", "bool or floating",
                     "int64");
  EXPECT_LAYER_ERROR(ValueError, TransformerEncoderLayer(8, 2, 16, 0.1, "swish"), "TransformerEncoderLayer", "swish",
                     "known: relu, gelu");
}

TEST(SequenceErrors, Recurrent) {
  LSTM lstm(3, 4, 2);
  EXPECT_LAYER_ERROR(ValueError, lstm.forward(zeros({5, 2, 6})), "LSTM", "(L, N, 3)", "[5, 2, 6]");
  EXPECT_LAYER_ERROR(ValueError, lstm.forward_all(zeros({5, 2, 3}), zeros({1, 2, 4})), "LSTM", "h0", "[2, 2, 4]",
                     "[1, 2, 4]");
  EXPECT_LAYER_ERROR(ValueError, lstm.forward_all(zeros({5, 2, 3}), zeros({2, 2, 4}), zeros({2, 3, 4})), "LSTM", "c0");
  EXPECT_LAYER_ERROR(ValueError, GRU(3, 4).forward(zeros({4})), "GRU", "[4]");
  EXPECT_LAYER_ERROR(ValueError, GRU(3, 0), "GRU", "hidden_size");
  EXPECT_LAYER_ERROR(ValueError, GRU(3, 4, 1, true, false, 2.0), "GRU", "dropout");
}

}  // namespace
}  // namespace braid
