// Squeeze-and-excitation blocks in the ONNX executor's inference (Note [Squeeze-and-excitation as
// one op] in src/ops/squeeze_excite.cpp) on graphs written as exporters write them: PaddlePaddle's
// (weights as Constant nodes, each bias a separate Add of a reshaped constant), MobileNetV3's as
// PyTorch exports it (biases in the Convs, the gated activations then added to a residual, which an
// elementwise chain takes with the Mul), and a block whose gate is read elsewhere, which stays as
// written. Each against the graph as written (the nodes one by one, with gradients recording), to
// float32 reassociation, and run as the fused ops expected. Also a feature pyramid's nearest
// upsampling of channels-last activations (Note [Nearest upsampling by whole factors]).
#include <gtest/gtest.h>

#include <cmath>

#include "braid/braid.h"
#include "braid/onnx/export.h"
#include "onnx_graphs.h"

using namespace braid;
namespace bx = braid::onnx;
using onnx_test::info;
using onnx_test::model_of;

namespace {

void expect_close(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<float> g = contiguous(got).to_vector<float>(), w = contiguous(want).to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::fabs(w[i]))) << i;
}

bx::Attribute tensor_attr(const Tensor& t) {
  bx::Attribute a;
  a.kind = bx::Attribute::Kind::Tensor;
  a.t = t;
  return a;
}

// PP-LCNet's block as PaddlePaddle's exporter writes it, after a 3x3 Conv (so that the activations
// are channels-last in inference): every weight a Constant node, each bias Reshape(Constant,
// Constant shape) added after its Conv, the gate read by the Mul only.
TEST(OnnxModule, PaddleSqueezeExciteRunsAsOneOp) {
  Generator gen(41);
  bx::GraphBuilder g(11);
  const auto constant = [&](const Tensor& t) { return g.node("Constant", {}, {{"value", tensor_attr(t)}})[0]; };
  const std::string x = g.node("Conv", {"input", "w0"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0];
  const std::string pooled = g.node("GlobalAveragePool", {x})[0];
  const auto stage = [&](const std::string& in, int64_t c_in, int64_t c_out) {
    const std::string w = constant(randn({c_out, c_in, 1, 1}, kFloat32, &gen, 0, 0.4));
    const std::string conv = g.node("Conv", {in, w},
                                    {{"kernel_shape", bx::attr_ints({1, 1})},
                                     {"strides", bx::attr_ints({1, 1})},
                                     {"pads", bx::attr_ints({0, 0, 0, 0})},
                                     {"dilations", bx::attr_ints({1, 1})},
                                     {"group", bx::attr_int(1)}})[0];
    const std::string shape = constant(tensor(std::vector<int64_t>{1, c_out, 1, 1}, {4}));
    const std::string bias = g.node("Reshape", {constant(randn({c_out}, kFloat32, &gen, 0, 0.5)), shape})[0];
    return g.node("Add", {conv, bias})[0];
  };
  const std::string hidden = g.node("Relu", {stage(pooled, 16, 4)})[0];
  const std::string gate =
      g.node("HardSigmoid", {stage(hidden, 4, 16)}, {{"alpha", bx::attr_float(0.2)}, {"beta", bx::attr_float(0.5)}})[0];
  const std::string gated = g.node("Mul", {x, gate})[0];
  g.graph().nodes.push_back(bx::Node{"next", "Conv", "", {gated, "w3"}, {"y"}, {}});
  bx::Model m = model_of("paddle_se", 11, g.graph());
  m.graph.initializers.insert(
      {{"w0", randn({16, 3, 3, 3}, kFloat32, &gen, 0, 0.3)}, {"w3", randn({8, 16, 1, 1}, kFloat32, &gen, 0, 0.3)}});
  m.graph.inputs.push_back(info("input", kFloat32, {2, 3, 9, 10}));
  m.graph.outputs.push_back(info("y", kFloat32, {2, 8, 9, 10}));
  bx::OnnxModule mod(m);
  const Tensor in = randn({2, 3, 9, 10}, kFloat32, &gen);
  const Tensor as_written = mod.run({in})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  expect_close(mod.run({in})[0], as_written);
  ASSERT_EQ(mod.profile().count("gate"), 1u);
  EXPECT_EQ(mod.profile().at("gate").calls, 1);
  for (const char* op : {"GlobalAveragePool", "Add", "Relu", "HardSigmoid", "Mul"})
    EXPECT_EQ(mod.profile().count(op), 0u) << op;
}

// MobileNetV3's block as PyTorch exports it (biases in the Convs), its gated activations added to
// a residual: the block makes the gate, and one elementwise chain multiplies it in and adds.
TEST(OnnxModule, TorchSqueezeExciteBeforeAResidualLeavesTheMulToAChain) {
  Generator gen(42);
  bx::GraphBuilder g(17);
  const std::string pooled = g.node("GlobalAveragePool", {"x"})[0];
  const std::string hidden = g.node("Relu", {g.node("Conv", {pooled, "w1", "b1"})[0]})[0];
  const std::string gate = g.node("HardSigmoid", {g.node("Conv", {hidden, "w2", "b2"})[0]},
                                  {{"alpha", bx::attr_float(1.0 / 6)}, {"beta", bx::attr_float(0.5)}})[0];
  const std::string gated = g.node("Mul", {"x", gate})[0];
  g.graph().nodes.push_back(bx::Node{"residual", "Add", "", {gated, "skip"}, {"y"}, {}});
  bx::Model m = model_of("torch_se", 17, g.graph());
  m.graph.initializers.insert({{"w1", randn({6, 24, 1, 1}, kFloat32, &gen, 0, 0.3)},
                               {"b1", randn({6}, kFloat32, &gen)},
                               {"w2", randn({24, 6, 1, 1}, kFloat32, &gen, 0, 0.3)},
                               {"b2", randn({24}, kFloat32, &gen)}});
  m.graph.inputs = {info("x", kFloat32, {2, 24, 5, 6}), info("skip", kFloat32, {2, 24, 5, 6})};
  m.graph.outputs.push_back(info("y", kFloat32, {2, 24, 5, 6}));
  bx::OnnxModule mod(m);
  const Tensor x = randn({2, 24, 5, 6}, kFloat32, &gen), skip = randn({2, 24, 5, 6}, kFloat32, &gen);
  const Tensor as_written = mod.run({x, skip})[0].detach();
  mod.set_profiling(true);
  NoGradGuard no_grad;
  expect_close(mod.run({x, skip})[0], as_written);
  EXPECT_EQ(mod.profile().at("gate").calls, 1);
  EXPECT_EQ(mod.profile().at("elementwise chain").calls, 1);
  for (const char* op : {"GlobalAveragePool", "Conv", "Relu", "HardSigmoid", "Mul", "Add"})
    EXPECT_EQ(mod.profile().count(op), 0u) << op;
}

// A gate that the graph also returns is not hidden inside a fused block: the nodes run as written.
TEST(OnnxModule, ASqueezeExciteWhoseGateIsReadElsewhereRunsAsWritten) {
  Generator gen(43);
  bx::GraphBuilder g(17);
  const std::string pooled = g.node("GlobalAveragePool", {"x"})[0];
  const std::string hidden = g.node("Relu", {g.node("Conv", {pooled, "w1"})[0]})[0];
  g.graph().nodes.push_back(bx::Node{"gate", "HardSigmoid", "", {g.node("Conv", {hidden, "w2"})[0]}, {"gate"}, {}});
  g.graph().nodes.push_back(bx::Node{"gated", "Mul", "", {"x", "gate"}, {"y"}, {}});
  bx::Model m = model_of("se_gate_out", 17, g.graph());
  m.graph.initializers.insert(
      {{"w1", randn({2, 8, 1, 1}, kFloat32, &gen, 0, 0.3)}, {"w2", randn({8, 2, 1, 1}, kFloat32, &gen, 0, 0.3)}});
  m.graph.inputs.push_back(info("x", kFloat32, {1, 8, 4, 4}));
  m.graph.outputs = {info("y", kFloat32, {1, 8, 4, 4}), info("gate", kFloat32, {1, 8, 1, 1})};
  bx::OnnxModule mod(m);
  const Tensor x = randn({1, 8, 4, 4}, kFloat32, &gen);
  const std::vector<Tensor> as_written = mod.run({x});
  mod.set_profiling(true);
  NoGradGuard no_grad;
  const std::vector<Tensor> got = mod.run({x});
  for (size_t k = 0; k < 2; ++k) expect_close(got[k], as_written[k].detach());
  EXPECT_EQ(mod.profile().count("gate"), 0u);
  EXPECT_EQ(mod.profile().at("GlobalAveragePool").calls, 1);
}

// Note [Nearest upsampling by whole factors]: a feature pyramid's top-down path as PaddlePaddle
// writes it (Resize by scales 2 and by sizes 4x in nearest mode after a 1x1 Conv, whose output is
// channels-last in inference, then an Add of the lateral branch): bit for bit the graph as written,
// where the resize gathers along each axis; and a factor that is not whole, and an odd
// coordinate mode, still resize as written.
TEST(OnnxModule, NearestUpsamplingOfChannelsLastActivationsHasTheSameBits) {
  Generator gen(44);
  bx::GraphBuilder g(13);
  // (1, 64, 8, 6): 3x1 over 48 channels, over oneDNN's threshold, so channels-last in inference, and
  // no Winograd geometry, whose sums differ from the direct kernel's (Note [Winograd convolutions in
  // inference])
  const std::string top = g.node("Conv", {"x", "w"})[0];
  bx::Graph& graph = g.graph();
  graph.nodes.push_back(
      bx::Node{"up2", "Resize", "", {top, "", "scales"}, {"up2"}, {{"mode", bx::attr_string("nearest")}}});
  graph.nodes.push_back(bx::Node{"sum", "Add", "", {"up2", "lateral"}, {"y"}, {}});
  graph.nodes.push_back(bx::Node{"up4",
                                 "Resize",
                                 "",
                                 {top, "", "", "sizes"},
                                 {"z"},
                                 {{"mode", bx::attr_string("nearest")},
                                  {"coordinate_transformation_mode", bx::attr_string("asymmetric")},
                                  {"nearest_mode", bx::attr_string("floor")}}});
  graph.nodes.push_back(bx::Node{
      "odd",
      "Resize",
      "",
      {top, "", "odd_scales"},
      {"u"},
      {{"mode", bx::attr_string("nearest")}, {"coordinate_transformation_mode", bx::attr_string("align_corners")}}});
  bx::Model m = model_of("fpn_up", 13, graph);
  m.graph.initializers.insert({{"w", randn({64, 48, 3, 1}, kFloat32, &gen, 0, 0.1)},
                               {"scales", tensor(std::vector<float>{1, 1, 2, 2}, {4})},
                               {"odd_scales", tensor(std::vector<float>{1, 1, 1.5f, 2}, {4})},
                               {"sizes", tensor(std::vector<int64_t>{1, 64, 32, 24}, {4})}});
  m.graph.inputs = {info("x", kFloat32, {1, 48, 10, 6}), info("lateral", kFloat32, {1, 64, 16, 12})};
  m.graph.outputs = {info("y", kFloat32, {1, 64, 16, 12}), info("z", kFloat32, {1, 64, 32, 24}),
                     info("u", kFloat32, {1, 64, 12, 12})};
  bx::OnnxModule mod(m);
  const Tensor x = randn({1, 48, 10, 6}, kFloat32, &gen), lateral = randn({1, 64, 16, 12}, kFloat32, &gen);
  const std::vector<Tensor> as_written = mod.run({x, lateral});
  NoGradGuard no_grad;
  const std::vector<Tensor> got = mod.run({x, lateral});
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(got[k].shape(), as_written[k].shape()) << k;
    EXPECT_EQ(contiguous(got[k]).to_vector<float>(), contiguous(as_written[k].detach()).to_vector<float>()) << k;
  }
}

}  // namespace
