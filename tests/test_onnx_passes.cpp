// The ONNX executor's inference passes (Note [Graph passes] in onnx/passes/passes.cpp): which
// passes fired where, each switched off by name leaving its nodes as written (and the result the
// same), an unknown name refused naming the passes, and a fused node whose pattern does not apply
// in a run falling back to its nodes: an exact-GELU pattern with another constant than 0.5,
// checked against its closed form.
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

// x -> Conv 'c1' -> BatchNormalization 'bn' -> Relu 'r' -> Div/Erf/Add/Mul/Mul (GELU, its halving
// constant `half`) -> y.
bx::Model conv_then_gelu(double half) {
  bx::GraphBuilder g(17);
  auto& nodes = g.graph().nodes;
  const std::string sqrt2 = g.scalar(std::sqrt(2.0), kFloat32), one = g.scalar(1.0, kFloat32),
                    k = g.scalar(half, kFloat32);
  nodes.push_back(bx::Node{"c1", "Conv", "", {"x", "w"}, {"conv"}, {{"pads", bx::attr_ints({1, 1, 1, 1})}}});
  nodes.push_back(bx::Node{"bn", "BatchNormalization", "", {"conv", "gamma", "beta", "mean", "var"}, {"bn"}, {}});
  nodes.push_back(bx::Node{"r", "Relu", "", {"bn"}, {"act"}, {}});
  nodes.push_back(bx::Node{"div", "Div", "", {"act", sqrt2}, {"scaled"}, {}});
  nodes.push_back(bx::Node{"erf", "Erf", "", {"scaled"}, {"e"}, {}});
  nodes.push_back(bx::Node{"add", "Add", "", {"e", one}, {"e1"}, {}});
  nodes.push_back(bx::Node{"mul1", "Mul", "", {"act", "e1"}, {"xe"}, {}});
  nodes.push_back(bx::Node{"mul2", "Mul", "", {"xe", k}, {"y"}, {}});
  bx::Model m = model_of("passes", 17, g.graph());
  Generator gen(5);
  m.graph.initializers = {{"w", randn({4, 3, 3, 3}, kFloat32, &gen, 0, 0.3)},
                          {"gamma", rand({4}, kFloat32, &gen, 0.5, 1.5)},
                          {"beta", randn({4}, kFloat32, &gen)},
                          {"mean", randn({4}, kFloat32, &gen)},
                          {"var", rand({4}, kFloat32, &gen, 0.5, 2.0)}};
  m.graph.inputs.push_back(info("x", kFloat32, {2, 3, 6, 5}));
  m.graph.outputs.push_back(info("y", kFloat32, {2, 4, 6, 5}));
  return m;
}

// The closed form of conv_then_gelu: BatchNormalization of the convolution by its definition, then
// relu and x * (1 + erf(x / sqrt 2)) * half, in float64.
std::vector<double> closed_form(const bx::Model& m, const Tensor& x, double half) {
  const auto& w = m.graph.initializers;
  const Tensor c = conv2d(x.to(kFloat64), w.at("w").to(kFloat64), Tensor(), {1, 1}, {1, 1});
  const auto per_channel = [&](const char* name) { return w.at(name).to(kFloat64).reshape({1, 4, 1, 1}); };
  const Tensor bn = (c - per_channel("mean")) / sqrt(per_channel("var") + 1e-5) * per_channel("gamma") +
                    per_channel("beta");
  std::vector<double> out = relu(bn).to_vector<double>();
  for (double& v : out) v = v * (1 + std::erf(v / std::sqrt(2.0))) * half;
  return out;
}

void expect_near(const Tensor& got, const std::vector<double>& want) {
  const std::vector<float> g = contiguous(got).to_vector<float>();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
}

int64_t calls(const bx::OnnxModule& m, const char* row) {
  return m.profile().count(row) ? m.profile().at(row).calls : 0;
}

}  // namespace

TEST(OnnxPasses, FiredPassesNameTheNodesTheyReplaced) {
  bx::OnnxModule mod(conv_then_gelu(0.5), {.frozen = true});
  const std::vector<bx::FiredPass> fired = mod.fired_passes();
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[0].pass, "conv");
  EXPECT_EQ(fired[0].node, "c1");
  EXPECT_EQ(fired[0].replaced,
            (std::vector<std::string>{"Conv 'c1'", "BatchNormalization 'bn'", "Relu 'r'"}));
  EXPECT_EQ(fired[1].pass, "gelu");
  EXPECT_EQ(fired[1].replaced,
            (std::vector<std::string>{"Div 'div'", "Erf 'erf'", "Add 'add'", "Mul 'mul1'", "Mul 'mul2'"}));
  std::vector<std::string> names;
  for (const bx::OnnxPass& p : bx::onnx_passes()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"qdq", "gelu", "conv", "gate", "chain", "batch_norm"}));
}

TEST(OnnxPasses, EachPassSwitchedOffLeavesItsNodesAsWrittenWithTheSameResult) {
  const bx::Model model = conv_then_gelu(0.5);
  Generator gen(8);
  const Tensor x = randn({2, 3, 6, 5}, kFloat32, &gen);
  const std::vector<double> want = closed_form(model, x, 0.5);
  struct Case {
    std::vector<std::string> off;
    std::vector<std::string> fired;    // the passes that fire, in graph order
    std::vector<const char*> rows;     // profile rows of this run
    std::vector<const char*> no_rows;  // and rows it must not have
  };
  // With the gelu pass off, its Add, Mul and Mul make an elementwise chain; with the conv pass off,
  // the BatchNormalization runs as the batch_norm pass's scale and shift (profiled under its name).
  const std::vector<Case> cases = {
      {{}, {"conv", "gelu"}, {"Conv+BatchNormalization+Relu", "Gelu"}, {"Conv", "Erf", "BatchNormalization"}},
      {{"conv"}, {"batch_norm", "gelu"}, {"Conv", "BatchNormalization", "Relu", "Gelu"}, {"Erf"}},
      {{"gelu"}, {"conv", "chain"}, {"Conv+BatchNormalization+Relu", "Div", "Erf", "elementwise chain"}, {"Gelu"}},
      {{"conv", "gelu"}, {"batch_norm", "chain"}, {"Conv", "Relu", "Erf", "elementwise chain"}, {"Gelu"}},
      {{"all"}, {}, {"Conv", "BatchNormalization", "Relu", "Div", "Erf", "Add"}, {"Gelu", "elementwise chain"}},
  };
  for (const Case& c : cases) {
    std::string trace = "off:";
    for (const auto& o : c.off) trace += " " + o;
    SCOPED_TRACE(trace);
    bx::OnnxModule mod(model, {.frozen = true, .disabled_passes = c.off});
    std::vector<std::string> fired;
    for (const bx::FiredPass& f : mod.fired_passes()) fired.push_back(f.pass);
    EXPECT_EQ(fired, c.fired);
    mod.set_profiling(true);
    expect_near(mod.forward(x), want);
    for (const char* row : c.rows) EXPECT_EQ(calls(mod, row), 1) << row;
    for (const char* row : c.no_rows) EXPECT_EQ(calls(mod, row), 0) << row;
  }
}

TEST(OnnxPasses, AnUnknownPassIsRefusedNamingThePasses) {
  try {
    bx::OnnxModule mod(conv_then_gelu(0.5), {.disabled_passes = {"convv"}});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown ONNX pass 'convv'"), std::string::npos) << what;
    EXPECT_NE(what.find("qdq, gelu, conv, gate, chain, batch_norm, or all"), std::string::npos) << what;
  }
}

// The gelu pass matches the five nodes whatever their constants; in the run, halving by 0.4 is not
// GELU, so the fused node runs its nodes as written (its definition), and the result is theirs.
TEST(OnnxPasses, AFusedNodeWhosePatternDoesNotApplyRunsItsNodes) {
  const bx::Model model = conv_then_gelu(0.4);
  bx::OnnxModule mod(model, {.frozen = true});
  ASSERT_EQ(mod.fired_passes().size(), 2u);
  EXPECT_EQ(mod.fired_passes()[1].pass, "gelu");
  Generator gen(9);
  const Tensor x = randn({2, 3, 6, 5}, kFloat32, &gen);
  mod.set_profiling(true);
  expect_near(mod.forward(x), closed_form(model, x, 0.4));
  EXPECT_EQ(calls(mod, "Gelu"), 0);
  EXPECT_EQ(calls(mod, "Erf"), 1);
  EXPECT_EQ(calls(mod, "Mul"), 2);
  EXPECT_EQ(calls(mod, "Conv+BatchNormalization+Relu"), 1);
}

// The kept-value caches run on the rewritten graph: a shape computation after fused nodes still
// forms its group (Note [Shape computations evaluated once per shape]) and is bound on the second run.
TEST(OnnxPasses, ShapeComputationsAfterFusedNodesAreStillKept) {
  bx::Model m = conv_then_gelu(0.5);
  auto& nodes = m.graph.nodes;
  const Tensor starts = tensor(std::vector<int64_t>{0}, {1}), ends = tensor(std::vector<int64_t>{1}, {1}),
               rest = tensor(std::vector<int64_t>{-1}, {1});
  for (const auto& [name, t] : {std::pair{"starts", starts}, std::pair{"ends", ends}, std::pair{"rest", rest}}) {
    bx::Attribute value;
    value.kind = bx::Attribute::Kind::Tensor;
    value.t = t;
    nodes.push_back(bx::Node{std::string(name) + "_const", "Constant", "", {}, {name}, {{"value", value}}});
  }
  nodes.push_back(bx::Node{"shape", "Shape", "", {"y"}, {"s"}, {}});
  nodes.push_back(bx::Node{"first", "Slice", "", {"s", "starts", "ends"}, {"n0"}, {}});
  nodes.push_back(bx::Node{"target", "Concat", "", {"n0", "rest"}, {"t"}, {{"axis", bx::attr_int(0)}}});
  nodes.push_back(bx::Node{"flat", "Reshape", "", {"y", "t"}, {"flat"}, {}});
  m.graph.outputs = {info("flat", kFloat32, {2, 120})};
  bx::OnnxModule mod(m, {.frozen = true});
  Generator gen(10);
  const Tensor x = randn({2, 3, 6, 5}, kFloat32, &gen);
  const std::vector<double> want = closed_form(conv_then_gelu(0.5), x, 0.5);
  mod.set_profiling(true);
  for (int run = 0; run < 2; ++run) {
    const Tensor flat = mod.forward(x);
    ASSERT_EQ(flat.shape(), (Shape{2, 120}));
    expect_near(flat, want);
  }
  EXPECT_EQ(calls(mod, "shape computations"), 1) << "bound on the second run";
  EXPECT_EQ(calls(mod, "Shape"), 1) << "run on the first only";
}
