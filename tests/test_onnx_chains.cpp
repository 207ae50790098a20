// The elementwise chains of the ONNX executor's inference (Note [Elementwise chains] in
// src/ops/chain.cpp) on graphs written as exporters write them: a quantised HardSwish in QDQ form,
// a transformer's scaled and masked scores, its bias and residual and its bias and GELU, and a
// dynamically quantised MatMul's scale and bias; each bit for bit the graph as written, and run as the chains expected.
#include <gtest/gtest.h>

#include "braid/braid.h"
#include "braid/onnx/export.h"
#include "error_of.h"
#include "onnx_graphs.h"

using namespace braid;
namespace bx = braid::onnx;
using onnx_test::info;
using onnx_test::model_of;

namespace {

// Note [Elementwise chains]: a quantised HardSwish after a BatchNormalization, written as
// onnxruntime's quantize_static writes it (a QDQ pair after every op, the + 3 a quantised
// constant), runs in inference as one chain, bit for bit the nodes as written; a value read
// outside the chain ends it there.
TEST(OnnxModule, QuantisedElementwiseRunsAsOneChainWithTheSameBits) {
  Generator gen(14);
  bx::GraphBuilder g(13);
  const auto pair = [&](const std::string& v, double scale, int64_t zero) {
    const std::string s = g.scalar(scale, kFloat32);
    const std::string z = g.node("Cast", {g.ints({zero})}, {{"to", bx::attr_int(2)}})[0];
    return g.node("DequantizeLinear", {g.node("QuantizeLinear", {v, s, z})[0], s, z})[0];
  };
  const std::string conv = pair(g.node("Conv", {"x", "w"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0], 0.04, 128);
  const std::string bn = pair(g.node("BatchNormalization", {conv, "gamma", "beta", "mean", "var"})[0], 0.05, 100);
  const std::string three = pair(g.scalar(3.0, kFloat32), 3.0 / 255, 0);
  const std::string shifted = pair(g.node("Add", {bn, three})[0], 6.0 / 255, 0);
  const std::string swish =
      pair(g.node("Div", {pair(g.node("Mul", {bn, shifted})[0], 0.06, 30), g.scalar(6.0, kFloat32)})[0], 0.03, 10);
  g.graph().nodes.push_back(bx::Node{"next", "Conv", "", {swish, "w2"}, {"y"}, {}});
  g.graph().nodes.push_back(bx::Node{"side", "Relu", "", {bn}, {"bn_relu"}, {}});  // bn read outside
  bx::Model m = model_of("qdq_hardswish", 13, g.graph());
  m.graph.initializers.insert({{"w", randn({8, 3, 3, 3}, kFloat32, &gen, 0, 0.3)},
                               {"w2", randn({4, 8, 1, 1}, kFloat32, &gen, 0, 0.3)},
                               {"gamma", rand({8}, kFloat32, &gen, 0.5, 1.5)},
                               {"beta", randn({8}, kFloat32, &gen)},
                               {"mean", randn({8}, kFloat32, &gen)},
                               {"var", rand({8}, kFloat32, &gen, 0.5, 2.0)}});
  m.graph.inputs.push_back(info("x", kFloat32, {2, 3, 10, 12}));
  m.graph.outputs.push_back(info("y", kFloat32, {2, 4, 10, 12}));
  m.graph.outputs.push_back(info("bn_relu", kFloat32, {2, 8, 10, 12}));
  bx::OnnxModule mod(m);
  const Tensor x = randn({2, 3, 10, 12}, kFloat32, &gen) * 3.0;
  const std::vector<Tensor> as_written = mod.run({x});
  mod.set_profiling(true);
  NoGradGuard no_grad;
  const std::vector<Tensor> fused = mod.run({x});
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(fused[k].to_vector<float>(), as_written[k].detach().to_vector<float>()) << k;
  // The Conv's pair, the BatchNormalization and its pair run as one chain, which ends at bn (the
  // Relu reads it); the Add, the Mul, the Div and their pairs as another.
  ASSERT_EQ(mod.profile().count("elementwise chain"), 1u);
  EXPECT_EQ(mod.profile().at("elementwise chain").calls, 2);
  EXPECT_EQ(mod.profile().count("QuantizeLinear+DequantizeLinear"), 0u);
  EXPECT_EQ(mod.profile().count("BatchNormalization"), 0u);
  EXPECT_EQ(mod.profile().count("Add") + mod.profile().count("Mul") + mod.profile().count("Div"), 0u);
}

// Note [Elementwise chains] with tensor operands, as a transformer block writes them: the scores
// scaled and masked before Softmax (a mask of shape (N, 1, 1, T)), a bias and a residual (which a
// LayerNormalization would read next); bit for bit the graph as written.
TEST(OnnxModule, AttentionMaskAndResidualRunAsChainsWithTheSameBits) {
  Generator gen(15);
  bx::GraphBuilder g(17);
  const std::string scores = g.node("MatMul", {"q", "k"})[0];
  const std::string masked = g.node("Add", {g.node("Div", {scores, g.scalar(8.0, kFloat32)})[0], "mask"})[0];
  const std::string probs = g.node("Softmax", {masked}, {{"axis", bx::attr_int(-1)}})[0];
  const std::string proj = g.node("MatMul", {probs, "w"})[0];
  g.graph().nodes.push_back(bx::Node{"residual", "Add", "", {"q", g.node("Add", {"bias", proj})[0]}, {"y"}, {}});
  bx::Model m = model_of("attention", 17, g.graph());
  m.graph.initializers.insert({{"w", randn({6, 6}, kFloat32, &gen, 0, 0.4)}, {"bias", randn({6}, kFloat32, &gen)}});
  m.graph.inputs = {info("q", kFloat32, {2, 3, 6, 6}), info("k", kFloat32, {2, 3, 6, 6}),
                    info("mask", kFloat32, {2, 1, 1, 6})};
  m.graph.outputs.push_back(info("y", kFloat32, {2, 3, 6, 6}));
  bx::OnnxModule mod(m);
  const Tensor q = randn({2, 3, 6, 6}, kFloat32, &gen), k = randn({2, 3, 6, 6}, kFloat32, &gen);
  Tensor mask = zeros({2, 1, 1, 6});
  mask.narrow(3, 4, 2).fill_(-10000.0);
  const Tensor as_written = mod.run({q, k, mask})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  EXPECT_EQ(mod.run({q, k, mask})[0].to_vector<float>(), as_written.to_vector<float>());
  ASSERT_EQ(mod.profile().count("elementwise chain"), 1u);
  EXPECT_EQ(mod.profile().at("elementwise chain").calls, 1);  // Div + Add
  EXPECT_EQ(mod.profile().at("MatMul+chain").calls, 1);       // the projection by w, then Add + Add
  EXPECT_EQ(mod.profile().count("Add") + mod.profile().count("Div"), 0u);
}

// Note [int8 epilogues]: a dynamically quantised MatMul as onnxruntime writes it (MatMulInteger, its
// int32 product cast to float32, times the two scales, plus the bias) runs as one int_matmul_chain,
// the scale and the bias in the product's epilogue once the weight is kept; bit for bit the graph
// as written every time. With one zero point per row of A the product runs as its node and the
// Cast, the Mul and the Add as a chain after it.
TEST(OnnxModule, MatMulIntegerScaleAndBiasRunWithTheProduct) {
  Generator gen(17);
  const Tensor b = cast(randn({16, 8}, kFloat32, &gen) * 40.0, kInt8), bias = randn({8}, kFloat32, &gen);
  const Tensor a = cast(rand({4, 16}, kFloat32, &gen, 0, 255), kUInt8), scale = full({}, 0.0123, kFloat32);
  for (const Tensor& a_zero : {cast(full({}, 97.0), kUInt8), cast(rand({4, 1}, kFloat32, &gen, 0, 255), kUInt8)}) {
    SCOPED_TRACE(a_zero.numel() == 1 ? "one zero point" : "one per row");
    bx::GraphBuilder g(13);
    const std::string product = g.node("MatMulInteger", {"a", "b", "a_zero", "b_zero"})[0];
    const std::string as_float = g.node("Cast", {product}, {{"to", bx::attr_int(1)}})[0];
    const std::string scaled = g.node("Mul", {as_float, "scale"})[0];
    g.graph().nodes.push_back(bx::Node{"bias", "Add", "", {"bias", scaled}, {"y"}, {}});
    bx::Model m = model_of("dynamic_matmul", 13, g.graph());
    m.graph.initializers.insert({{"b", b}, {"b_zero", cast(zeros({}), kInt8)}, {"bias", bias}});
    m.graph.inputs = {info("a", kUInt8, {4, 16}), info("a_zero", kUInt8, a_zero.shape()), info("scale", kFloat32, {})};
    m.graph.outputs.push_back(info("y", kFloat32, {4, 8}));
    bx::OnnxModule mod(m);
    const Tensor as_written = mod.run({a, a_zero, scale})[0].detach();
    mod.set_profiling(true);
    NoGradGuard no_grad;
    for (int run = 0; run < 3; ++run)
      EXPECT_EQ(mod.run({a, a_zero, scale})[0].to_vector<float>(), as_written.to_vector<float>()) << "run " << run;
    EXPECT_EQ(mod.profile().count("Cast") + mod.profile().count("Mul") + mod.profile().count("Add"), 0u);
    if (a_zero.numel() == 1) {
      EXPECT_EQ(mod.profile().at("MatMulInteger+chain").calls, 3);
      EXPECT_EQ(mod.profile().count("MatMulInteger"), 0u);
    } else {
      EXPECT_EQ(mod.profile().at("MatMulInteger").calls, 3);
      EXPECT_EQ(mod.profile().at("elementwise chain").calls, 3);
    }
  }
}

// The scale's product of two runtime values made after the MatMulInteger (as some exporters order
// it): the chain cannot run at the product, whose step reads a value not yet made, so the product
// runs as its node and the Cast, the Mul and the Add as a chain; bit for bit the graph as written.
TEST(OnnxModule, AScaleMadeAfterTheProductKeepsTheProductANode) {
  Generator gen(19);
  bx::GraphBuilder g(13);
  const std::string product = g.node("MatMulInteger", {"a", "b", "a_zero"})[0];
  const std::string scale = g.node("Mul", {"a_scale", "b_scale"})[0];
  const std::string as_float = g.node("Cast", {product}, {{"to", bx::attr_int(1)}})[0];
  g.graph().nodes.push_back(bx::Node{"bias", "Add", "", {g.node("Mul", {as_float, scale})[0], "bias"}, {"y"}, {}});
  bx::Model m = model_of("late_scale", 13, g.graph());
  m.graph.initializers.insert({{"b", cast(randn({16, 8}, kFloat32, &gen) * 40.0, kInt8)},
                               {"b_scale", full({}, 0.02, kFloat32)},
                               {"bias", randn({8}, kFloat32, &gen)}});
  m.graph.inputs = {info("a", kUInt8, {4, 16}), info("a_zero", kUInt8, {}), info("a_scale", kFloat32, {})};
  m.graph.outputs.push_back(info("y", kFloat32, {4, 8}));
  bx::OnnxModule mod(m);
  const Tensor a = cast(rand({4, 16}, kFloat32, &gen, 0, 255), kUInt8), a_zero = cast(full({}, 120.0), kUInt8),
               a_scale = full({}, 0.031, kFloat32);
  const Tensor as_written = mod.run({a, a_zero, a_scale})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  for (int run = 0; run < 3; ++run)
    EXPECT_EQ(mod.run({a, a_zero, a_scale})[0].to_vector<float>(), as_written.to_vector<float>()) << "run " << run;
  EXPECT_EQ(mod.profile().at("MatMulInteger").calls, 3);
  EXPECT_EQ(mod.profile().at("elementwise chain").calls, 3);
  EXPECT_EQ(mod.profile().count("MatMulInteger+chain"), 0u);
}

// A feed-forward layer's bias and exact GELU written out as exporters write it (Div by sqrt 2, Erf,
// Add 1, Mul by x, Mul by 0.5: Note [GELU as one op]) run as one chain.
TEST(OnnxModule, BiasAndGeluRunAsOneChain) {
  Generator gen(18);
  bx::GraphBuilder g(17);
  const std::string h = g.node("Add", {g.node("MatMul", {"x", "w"})[0], "bias"})[0];
  const std::string e = g.node("Erf", {g.node("Div", {h, g.scalar(1.4142135623730951, kFloat32)})[0]})[0];
  const std::string hx = g.node("Mul", {h, g.node("Add", {e, g.scalar(1.0, kFloat32)})[0]})[0];
  g.graph().nodes.push_back(bx::Node{"half", "Mul", "", {hx, g.scalar(0.5, kFloat32)}, {"y"}, {}});
  bx::Model m = model_of("ffn_gelu", 17, g.graph());
  m.graph.initializers.insert({{"w", randn({12, 20}, kFloat32, &gen, 0, 0.5)}, {"bias", randn({20}, kFloat32, &gen)}});
  m.graph.inputs.push_back(info("x", kFloat32, {3, 7, 12}));
  m.graph.outputs.push_back(info("y", kFloat32, {3, 7, 20}));
  bx::OnnxModule mod(m);
  const Tensor x = randn({3, 7, 12}, kFloat32, &gen) * 2.0;
  const Tensor as_written = mod.run({x})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  EXPECT_EQ(mod.run({x})[0].to_vector<float>(), as_written.to_vector<float>());
  EXPECT_EQ(mod.profile().at("MatMul+chain").calls, 1);  // the product by w heads it (Note [float32 epilogues])
  EXPECT_EQ(mod.profile().count("Gelu") + mod.profile().count("Erf") + mod.profile().count("Add"), 0u);
  EXPECT_EQ(mod.profile().count("MatMul") + mod.profile().count("elementwise chain"), 0u);
}

// Note [float32 epilogues]: a linear layer as exporters write it (MatMul by a weight, Add of the
// bias, Add of the residual) runs as one matmul_chain, the bias and the residual in the product's
// epilogue once the weight is kept (from the second run on); bit for bit the graph as written every
// time. A lone bias Add after a product by a weight (a transformer's query, key and value) is a
// chain of one step; one after a product of two activations is not.
TEST(OnnxModule, MatMulBiasAndResidualRunWithTheProduct) {
  Generator gen(21);
  bx::GraphBuilder g(17);
  const std::string h = g.node("Add", {g.node("MatMul", {"x", "w"})[0], "bias"})[0];
  const std::string y = g.node("Add", {"x", h})[0];
  const std::string q = g.node("Add", {"bias", g.node("MatMul", {y, "wq"})[0]})[0];
  g.graph().nodes.push_back(bx::Node{"scores", "Add", "", {g.node("MatMul", {q, "k"})[0], "bias"}, {"s"}, {}});
  bx::Model m = model_of("linear", 17, g.graph());
  m.graph.initializers.insert({{"w", randn({64, 64}, kFloat32, &gen, 0, 0.2)},
                               {"wq", randn({64, 64}, kFloat32, &gen, 0, 0.2)},
                               {"bias", randn({64}, kFloat32, &gen)}});
  m.graph.inputs = {info("x", kFloat32, {2, 16, 64}), info("k", kFloat32, {2, 64, 64})};
  m.graph.outputs.push_back(info("s", kFloat32, {2, 16, 64}));
  bx::OnnxModule mod(m);
  const Tensor x = randn({2, 16, 64}, kFloat32, &gen), k = randn({2, 64, 64}, kFloat32, &gen);
  const Tensor as_written = mod.run({x, k})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  for (int run = 0; run < 3; ++run)
    EXPECT_EQ(mod.run({x, k})[0].to_vector<float>(), as_written.to_vector<float>()) << "run " << run;
  EXPECT_EQ(mod.profile().at("MatMul+chain").calls, 6);  // two products by a weight in each of three runs
  EXPECT_EQ(mod.profile().at("MatMul").calls, 3);        // q by k, and its Add as a node
  EXPECT_EQ(mod.profile().at("Add").calls, 3);
}

// Note [Inference without a gradient to record]: a frozen model in eval mode on inputs that need no
// gradient runs its fused patterns with grad mode on (Python's default); a trainable one, or an
// input that asks for a gradient, runs as written, and the gradient reaches it.
TEST(OnnxModule, AFrozenModelRunsFusedInGradMode) {
  Generator gen(22);
  bx::GraphBuilder g(17);
  const std::string h = g.node("Add", {g.node("MatMul", {"x", "w"})[0], "bias"})[0];
  g.graph().nodes.push_back(bx::Node{"scale", "Mul", "", {h, g.scalar(0.5, kFloat32)}, {"y"}, {}});
  bx::Model m = model_of("frozen_linear", 17, g.graph());
  m.graph.initializers.insert({{"w", randn({8, 20}, kFloat32, &gen)}, {"bias", randn({20}, kFloat32, &gen)}});
  m.graph.inputs.push_back(info("x", kFloat32, {3, 8}));
  m.graph.outputs.push_back(info("y", kFloat32, {3, 20}));
  const Tensor x = randn({3, 8}, kFloat32, &gen);
  const std::vector<float> want =
      ((matmul(x, m.graph.initializers.at("w")) + m.graph.initializers.at("bias")) * 0.5).to_vector<float>();
  ASSERT_TRUE(is_grad_enabled());
  bx::OnnxModule frozen(m, {.frozen = true});
  frozen.set_profiling(true);
  const Tensor y = frozen.run({x})[0];
  EXPECT_EQ(y.to_vector<float>(), want);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(frozen.profile().at("MatMul+chain").calls, 1);
  EXPECT_EQ(frozen.profile().count("Add") + frozen.profile().count("MatMul"), 0u);
  // An input that asks for a gradient: the nodes as written, and x's gradient is 0.5 * w's row sums.
  Tensor xg = x.detach();
  xg.set_requires_grad(true);
  sum(frozen.run({xg})[0]).backward();
  EXPECT_EQ(frozen.profile().at("MatMul").calls, 1);
  EXPECT_EQ(frozen.profile().at("MatMul+chain").calls, 1);  // the first run's only
  const std::vector<float> rows = (sum(m.graph.initializers.at("w"), {1}) * 0.5).to_vector<float>();
  const std::vector<float> gx = xg.grad().to_vector<float>();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_NEAR(gx[i], rows[i % rows.size()], 1e-5) << i;
  // A trainable model: as written, and its weights get gradients.
  bx::OnnxModule trainable(m);
  trainable.set_profiling(true);
  EXPECT_TRUE(trainable.run({x})[0].requires_grad());
  EXPECT_EQ(trainable.profile().count("MatMul+chain"), 0u);
}

// A value that a node reads twice (Mul(d, d)) and another node outside reads as well (the Div of a
// normalisation written out) ends a chain before it: no chain takes the Sub and the Mul here.
TEST(OnnxModule, AValueReadTwiceByOneNodeAndOnceOutsideIsNotHidden) {
  Generator gen(19);
  bx::GraphBuilder g(17);
  const std::string d = g.node("Sub", {"x", "m"})[0];
  const std::string var = g.node("ReduceMean", {g.node("Mul", {d, d})[0], g.ints({-1})})[0];
  const std::string sd = g.node("Sqrt", {g.node("Add", {var, g.scalar(1e-5, kFloat32)})[0]})[0];
  g.graph().nodes.push_back(bx::Node{"norm", "Div", "", {d, sd}, {"y"}, {}});
  bx::Model m = model_of("normalised", 18, g.graph());
  m.graph.inputs = {info("x", kFloat32, {2, 3, 8}), info("m", kFloat32, {2, 3, 1})};
  m.graph.outputs.push_back(info("y", kFloat32, {2, 3, 8}));
  bx::OnnxModule mod(m);
  const Tensor x = randn({2, 3, 8}, kFloat32, &gen), mean = randn({2, 3, 1}, kFloat32, &gen);
  const Tensor as_written = mod.run({x, mean})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  EXPECT_EQ(mod.run({x, mean})[0].to_vector<float>(), as_written.to_vector<float>());
  EXPECT_EQ(mod.profile().count("elementwise chain"), 0u);
}

// A convolution that fails after its BatchNormalization was folded into it (its weight does not fit
// the input's channels) names both nodes, in inference as when run as written.
TEST(OnnxModule, AFoldedConvolutionsErrorNamesWhatWasFolded) {
  Generator gen(20);
  bx::GraphBuilder g(13);
  const std::string conv = g.node("Conv", {"x", "w"})[0];
  g.graph().nodes.push_back(
      bx::Node{"bn1", "BatchNormalization", "", {conv, "gamma", "beta", "mean", "var"}, {"y"}, {}});
  g.graph().nodes[0].name = "conv1";
  bx::Model m = model_of("folded_error", 13, g.graph());
  m.graph.initializers.insert({{"w", randn({4, 5, 1, 1}, kFloat32, &gen)},
                               {"gamma", ones({4})},
                               {"beta", zeros({4})},
                               {"mean", zeros({4})},
                               {"var", ones({4})}});
  m.graph.inputs.push_back(info("x", kFloat32, {1, 3, 4, 4}));
  m.graph.outputs.push_back(info("y", kFloat32, {1, 4, 4, 4}));
  bx::OnnxModule mod(m);
  NoGradGuard no_grad;
  const std::string message = error_of<ValueError>([&] { mod.run({randn({1, 3, 4, 4}, kFloat32, &gen)}); });
  EXPECT_NE(message.find("Conv 'conv1' (folded with BatchNormalization 'bn1'): "), std::string::npos) << message;
}

}  // namespace
