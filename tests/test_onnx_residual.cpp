// Residual blocks in the ONNX executor's inference (Note [Residual as a post-op] in
// src/backend/cpu/conv.cpp): Conv, BatchNormalization, then an Add of a value made before the
// convolution starts and a Relu, as PyTorch's exporter writes a ResNet block, run as one
// convolution whose epilogue adds the shortcut. Against the graph as written (gradients recording)
// and the float64 composition of braid's ops; the caller's input is never written into.
#include <gtest/gtest.h>

#include <memory>

#include "braid/braid.h"
#include "braid/onnx/export.h"
#include "onnx_graphs.h"

using namespace braid;
namespace bx = braid::onnx;
using onnx_test::as_written_and_in_inference;
using onnx_test::info;
using onnx_test::model_of;

namespace {

struct Weights {
  std::map<std::string, Tensor> t;
  Weights(Generator& gen, const std::vector<std::string>& convs) {
    for (const std::string& c : convs) {
      t[c + ".w"] = randn({8, 8, 3, 3}, kFloat32, &gen, 0, 0.2);
      t[c + ".gamma"] = rand({8}, kFloat32, &gen, 0.5, 1.5);
      t[c + ".beta"] = randn({8}, kFloat32, &gen);
      t[c + ".mean"] = randn({8}, kFloat32, &gen, 0, 0.1);
      t[c + ".var"] = rand({8}, kFloat32, &gen, 0.5, 2);
    }
  }
  // Conv (3x3, padding 1) then inference BatchNormalization, in float64.
  Tensor conv_bn(const std::string& c, const Tensor& x) const {
    const Tensor z = conv2d(x, t.at(c + ".w").to(kFloat64), Tensor(), {1, 1}, {1, 1});
    const auto ch = [&](const char* k) { return t.at(c + k).to(kFloat64).view({1, 8, 1, 1}); };
    return (z - ch(".mean")) / sqrt(ch(".var") + 1e-5) * ch(".gamma") + ch(".beta");
  }
};

std::string conv_bn(bx::GraphBuilder& g, const std::string& c, const std::string& x) {
  const std::string y = g.node("Conv", {x, c + ".w"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0];
  return g.node("BatchNormalization", {y, c + ".gamma", c + ".beta", c + ".mean", c + ".var"})[0];
}

// The model of graph g with weights w, input x and output y of the one shape dims.
bx::Model model(bx::GraphBuilder& g, const char* name, const Weights& w, const std::vector<int64_t>& dims) {
  bx::Model m = model_of(name, 17, g.graph());
  m.graph.initializers = w.t;
  m.graph.inputs.push_back(info("x", kFloat32, dims));
  m.graph.outputs.push_back(info("y", kFloat32, dims));
  return m;
}

// The module of graph g run in inference on x; the module kept for its profile.
struct Ran {
  std::unique_ptr<bx::OnnxModule> mod;
  Tensor y;
};
Ran run_in_inference(bx::GraphBuilder& g, const char* name, const Weights& w, const Tensor& x) {
  Ran r{std::make_unique<bx::OnnxModule>(model(g, name, w, std::vector<int64_t>(x.shape().begin(), x.shape().end()))),
        Tensor()};
  r.mod->set_profiling(true);
  NoGradGuard no_grad;
  r.y = r.mod->forward(x);
  return r;
}

// stem: s = Relu(Conv(x)); body: Relu(BN(Conv(s))) then BN(Conv(.)); shortcut: s itself, or
// BN(Conv(s)) written after the body (as a downsampling block's); y = Relu(body + shortcut).
bx::Model block(bool shortcut_conv, const Weights& w) {
  bx::GraphBuilder g(17);
  const std::string s =
      g.node("Relu", {g.node("Conv", {"x", "stem.w"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0]})[0];
  const std::string body = conv_bn(g, "b2", g.node("Relu", {conv_bn(g, "b1", s)})[0]);
  const std::string shortcut = shortcut_conv ? conv_bn(g, "sc", s) : s;
  const std::string sum = g.node("Add", {body, shortcut})[0];
  g.graph().nodes.push_back(bx::Node{"out", "Relu", "", {sum}, {"y"}, {}});
  return model(g, "residual_block", w, {2, 8, 7, 9});
}

TEST(OnnxResidual, ShortcutAddAndReluRunAsTheConvolutionsEpilogue) {
  for (bool shortcut_conv : {false, true}) {
    SCOPED_TRACE(shortcut_conv ? "shortcut convolution after the body" : "identity shortcut");
    Generator gen(31);
    Weights w(gen, {"stem", "b1", "b2", "sc"});
    bx::OnnxModule mod(block(shortcut_conv, w));
    mod.set_profiling(true);
    const Tensor x = randn({2, 8, 7, 9}, kFloat32, &gen);
    const Tensor x_before = x.clone();
    const auto [as_written, fused] = as_written_and_in_inference(mod, x);
    ASSERT_EQ(mod.profile().count("Conv+BatchNormalization+Add+Relu"), 1u);
    EXPECT_EQ(mod.profile().at("Conv+BatchNormalization+Add+Relu").calls, 1);
    EXPECT_EQ(mod.profile().at("Add").calls, 1) << "the as-written run's Add only";
    EXPECT_TRUE(allclose(fused, as_written, 1e-5, 1e-5)) << "max |diff| " << amax(abs(fused - as_written)).item();
    const Tensor s = relu(conv2d(x.to(kFloat64), w.t.at("stem.w").to(kFloat64), Tensor(), {1, 1}, {1, 1}));
    const Tensor body = w.conv_bn("b2", relu(w.conv_bn("b1", s)));
    const Tensor want = relu(body + (shortcut_conv ? w.conv_bn("sc", s) : s));
    EXPECT_TRUE(allclose(fused.to(kFloat64), want, 1e-4, 1e-4));
    EXPECT_TRUE(equal(x, x_before));
    // Again, with the memory the first run gave back: the same numbers.
    NoGradGuard no_grad;
    EXPECT_TRUE(equal(mod.forward(x), fused));
  }
}

// The caller's input as the shortcut: read by the block's first convolution and added after its
// last. It may not be written into, so the block's output goes to new memory.
TEST(OnnxResidual, TheCallersInputAsTheShortcutIsLeftAsItWas) {
  Generator gen(32);
  Weights w(gen, {"b1", "b2"});
  bx::GraphBuilder g(17);
  const std::string body = conv_bn(g, "b2", g.node("Relu", {conv_bn(g, "b1", "x")})[0]);
  g.graph().nodes.push_back(bx::Node{"out", "Relu", "", {g.node("Add", {"x", body})[0]}, {"y"}, {}});
  const Tensor x = randn({1, 8, 6, 6}, kFloat32, &gen);
  const Tensor x_before = x.clone();
  const Ran r = run_in_inference(g, "identity_block", w, x);
  EXPECT_EQ(r.mod->profile().count("Conv+BatchNormalization+Add+Relu"), 1u);
  EXPECT_TRUE(equal(x, x_before));
  const Tensor xd = x.to(kFloat64);
  EXPECT_TRUE(allclose(r.y.to(kFloat64), relu(xd + w.conv_bn("b2", relu(w.conv_bn("b1", xd)))), 1e-4, 1e-4));
}

// A node that reads the shortcut between the convolution and the Add (a Sigmoid here) sees it as
// it was: the fused convolution writes its result into new memory, not into the shortcut's.
TEST(OnnxResidual, AShortcutReadAfterTheConvolutionIsNotWrittenInto) {
  Generator gen(33);
  Weights w(gen, {"stem", "b1", "b2"});
  bx::GraphBuilder g(17);
  const std::string s =
      g.node("Relu", {g.node("Conv", {"x", "stem.w"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}})[0]})[0];
  const std::string body = conv_bn(g, "b2", g.node("Relu", {conv_bn(g, "b1", s)})[0]);
  const std::string gate = g.node("Sigmoid", {s})[0];
  const std::string block = g.node("Relu", {g.node("Add", {body, s})[0]})[0];
  g.graph().nodes.push_back(bx::Node{"out", "Mul", "", {block, gate}, {"y"}, {}});
  const Tensor x = randn({1, 8, 6, 7}, kFloat32, &gen);
  const Ran r = run_in_inference(g, "shortcut_read_late", w, x);
  EXPECT_EQ(r.mod->profile().count("Conv+BatchNormalization+Add+Relu"), 1u);
  const Tensor sd = relu(conv2d(x.to(kFloat64), w.t.at("stem.w").to(kFloat64), Tensor(), {1, 1}, {1, 1}));
  const Tensor body64 = w.conv_bn("b2", relu(w.conv_bn("b1", sd)));
  EXPECT_TRUE(allclose(r.y.to(kFloat64), relu(body64 + sd) * sigmoid(sd), 1e-4, 1e-4));
}

}  // namespace
