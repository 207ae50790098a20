// Shape computations of the ONNX executor's inference (Note [Shape computations evaluated once per
// shape] in onnx/shape_groups.cpp) on a graph written as PyTorch's exporter writes an attention
// head split: the target of a Reshape computed from the input's shape by Shape, Gather, Unsqueeze
// and Concat nodes with Constant indices. Bound from the kept values while the input's shape is the
// same, computed again when it changes, and read inside a subgraph.
#include <gtest/gtest.h>

#include "braid/braid.h"
#include "braid/onnx/export.h"
#include "onnx_graphs.h"

using namespace braid;
namespace bx = braid::onnx;
using onnx_test::info;
using onnx_test::model_of;

namespace {

bx::Attribute tensor_value(const Tensor& t) {
  bx::Attribute a;
  a.kind = bx::Attribute::Kind::Tensor;
  a.t = t;
  return a;
}

// x (batch, tokens, 12) -> (batch, tokens, 3, 4): the first two sizes read from x's shape.
bx::Model head_split(bool read_in_subgraph) {
  bx::GraphBuilder g(13);
  const auto constant = [&](std::vector<int64_t> v, Shape s) {
    return g.node("Constant", {}, {{"value", tensor_value(tensor(v, s))}})[0];
  };
  const std::string shape = g.node("Shape", {"x"})[0];
  const std::string batch = g.node("Gather", {shape, constant({0}, {})}, {{"axis", bx::attr_int(0)}})[0];
  const std::string tokens = g.node("Gather", {g.node("Shape", {"x"})[0], constant({1}, {})})[0];
  const std::string target = g.node("Concat",
                                    {g.node("Unsqueeze", {batch, constant({0}, {1})})[0],
                                     g.node("Unsqueeze", {tokens, constant({0}, {1})})[0], constant({3, 4}, {2})},
                                    {{"axis", bx::attr_int(0)}})[0];
  if (!read_in_subgraph) {
    g.graph().nodes.push_back(bx::Node{"split", "Reshape", "", {"x", target}, {"y"}, {}});
  } else {  // the target read by an If's branches only (an implicit input of both)
    auto branch = [&](const char* name) {
      auto body = std::make_shared<bx::Graph>();
      body->name = name;
      body->nodes.push_back(bx::Node{"", "Reshape", "", {"x", target}, {std::string(name) + "_y"}, {}});
      body->outputs.push_back(info(std::string(name) + "_y", kFloat32, {}));
      bx::Attribute a;
      a.kind = bx::Attribute::Kind::Graph;
      a.g = body;
      return a;
    };
    const std::string cond = constant({1}, {});
    const std::string as_bool = g.node("Cast", {cond}, {{"to", bx::attr_int(9)}})[0];
    g.graph().nodes.push_back(bx::Node{
        "choose", "If", "", {as_bool}, {"y"}, {{"then_branch", branch("then")}, {"else_branch", branch("else")}}});
  }
  bx::Model m = model_of("head_split", 13, g.graph());
  m.graph.inputs.push_back(info("x", kFloat32, {-1, -1, 12}));
  m.graph.outputs.push_back(info("y", kFloat32, {-1, -1, 3, 4}));
  return m;
}

TEST(OnnxModule, ShapeComputationsAreBoundWhileTheShapeHolds) {
  Generator gen(23);
  for (const bool in_subgraph : {false, true}) {
    SCOPED_TRACE(in_subgraph ? "read in a subgraph" : "read by a Reshape");
    bx::OnnxModule mod(head_split(in_subgraph));
    mod.set_profiling(true);
    NoGradGuard no_grad;
    for (const Shape& s :
         {Shape{2, 5, 12}, Shape{2, 5, 12}, Shape{2, 5, 12}, Shape{1, 7, 12}, Shape{1, 7, 12}, Shape{2, 5, 12}}) {
      const Tensor x = randn(s, kFloat32, &gen);
      const Tensor y = mod.run({x})[0];
      ASSERT_EQ(y.shape(), (Shape{s[0], s[1], 3, 4}));
      EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());  // a reshape keeps the values in order
    }
    // Six runs over three shapes in turn: the nodes ran for each new shape (3 times), and the group
    // was bound in the other 3 runs.
    EXPECT_EQ(mod.profile().at("shape computations").calls, 3);
    EXPECT_EQ(mod.profile().at("Concat").calls, 3);
    EXPECT_EQ(mod.profile().at("Gather").calls, 6);
  }
}

}  // namespace
