// OnnxModule beyond the conformance suite: gradients of an imported graph against finite
// differences (it trains like any braid module), dynamic batch through Shape/Gather/Concat/Reshape
// chains, the preflight listing every problem at once with node names, bad indices and inputs
// named in errors, weight names, and custom ops in a user registry.
#include <gtest/gtest.h>

#include <filesystem>

#include "braid/autograd.h"
#include "braid/onnx/export.h"
#include "braid/onnx/module.h"
#include "braid/optim.h"
#include "gradcheck.h"
#include "onnx_graphs.h"

using namespace braid;
namespace bx = braid::onnx;

namespace {

using onnx_test::as_written_and_in_inference;
using onnx_test::info;
using onnx_test::model_of;

/// A small float64 network as an ONNX graph: Conv -> BatchNormalization -> Tanh -> a
/// Shape/Gather/Concat/Reshape chain that flattens per sample (dynamic batch) -> Gemm ->
/// LayerNormalization -> Softmax.
bx::Model small_net(const std::map<std::string, Tensor>& w) {
  bx::GraphBuilder g(17);
  auto conv = g.node("Conv", {"x", "conv.weight", "conv.bias"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0];
  auto bn = g.node("BatchNormalization", {conv, "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
                   {{"epsilon", bx::attr_float(1e-3)}})[0];
  auto act = g.node("Tanh", {bn})[0];
  auto shape = g.node("Shape", {act})[0];
  auto batch = g.node("Gather", {shape, g.ints({0})}, {{"axis", bx::attr_int(0)}})[0];
  auto target = g.node("Concat", {batch, g.ints({-1})}, {{"axis", bx::attr_int(0)}})[0];
  auto flat = g.node("Reshape", {act, target})[0];
  auto fc = g.node("Gemm", {flat, "fc.weight", "fc.bias"}, {{"transB", bx::attr_int(1)}})[0];
  auto ln = g.node("LayerNormalization", {fc, "ln.weight", "ln.bias"}, {{"epsilon", bx::attr_float(1e-5)}})[0];
  g.graph().nodes.push_back(bx::Node{"out", "Softmax", "", {ln}, {"y"}, {{"axis", bx::attr_int(1)}}});
  bx::Model m = model_of("small_net", 17, g.graph());
  m.graph.initializers = w;
  m.graph.inputs.push_back(info("x", kFloat64, {2, 2, 4, 4}));
  m.graph.outputs.push_back(info("y", kFloat64, {2, 5}));
  return m;
}

std::map<std::string, Tensor> small_net_weights() {
  Generator gen(7);
  return {{"conv.weight", randn({3, 2, 3, 3}, kFloat64, &gen, 0, 0.4)}, {"conv.bias", randn({3}, kFloat64, &gen)},
          {"bn.weight", rand({3}, kFloat64, &gen, 0.5, 1.5)},         {"bn.bias", randn({3}, kFloat64, &gen)},
          {"bn.running_mean", randn({3}, kFloat64, &gen, 0, 0.1)},    {"bn.running_var", rand({3}, kFloat64, &gen, 0.5, 2)},
          {"fc.weight", randn({5, 48}, kFloat64, &gen, 0, 0.2)},     {"fc.bias", randn({5}, kFloat64, &gen)},
          {"ln.weight", rand({5}, kFloat64, &gen, 0.5, 1.5)},         {"ln.bias", randn({5}, kFloat64, &gen)}};
}

TEST(OnnxModule, GradientsMatchFiniteDifferences) {
  const std::vector<std::string> names{"conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias", "ln.weight", "ln.bias"};
  auto base = small_net_weights();
  // f(x, weights...) builds the module around the given tensors, so the gradient check perturbs
  // and differentiates the imported model's own parameters.
  braid::testing::Fn f = [&](const std::vector<Tensor>& v) {
    auto w = base;
    for (size_t i = 0; i < names.size(); ++i) w[names[i]] = v[i + 1];
    bx::OnnxModule m(small_net(w));
    return m.forward(v[0]);
  };
  std::vector<Tensor> inputs{randn({2, 2, 4, 4}, kFloat64)};
  for (const auto& n : names) inputs.push_back(base[n]);
  std::string where;
  EXPECT_LT(braid::testing::gradcheck_error(f, inputs, 1e-6, &where), 1e-6) << where;
}

TEST(OnnxModule, ParametersKeepTheirNamesAndStatisticsAreBuffers) {
  bx::OnnxModule m(small_net(small_net_weights()));
  std::vector<std::string> params, buffers;
  for (const auto& [n, t] : m.named_parameters()) {
    params.push_back(n);
    EXPECT_TRUE(t.requires_grad()) << n;
  }
  for (const auto& [n, t] : m.named_buffers()) buffers.push_back(n);
  EXPECT_EQ(params, (std::vector<std::string>{"bn.bias", "bn.weight", "conv.bias", "conv.weight", "fc.bias", "fc.weight",
                                              "ln.bias", "ln.weight"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"bn.running_mean", "bn.running_var"}));
  // A weight passed as an input is refused rather than silently ignored.
  try {
    m.run_named({{"x", randn({1, 2, 4, 4}, kFloat64)}, {"fc.bias", zeros({5}, kFloat64)}});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.bias' is a weight of the model, not an input"), std::string::npos) << e.what();
  }
  bx::OnnxModule frozen(small_net(small_net_weights()), {.frozen = true});
  for (const auto& [n, t] : frozen.named_parameters()) EXPECT_FALSE(t.requires_grad()) << n;
}

TEST(OnnxModule, DynamicBatchRunsAtAnyBatchSize) {
  bx::OnnxModule m(small_net(small_net_weights()));
  Tensor x = randn({5, 2, 4, 4}, kFloat64);
  Tensor all = m.forward(x);
  ASSERT_EQ(all.shape(), (Shape{5, 5}));
  // Each sample alone (batch 1) gives its row of the batch-5 result: the Reshape target is
  // computed from the input's shape at run time.
  for (int64_t i = 0; i < 5; ++i) EXPECT_TRUE(allclose(m.forward(x.narrow(0, i, 1)), all.narrow(0, i, 1), 1e-12, 1e-14));
  // Rows of a softmax sum to one.
  EXPECT_TRUE(allclose(sum(all, {1}), ones({5}, kFloat64), 1e-12, 1e-12));
}

TEST(OnnxModule, FoldedConvBatchNormEqualsTheGraphAsWritten) {
  // Inference without gradients folds BatchNormalization into the Conv before it (Note [Folding
  // BatchNormalization into Conv]); with gradients recording, the graph runs as written.
  bx::OnnxModule m(small_net(small_net_weights()));
  m.set_profiling(true);
  Tensor x = randn({3, 2, 4, 4}, kFloat64);
  Tensor as_written = m.forward(x);
  EXPECT_EQ(m.profile().count("Conv+BatchNormalization"), 0u);
  Tensor folded;
  {
    NoGradGuard no_grad;
    folded = m.forward(x);
  }
  EXPECT_EQ(m.profile().at("Conv+BatchNormalization").calls, 1);
  EXPECT_TRUE(allclose(folded, as_written, 1e-12, 1e-14));
}

// Note [Folded weights kept]: the folded weights are kept between inference runs, and every way a
// user changes the parameters (an in-place update, load_state_dict, an optimizer's step after
// fine-tuning) shows in the next run, which equals the graph as written with the new parameters.
TEST(OnnxModule, KeptFoldedWeightsFollowEveryChangeToTheParameters) {
  bx::OnnxModule m(small_net(small_net_weights()));
  const Tensor x = randn({3, 2, 4, 4}, kFloat64);
  const auto folded_equals_as_written = [&](const char* after) {
    SCOPED_TRACE(after);
    const Tensor as_written = m.forward(x).detach();
    for (int run = 0; run < 2; ++run) {
      NoGradGuard no_grad;
      EXPECT_TRUE(allclose(m.forward(x), as_written, 1e-12, 1e-14)) << "run " << run;
    }
    return as_written;
  };
  const Tensor first = folded_equals_as_written("as loaded");
  {
    NoGradGuard no_grad;
    Tensor gamma = m.weights().at("bn.weight"), w = m.weights().at("conv.weight");  // handles on the same storage
    gamma.mul_(1.7);
    w.narrow(0, 1, 1).fill_(0.05);
  }
  const Tensor changed = folded_equals_as_written("after in-place updates");
  EXPECT_FALSE(allclose(changed, first, 1e-6, 1e-6));
  auto state = m.state_dict();
  std::map<std::string, Tensor> fresh;
  for (const auto& [name, t] : state) fresh[name] = t.detach().clone();
  fresh.at("bn.running_var").fill_(3.0);
  m.load_state_dict(fresh);
  folded_equals_as_written("after load_state_dict");
  braid::optim::SGD sgd(m.parameters(), {.lr = 0.5});
  sum(m.forward(x) * randn({3, 5}, kFloat64)).backward();
  sgd.step();
  folded_equals_as_written("after an optimizer step");
}

// Note [Static nodes evaluated once]: in inference the nodes that read only weights and constants
// (here a QDQ-style quantisation of the weight, its transpose and a scaled bias) run on the first
// run only, and again after any change to what they read; the output always equals the closed
// form x W'^T + 2 b, W' the weight rounded to its int8 grid.
TEST(OnnxModule, StaticNodesRunOnceAndFollowChangesToTheWeights) {
  bx::GraphBuilder g(17);
  const std::string scale = g.scalar(0.05, kFloat32),
                    zero = g.node("Cast", {g.ints({0})}, {{"to", bx::attr_int(3)}})[0];
  auto q = g.node("QuantizeLinear", {"w", scale, zero})[0];
  auto dq = g.node("DequantizeLinear", {q, scale, zero})[0];
  auto wt = g.node("Transpose", {dq})[0];
  auto b2 = g.node("Mul", {"b", g.scalar(2.0, kFloat32)})[0];
  auto y = g.node("MatMul", {"x", wt})[0];
  g.graph().nodes.push_back(bx::Node{"out", "Add", "", {y, b2}, {"y"}, {}});
  bx::Model model = model_of("static_nodes", 17, g.graph());
  Generator gen(11);
  model.graph.initializers = {{"w", randn({3, 4}, kFloat32, &gen)}, {"b", randn({3}, kFloat32, &gen)}};
  model.graph.inputs.push_back(info("x", kFloat32, {2, 4}));
  model.graph.outputs.push_back(info("y", kFloat32, {2, 3}));
  bx::OnnxModule m(model);
  const Tensor x = randn({2, 4}, kFloat32, &gen);
  const auto closed_form = [&] {
    NoGradGuard no_grad;
    const Tensor w = m.weights().at("w"), grid = clamp(round(w / 0.05), -128, 127) * 0.05;
    return matmul(x, grid.mT()) + m.weights().at("b") * 2.0;
  };
  m.set_profiling(true);
  const auto calls = [&](const char* op) { return m.profile().count(op) ? m.profile().at(op).calls : 0; };
  const auto check = [&](const char* after) {
    SCOPED_TRACE(after);
    NoGradGuard no_grad;
    EXPECT_TRUE(allclose(m.forward(x), closed_form(), 1e-5, 1e-6));  // runs the static nodes if anything changed
    const int64_t transposes = calls("Transpose"), quantizes = calls("QuantizeLinear"), matmuls = calls("MatMul");
    EXPECT_TRUE(allclose(m.forward(x), closed_form(), 1e-5, 1e-6));
    EXPECT_EQ(calls("Transpose"), transposes) << "the static nodes ran again with nothing changed";
    EXPECT_EQ(calls("QuantizeLinear"), quantizes);
    EXPECT_EQ(calls("MatMul"), matmuls + 1);
  };
  check("as loaded");
  {
    NoGradGuard no_grad;
    Tensor w = m.weights().at("w"), b = m.weights().at("b");  // handles on the same storage
    w.mul_(1.5);
    b.narrow(0, 1, 1).fill_(0.25);
  }
  check("after in-place updates");
  std::map<std::string, Tensor> fresh;
  for (const auto& [name, t] : m.state_dict()) fresh[name] = t.detach().clone() * 0.5;
  m.load_state_dict(fresh);
  check("after load_state_dict");
}

// Note [Small values evaluated once per value]: a kept output that is a view of its input
// (Unsqueeze) is kept as a copy, so that a caller rewriting its input tensor in place after a run
// does not change what a later run with the old values gets.
TEST(OnnxModule, KeptSmallValuesDoNotAliasTheCallersTensors) {
  bx::GraphBuilder g(13);
  const std::string u = g.node("Unsqueeze", {"x", g.ints({0})})[0];
  g.graph().nodes.push_back(bx::Node{"as_float", "Cast", "", {u}, {"y"}, {{"to", bx::attr_int(1)}}});
  bx::Model m = model_of("small_values", 13, g.graph());
  m.graph.inputs.push_back(info("x", kInt64, {3}, false));
  m.graph.outputs.push_back(info("y", kFloat32, {1, 3}, false));
  bx::OnnxModule mod(m);
  NoGradGuard no_grad;
  Tensor a = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_EQ(mod.run({a})[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  a.copy_(tensor(std::vector<int64_t>{7, 8, 9}, {3}));  // the caller reuses its tensor
  const Tensor b = tensor(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_EQ(mod.run({b})[0].to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(mod.run({a})[0].to_vector<float>(), (std::vector<float>{7, 8, 9}));
}

// Note [QDQ pairs]: in inference a QuantizeLinear read only by a DequantizeLinear of the same scale
// and zero point runs as one fake_quantize, bit for bit the pair as written.
TEST(OnnxModule, QdqPairsRunAsOnePassWithTheSameBits) {
  for (DType zt : {kUInt8, kInt8}) {
    SCOPED_TRACE(dtype_name(zt));
    bx::GraphBuilder g(13);
    const std::string scale = g.scalar(0.03, kFloat32);
    const std::string zero =
        g.node("Cast", {g.ints({zt == kInt8 ? -4 : 120})}, {{"to", bx::attr_int(zt == kInt8 ? 3 : 2)}})[0];
    auto q = g.node("QuantizeLinear", {"x", scale, zero})[0];
    auto dq = g.node("DequantizeLinear", {q, scale, zero})[0];
    g.graph().nodes.push_back(bx::Node{"out", "Relu", "", {dq}, {"y"}, {}});
    bx::Model model = model_of("qdq", 13, g.graph());
    model.graph.inputs.push_back(info("x", kFloat32, {2, 1000}));
    model.graph.outputs.push_back(info("y", kFloat32, {2, 1000}));
    bx::OnnxModule m(model);
    Generator gen(4);
    Tensor x = randn({2, 1000}, kFloat32, &gen) * 5.0;
    x.narrow(1, 0, 3).copy_(tensor(std::vector<float>{1e9f, -1e9f, 0.045f}, {1, 3}).expand({2, 3}));
    x.set_requires_grad();
    auto [as_written, fused] = as_written_and_in_inference(m, x);
    EXPECT_EQ(fused.to_vector<float>(), as_written.to_vector<float>());
    m.set_profiling(true);
    NoGradGuard no_grad;
    m.forward(x);
    EXPECT_EQ(m.profile().count("QuantizeLinear+DequantizeLinear"), 1u);
    EXPECT_EQ(m.profile().count("DequantizeLinear"), 0u);
  }
}

// Note [Fusing activations into Conv]: in inference a Relu, Clip, HardSwish or HardSigmoid that
// alone reads a Conv's output (or its folded BatchNormalization's) runs as the convolution's
// epilogue; with gradients recording the graph runs as written. float32, so that the CPU runs the
// epilogue inside oneDNN's convolution (the suite sets BRAID_ONEDNN_MIN_MACS=0).
TEST(OnnxModule, FusedConvActivationsEqualTheGraphAsWritten) {
  struct Case {
    std::string op;
    bool bn;
    std::map<std::string, bx::Attribute> attrs;
    std::vector<double> bounds;  // Clip's min and max inputs
    std::string profiled;
  };
  const std::vector<Case> cases = {
      {"Relu", false, {}, {}, "Conv+Relu"},
      {"HardSwish", true, {}, {}, "Conv+BatchNormalization+HardSwish"},
      {"HardSigmoid", true, {{"alpha", bx::attr_float(0.25)}, {"beta", bx::attr_float(0.4)}}, {}, "Conv+BatchNormalization+HardSigmoid"},
      {"Clip", false, {}, {-0.5, 0.75}, "Conv+Clip"},
  };
  Generator gen(3);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    bx::GraphBuilder g(17);
    std::vector<std::string> bounds;  // Constant nodes ahead of the Conv, as exporters place them
    for (double v : c.bounds) bounds.push_back(g.scalar(v, kFloat32));
    std::string y = g.node("Conv", {"x", "w", "b"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}, {"strides", bx::attr_ints({2, 1})}})[0];
    if (c.bn) y = g.node("BatchNormalization", {y, "gamma", "beta", "mean", "var"})[0];
    std::vector<std::string> in{y};
    in.insert(in.end(), bounds.begin(), bounds.end());
    g.graph().nodes.push_back(bx::Node{"act", c.op, "", in, {"y"}, c.attrs});
    bx::Model m = model_of("conv_" + c.op, 17, g.graph());
    m.graph.initializers.insert({{"w", randn({16, 8, 3, 3}, kFloat32, &gen, 0, 0.3)}, {"b", randn({16}, kFloat32, &gen)},
                                 {"gamma", rand({16}, kFloat32, &gen, 0.5, 1.5)}, {"beta", randn({16}, kFloat32, &gen)},
                                 {"mean", randn({16}, kFloat32, &gen, 0, 0.1)}, {"var", rand({16}, kFloat32, &gen, 0.5, 2)}});
    m.graph.inputs.push_back(info("x", kFloat32, {2, 8, 9, 10}));
    m.graph.outputs.push_back(info("y", kFloat32, {2, 16, 5, 10}));
    bx::OnnxModule mod(m);
    mod.set_profiling(true);
    const Tensor x = randn({2, 8, 9, 10}, kFloat32, &gen) * 2.0;
    const Tensor as_written = mod.forward(x).detach();
    EXPECT_EQ(mod.profile().count(c.profiled), 0u);
    Tensor fused;
    {
      NoGradGuard no_grad;
      fused = mod.forward(x);
    }
    ASSERT_EQ(mod.profile().count(c.profiled), 1u);
    EXPECT_EQ(mod.profile().at(c.profiled).calls, 1);
    EXPECT_EQ(mod.profile().count(c.op), 1u) << "the as-written run's " << c.op << " only";
    EXPECT_TRUE(allclose(fused, as_written, 1e-5, 1e-5)) << "max |diff| " << amax(abs(fused - as_written)).item();
  }
}

// HardSwish as PaddlePaddle writes it, x * Clip(x + 3, 0, 6) / 6 after a folded Conv +
// BatchNormalization, with the Constant nodes between the ops as in its exports: fused into the
// convolution when the numbers are HardSwish's, and left as written when one differs.
TEST(OnnxModule, WrittenOutHardSwishFusesIntoTheConv) {
  Generator gen(4);
  for (double three : {3.0, 2.5}) {
    SCOPED_TRACE(three);
    bx::GraphBuilder g(11);
    const std::string k3 = g.scalar(three, kFloat32), k6 = g.scalar(6.0, kFloat32);
    std::string y = g.node("Conv", {"x", "w"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0];
    y = g.node("BatchNormalization", {y, "gamma", "beta", "mean", "var"})[0];
    const std::string added = g.node("Add", {y, k3})[0];
    const std::string k0 = g.scalar(0.0, kFloat32), k6b = g.scalar(6.0, kFloat32);
    const std::string clipped = g.node("Clip", {added, k0, k6b})[0];
    const std::string product = g.node("Mul", {y, clipped})[0];
    g.graph().nodes.push_back(bx::Node{"div", "Div", "", {product, k6}, {"y"}, {}});
    bx::Model m = model_of("paddle_hardswish", 11, g.graph());
    m.graph.initializers.insert({{"w", randn({16, 8, 3, 3}, kFloat32, &gen, 0, 0.3)},
                                 {"gamma", rand({16}, kFloat32, &gen, 0.5, 1.5)}, {"beta", randn({16}, kFloat32, &gen)},
                                 {"mean", randn({16}, kFloat32, &gen, 0, 0.1)}, {"var", rand({16}, kFloat32, &gen, 0.5, 2)}});
    m.graph.inputs.push_back(info("x", kFloat32, {2, 8, 6, 7}));
    m.graph.outputs.push_back(info("y", kFloat32, {2, 16, 6, 7}));
    bx::OnnxModule mod(m);
    mod.set_profiling(true);
    const Tensor x = randn({2, 8, 6, 7}, kFloat32, &gen) * 3.0;
    const auto [as_written, fused] = as_written_and_in_inference(mod, x);
    EXPECT_EQ(mod.profile().count("Conv+BatchNormalization+HardSwish"), three == 3.0 ? 1u : 0u);
    EXPECT_EQ(mod.profile().at("Div").calls, three == 3.0 ? 1 : 2);
    EXPECT_TRUE(allclose(fused, as_written, 1e-5, 1e-5)) << "max |diff| " << amax(abs(fused - as_written)).item();
  }
}

// Note [Folding a scalar affine into Conv]: PP-OCRv4's learnable scale and shift, Mul and Add by
// one-element constants after a Conv (the scale's Constant placed after the Conv, the shift an
// initialiser), folded into the convolution in inference, with the written-out HardSwish after it
// and the next scale and shift fused as its epilogue; a per-channel scale is left as written. The
// unfolded run (gradients recording) is the reference, and an explicit composition of braid ops
// checks both.
TEST(OnnxModule, ScalarAffineAfterConvFoldsIntoIt) {
  Generator gen(6);
  for (bool scalar : {true, false}) {
    SCOPED_TRACE(scalar ? "scalar scale" : "per-channel scale");
    bx::GraphBuilder g(11);
    std::string y = g.node("Conv", {"x", "w", "b"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0];
    const std::string scale = scalar ? g.scalar(0.75, kFloat32) : "scale";
    y = g.node("Mul", {scale, y})[0];
    y = g.node("Add", {y, "shift"})[0];
    const std::string k3 = g.scalar(3.0, kFloat32), k0 = g.scalar(0.0, kFloat32), k6 = g.scalar(6.0, kFloat32);
    const std::string clipped = g.node("Clip", {g.node("Add", {y, k3})[0], k0, k6})[0];
    const std::string product = g.node("Mul", {y, clipped})[0];
    const std::string swished = g.node("Div", {product, k6})[0];
    // A second affine after the activation: the convolution's epilogue as well.
    const std::string k15 = g.scalar(1.5, kFloat32), km = g.scalar(-0.25, kFloat32);
    g.graph().nodes.push_back(bx::Node{"post_add", "Add", "", {g.node("Mul", {swished, k15})[0], km}, {"y"}, {}});
    bx::Model m = model_of("learnable_affine", 11, g.graph());
    m.graph.initializers.insert({{"w", randn({16, 8, 3, 3}, kFloat32, &gen, 0, 0.3)},
                                 {"b", randn({16}, kFloat32, &gen)},
                                 {"shift", tensor(std::vector<float>{-0.4f}, {1})},
                                 {"scale", rand({16, 1, 1}, kFloat32, &gen, 0.5, 1.5)}});
    m.graph.inputs.push_back(info("x", kFloat32, {2, 8, 6, 7}));
    m.graph.outputs.push_back(info("y", kFloat32, {2, 16, 6, 7}));
    bx::OnnxModule mod(m);
    mod.set_profiling(true);
    const Tensor x = randn({2, 8, 6, 7}, kFloat32, &gen) * 3.0;
    const auto [as_written, folded] = as_written_and_in_inference(mod, x);
    EXPECT_EQ(mod.profile().count("Conv+Affine+HardSwish"), scalar ? 1u : 0u);
    // As written: the shift, HardSwish's + 3 and the last shift. In inference, with a per-channel
    // scale, the scale and the shift run as one elementwise chain (Note [Elementwise chains]), and
    // the Div, the Mul and the last Add as another; with a scalar one, everything but HardSwish's
    // + 3 is the Conv's epilogue.
    EXPECT_EQ(mod.profile().at("Div").calls, 1);
    EXPECT_EQ(mod.profile().at("Add").calls, scalar ? 3 : 4);
    EXPECT_EQ(scalar ? 2 : mod.profile().at("elementwise chain").calls, 2);
    EXPECT_EQ(mod.profile().count("elementwise chain"), scalar ? 0u : 1u);
    EXPECT_TRUE(allclose(folded, as_written, 1e-5, 1e-5)) << "max |diff| " << amax(abs(folded - as_written)).item();
    const Tensor& w = mod.weights().at("w");
    const Tensor s = scalar ? full({}, 0.75, kFloat32) : mod.weights().at("scale");
    const Tensor z = conv2d(x, w, mod.weights().at("b"), {1, 1}, {1, 1}) * s - 0.4;
    const Tensor want = z * clamp(z + 3.0, 0.0, 6.0) / 6.0 * 1.5 - 0.25;
    EXPECT_TRUE(allclose(folded, want.detach(), 1e-5, 1e-5)) << "max |diff| " << amax(abs(folded - want)).item();
  }
}

TEST(OnnxModule, ToSequentialCutsWhereOneValueCrossesAndSharesTheWeights) {
  // small_net: Conv, BatchNormalization, Tanh, then the Shape/Gather/Concat/Reshape chain (which
  // reads the activation twice, so no cut inside it), Gemm, LayerNormalization, Softmax.
  bx::OnnxModule m(small_net(small_net_weights()));
  auto seq = m.to_sequential();
  std::vector<std::string> kinds;
  for (size_t i = 0; i < seq->size(); ++i) kinds.push_back(seq->at(i)->describe());
  ASSERT_EQ(seq->size(), 7u) << ::testing::PrintToString(kinds);
  EXPECT_NE(kinds[3].find("Shape"), std::string::npos);
  EXPECT_NE(kinds[3].find("Reshape"), std::string::npos);
  Tensor x = randn({3, 2, 4, 4}, kFloat64);
  Tensor want = m.forward(x);
  Tensor got = seq->forward(x);
  EXPECT_TRUE(allclose(got, want, 1e-14, 1e-14));
  // The same tensors: gradients through the Sequential land on the module's parameters.
  EXPECT_EQ(seq->parameters().size(), m.parameters().size());
  m.zero_grad();
  sum(got * got).backward();
  for (const auto& [name, p] : m.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
}

TEST(OnnxModule, PreflightListsEveryProblemWithNodeNames) {
  bx::Model m = model_of("bad.onnx", 17);
  m.graph.inputs.push_back(info("x", kFloat32, {1, 3}));
  m.graph.nodes.push_back(bx::Node{"first", "Relu", "", {"x"}, {"a"}, {}});
  m.graph.nodes.push_back(bx::Node{"warp", "Warp", "", {"a"}, {"b"}, {}});
  m.graph.nodes.push_back(bx::Node{"sm", "Softmax", "", {"b"}, {"c"}, {{"temperature", bx::attr_float(2)}}});
  m.graph.nodes.push_back(bx::Node{"vendor", "FastGelu", "com.example", {"c"}, {"y"}, {}});
  m.graph.outputs.push_back(info("y", kFloat32, {1, 3}));
  try {
    bx::OnnxModule mod(m);
    FAIL() << "expected NotImplementedError";
  } catch (const NotImplementedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.onnx: 3 unsupported"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Warp 'warp': op 'Warp' is not supported"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Softmax 'sm': attribute 'temperature' is not supported"), std::string::npos) << msg;
    EXPECT_NE(msg.find("op 'com.example.FastGelu'"), std::string::npos) << msg;
  }
}

TEST(OnnxModule, ShapesFromDataAreCheckedBeforeAllocating) {
  // A hostile ConstantOfShape asking for 2^62 elements is an error naming the node, not an attempt
  // to allocate.
  bx::Model m = model_of("huge.onnx", 17);
  m.graph.inputs.push_back(info("s", kInt64, {2}, false));
  m.graph.nodes.push_back(bx::Node{"fill", "ConstantOfShape", "", {"s"}, {"y"}, {}});
  m.graph.outputs.push_back(info("y", kFloat32, {}, false));
  m.graph.outputs.back().has_shape = false;
  bx::OnnxModule mod(m);
  try {
    mod.forward(tensor(std::vector<int64_t>{int64_t{1} << 31, int64_t{1} << 31}, {2}));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("huge.onnx: ConstantOfShape 'fill': shape [2147483648, 2147483648] is too large"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(mod.forward(tensor(std::vector<int64_t>{2, 3}, {2})).shape(), (Shape{2, 3}));
}

TEST(OnnxModule, CustomOpsInAUserRegistry) {
  bx::Model m = model_of("custom.onnx", 17);
  m.opsets["com.example"] = 1;
  m.graph.inputs.push_back(info("x", kFloat32, {2, 3}));
  m.graph.nodes.push_back(bx::Node{"g", "Twice", "com.example", {"x"}, {"y"}, {}});
  m.graph.outputs.push_back(info("y", kFloat32, {2, 3}));
  EXPECT_THROW(bx::OnnxModule{m}, NotImplementedError);
  bx::OpRegistry reg = bx::OpRegistry::global();
  bx::OpSchema s;
  s.domain = "com.example";
  s.op_type = "Twice";
  s.run = [](bx::OpContext& c) { return std::vector<Tensor>{c.input(0) * 2.0}; };
  reg.add(s);
  bx::OnnxModule mod(m, {.registry = &reg});
  Tensor x = randn({2, 3});
  EXPECT_TRUE(allclose(mod.forward(x), x * 2.0));
}

TEST(OnnxModule, BadIndicesAndInputsAreNamed) {
  bx::Model m = model_of("gather.onnx", 17);
  m.graph.inputs.push_back(info("x", kFloat32, {4, 3}, false));
  m.graph.inputs.push_back(info("i", kInt64, {2}, false));
  m.graph.nodes.push_back(bx::Node{"pick", "Gather", "", {"x", "i"}, {"y"}, {{"axis", bx::attr_int(0)}}});
  m.graph.outputs.push_back(info("y", kFloat32, {2, 3}, false));
  bx::OnnxModule mod(m);
  Tensor x = randn({4, 3});
  // Negative indices count from the end, as ONNX says.
  auto out = mod.run({x, tensor(std::vector<int64_t>{-1, 0}, {2})});
  EXPECT_TRUE(equal(out[0], concat({x.narrow(0, 3, 1), x.narrow(0, 0, 1)}, 0)));
  try {
    mod.run({x, tensor(std::vector<int64_t>{1, 4}, {2})});
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("gather.onnx: Gather 'pick': index 4 is out of range for axis 0 of size 4"),
              std::string::npos)
        << e.what();
  }
  try {
    mod.run({randn({4, 5}), tensor(std::vector<int64_t>{0, 1}, {2})});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' has shape [4, 5], the model expects [4, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mod.forward(x), ValueError);  // two inputs: forward(x) names them and points to run()
  // By name: the same result; a misspelt input is refused naming the real ones.
  auto named = mod.run_named({{"x", x}, {"i", tensor(std::vector<int64_t>{-1, 0}, {2})}});
  EXPECT_TRUE(equal(named.at("y"), out[0]));
  try {
    mod.run_named({{"x", x}, {"idx", tensor(std::vector<int64_t>{0}, {1})}});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no graph input named 'idx' (inputs: ['x', 'i'])"), std::string::npos) << e.what();
  }
}

}  // namespace
