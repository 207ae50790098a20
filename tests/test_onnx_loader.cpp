// The ONNX loader against valid, broken and hostile files (Note [Loading untrusted models]): each
// broken file is a valid model with one thing changed, and each must give a braid::Error naming
// the problem and where it is, never a crash, a hang or an unbounded allocation. Files are built
// with the ONNX project's own protobuf classes.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "braid/braid.h"
#include "braid/onnx/model.h"
#include "braid/onnx/module.h"

namespace braid {
namespace {

namespace fs = std::filesystem;
using ::onnx::ModelProto;
using ::onnx::TensorProto;

/// y = x + w, x of shape [N, 3] (N symbolic), w an initializer of shape [3].
ModelProto add_model() {
  ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("braid-test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("add");
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(TensorProto::FLOAT);
  w->add_dims(3);
  for (float v : {1.5f, -2.0f, 4.0f}) w->add_float_data(v);
  auto* x = g->add_input();
  x->set_name("x");
  auto* tt = x->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  auto* n = g->add_node();
  n->set_name("plus");
  n->set_op_type("Add");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(TensorProto::FLOAT);
  return m;
}

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "braid_onnx_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string save(const ModelProto& m, const std::string& name) {
  return write(temp_dir(name) + "/model.onnx", m.SerializeAsString());
}

/// load_model(path) must throw a braid::Error whose message holds every part.
void expect_load_error(const std::string& path, std::initializer_list<std::string> parts) {
  try {
    onnx::load_model(path);
    ADD_FAILURE() << path << ": expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "missing '" << p << "' in: " << what;
  }
}

TEST(OnnxLoader, ValidModelKeepsNamesShapesAndValues) {
  const onnx::Model m = onnx::load_model(save(add_model(), "valid"));
  EXPECT_EQ(m.ir_version, 8);
  EXPECT_EQ(m.opsets.at(""), 13);
  ASSERT_EQ(m.graph.nodes.size(), 1u);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Add");
  EXPECT_EQ(m.graph.nodes[0].inputs, (std::vector<std::string>{"x", "w"}));
  EXPECT_EQ(m.graph.initializers.at("w").to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 4.0f}));
  ASSERT_EQ(m.graph.inputs.size(), 1u);
  EXPECT_EQ(m.graph.inputs[0].shape[0].symbol, "N");
  EXPECT_EQ(m.graph.inputs[0].shape[1].size, 3);
  EXPECT_EQ(m.graph.outputs[0].name, "y");
}

TEST(OnnxLoader, NodesAreSortedTopologically) {
  ModelProto m = add_model();
  auto* g = m.mutable_graph();
  // z = Relu(y) listed before the Add that makes y.
  auto* r = g->add_node();
  r->set_op_type("Relu");
  r->set_name("relu");
  r->add_input("y");
  r->add_output("z");
  g->mutable_node()->SwapElements(0, 1);
  g->mutable_output(0)->set_name("z");
  const onnx::Model loaded = onnx::load_model(save(m, "sorted"));
  ASSERT_EQ(loaded.graph.nodes.size(), 2u);
  EXPECT_EQ(loaded.graph.nodes[0].op_type, "Add");
  EXPECT_EQ(loaded.graph.nodes[1].op_type, "Relu");
}

TEST(OnnxLoader, TruncatedAndRandomFilesAreErrors) {
  const std::string bytes = add_model().SerializeAsString();
  const std::string dir = temp_dir("truncated");
  for (size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{3}})
    expect_load_error(write(dir + "/cut" + std::to_string(cut) + ".onnx", bytes.substr(0, cut)), {});
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string junk(64 + static_cast<size_t>(i) * 37, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    const std::string path = write(dir + "/junk" + std::to_string(i) + ".onnx", junk);
    EXPECT_THROW(onnx::load_model(path), Error) << path;
  }
  expect_load_error(dir + "/absent.onnx", {"no such file"});
}

TEST(OnnxLoader, GraphErrorsNameTheNode) {
  {  // a cycle: a = Relu(b), b = Relu(a)
    ModelProto m = add_model();
    auto* g = m.mutable_graph();
    for (auto [in, out] : {std::pair{"b", "a"}, std::pair{"a", "b"}}) {
      auto* n = g->add_node();
      n->set_op_type("Relu");
      n->set_name(std::string("make_") + out);
      n->add_input(in);
      n->add_output(out);
    }
    expect_load_error(save(m, "cycle"), {"cycle", "Relu 'make_a'", "Relu 'make_b'"});
  }
  {  // an input that nothing produces
    ModelProto m = add_model();
    m.mutable_graph()->mutable_node(0)->set_input(1, "ghost");
    expect_load_error(save(m, "ghost"), {"Add 'plus'", "'ghost'", "no node, graph input or initializer"});
  }
  {  // a value assigned twice
    ModelProto m = add_model();
    *m.mutable_graph()->add_node() = m.graph().node(0);
    m.mutable_graph()->mutable_node(1)->set_name("again");
    expect_load_error(save(m, "twice"), {"'y'", "already defined"});
  }
  {  // an output nothing makes
    ModelProto m = add_model();
    m.mutable_graph()->mutable_output(0)->set_name("nowhere");
    expect_load_error(save(m, "output"), {"graph output 'nowhere'", "produced by no node"});
  }
}

TEST(OnnxLoader, TensorErrorsNameTheTensor) {
  {
    ModelProto m = add_model();
    m.mutable_graph()->mutable_initializer(0)->set_dims(0, -3);
    expect_load_error(save(m, "negative"), {"initializer 'w'", "negative dimension -3"});
  }
  {  // 2^40 x 2^40 elements overflow 64 bits
    ModelProto m = add_model();
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->set_dims(0, int64_t{1} << 40);
    w->add_dims(int64_t{1} << 40);
    expect_load_error(save(m, "overflow"), {"initializer 'w'", "overflows"});
  }
  {  // 2^40 floats: no overflow, but far more than any limit, refused before allocating
    ModelProto m = add_model();
    m.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
    expect_load_error(save(m, "huge"), {"initializer 'w'", "more than the limit"});
  }
  {  // raw data shorter than the shape needs
    ModelProto m = add_model();
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->clear_float_data();
    w->set_raw_data(std::string(8, '\0'));
    expect_load_error(save(m, "short_raw"), {"initializer 'w'", "needs 12 bytes of raw data, the file has 8"});
  }
  {  // typed values fewer than the shape needs
    ModelProto m = add_model();
    m.mutable_graph()->mutable_initializer(0)->set_dims(0, 5);
    expect_load_error(save(m, "short_typed"), {"initializer 'w'", "needs 5 values", "has 3"});
  }
  {
    ModelProto m = add_model();
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->clear_float_data();
    w->set_data_type(TensorProto::STRING);
    w->add_string_data("a");
    expect_load_error(save(m, "string"), {"initializer 'w'", "STRING", "does not support"});
  }
}

/// The initializer w stored in an external file at location.
ModelProto external_model(const std::string& location, int64_t offset = 0) {
  ModelProto m = add_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_data_location(TensorProto::EXTERNAL);
  auto* kv = w->add_external_data();
  kv->set_key("location");
  kv->set_value(location);
  auto* off = w->add_external_data();
  off->set_key("offset");
  off->set_value(std::to_string(offset));
  return m;
}

TEST(OnnxLoader, ExternalDataStaysInsideTheModelsFolder) {
  const std::string dir = temp_dir("external");
  const float w[3] = {1.5f, -2.0f, 4.0f};
  write(dir + "/weights.bin", std::string(reinterpret_cast<const char*>(w), sizeof w));
  const std::string ok = write(dir + "/ok.onnx", external_model("weights.bin").SerializeAsString());
  EXPECT_EQ(onnx::load_model(ok).graph.initializers.at("w").to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 4.0f}));
  expect_load_error(write(dir + "/up.onnx", external_model("../../../etc/passwd").SerializeAsString()),
                    {"initializer 'w'", "leaves the model's folder"});
  expect_load_error(write(dir + "/abs.onnx", external_model("/etc/passwd").SerializeAsString()),
                    {"initializer 'w'", "absolute"});
  fs::create_symlink("/etc", dir + "/link");
  expect_load_error(write(dir + "/link.onnx", external_model("link/passwd").SerializeAsString()),
                    {"initializer 'w'", "outside the model's folder"});
  expect_load_error(write(dir + "/past_end.onnx", external_model("weights.bin", 8).SerializeAsString()),
                    {"initializer 'w'", "does not fit", "the shape needs 12 bytes and the file has 12"});
  expect_load_error(write(dir + "/missing.onnx", external_model("nothing.bin").SerializeAsString()),
                    {"initializer 'w'", "'nothing.bin' does not exist"});
}

TEST(OnnxLoader, VersionsAreChecked) {
  {
    ModelProto m = add_model();
    m.mutable_opset_import(0)->set_version(9999);
    expect_load_error(save(m, "opset"), {"opset 9999", "1 to"});
  }
  {
    ModelProto m = add_model();
    m.clear_opset_import();
    expect_load_error(save(m, "no_opset"), {"Add 'plus'", "domain 'ai.onnx'", "does not import"});
  }
  {
    ModelProto m = add_model();
    m.set_ir_version(99);
    expect_load_error(save(m, "ir"), {"IR version 99", "3 to 14"});
  }
  {
    // A domain imported twice at one version (as model-merging scripts write it; onnxruntime runs
    // such files) loads; at two versions it is refused, naming both.
    ModelProto m = add_model();
    const int64_t v = m.opset_import(0).version();
    auto* again = m.add_opset_import();
    again->set_domain("ai.onnx");
    again->set_version(v);
    EXPECT_EQ(onnx::load_model(save(m, "opset_twice")).opsets.at(""), v);
    again->set_version(v - 1);
    expect_load_error(save(m, "opset_conflict"),
                      {"opset domain 'ai.onnx' is imported twice, at versions " + std::to_string(v) + " and " +
                       std::to_string(v - 1)});
  }
  {
    // ONNX 1.23 (PyPI) writes IR 14; its files load.
    ModelProto m = add_model();
    m.set_ir_version(14);
    EXPECT_EQ(onnx::load_model(save(m, "ir14")).ir_version, 14);
  }
}

// What real exporters write (issue: ONNX as real exporters write it).

/// y = If(cond, then: x + w, else: x - w), the branches' outputs left with an empty TypeProto, as
/// some exporters write them; x and w come from the outer graph.
ModelProto if_model_with_untyped_branch_outputs() {
  ModelProto m = add_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  auto* cond = g->add_input();
  cond->set_name("cond");
  cond->mutable_type()->mutable_tensor_type()->set_elem_type(TensorProto::BOOL);
  auto* n = g->add_node();
  n->set_name("choose");
  n->set_op_type("If");
  n->add_input("cond");
  n->add_output("y");
  for (const auto& [attr, op] : {std::pair<std::string, std::string>{"then_branch", "Add"}, {"else_branch", "Sub"}}) {
    auto* a = n->add_attribute();
    a->set_name(attr);
    a->set_type(::onnx::AttributeProto::GRAPH);
    auto* b = a->mutable_g();
    b->set_name(attr);
    auto* bn = b->add_node();
    bn->set_op_type(op);
    bn->add_input("x");
    bn->add_input("w");
    bn->add_output(attr + "_out");
    auto* out = b->add_output();
    out->set_name(attr + "_out");
    out->mutable_type();  // present, but neither a tensor type nor anything else
  }
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(TensorProto::FLOAT);
  return m;
}

TEST(OnnxLoader, SubgraphOutputsWithoutATypeAreInferredAtRunTime) {
  const std::string path = save(if_model_with_untyped_branch_outputs(), "untyped_if");
  auto module = onnx::OnnxModule::load(path);
  const Tensor x = tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  for (bool c : {true, false}) {
    Tensor y = module->run_named({{"x", x}, {"cond", scalar_tensor(c ? 1.0 : 0.0).to(kBool)}}).at("y");
    const std::vector<float> w{1.5f, -2.0f, 4.0f};
    std::vector<float> expect;
    for (int i = 0; i < 6; ++i) expect.push_back(static_cast<float>(i + 1) + (c ? 1 : -1) * w[i % 3]);
    EXPECT_EQ(y.to_vector<float>(), expect) << (c ? "then" : "else");
  }
}

TEST(OnnxLoader, AConvWhoseKernelShapeDisagreesWithItsWeightIsRefused) {
  ModelProto m = add_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_initializer();
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(TensorProto::FLOAT);
  for (int64_t d : {2, 3, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 54; ++i) w->add_float_data(0.1f);
  auto* x = g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  x->clear_dim();
  for (int64_t d : {1, 3, 5, 5}) x->add_dim()->set_dim_value(d);
  auto* n = g->add_node();
  n->set_name("conv1");
  n->set_op_type("Conv");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  auto* k = n->add_attribute();
  k->set_name("kernel_shape");
  k->set_type(::onnx::AttributeProto::INTS);
  k->add_ints(2);
  k->add_ints(2);
  auto module = onnx::OnnxModule::load(save(m, "conv_kernel_shape"));
  try {
    module->forward(ones({1, 3, 5, 5}));
    ADD_FAILURE() << "a Conv with kernel_shape [2, 2] and a 3x3 weight ran";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"Conv 'conv1'", "kernel_shape [2, 2]", "[3, 3]", "[2, 3, 3, 3]"})
      EXPECT_NE(what.find(part), std::string::npos) << "missing '" << part << "' in: " << what;
  }
  // Without the attribute, or with the right one, the same node runs.
  n->mutable_attribute(0)->set_ints(0, 3);
  n->mutable_attribute(0)->set_ints(1, 3);
  Tensor y = onnx::OnnxModule::load(save(m, "conv_kernel_shape_ok"))->forward(ones({1, 3, 5, 5}));
  EXPECT_EQ(y.shape(), (Shape{1, 2, 3, 3}));
  EXPECT_NEAR(y.to_vector<float>()[0], 2.7f, 1e-5);  // 27 products of 1 and 0.1
}

/// Length-delimited protobuf field `field` holding payload.
std::string wrap(int field, const std::string& payload) {
  std::string out(1, static_cast<char>(field << 3 | 2));
  for (uint64_t n = payload.size(); ; n >>= 7) {
    if (n < 0x80) {
      out += static_cast<char>(n);
      break;
    }
    out += static_cast<char>((n & 0x7f) | 0x80);
  }
  return out + payload;
}

TEST(OnnxLoader, NestingBombsAreRefused) {
  // ModelProto.graph(7) -> GraphProto.node(1) -> NodeProto.attribute(5) -> AttributeProto.g(6) ->
  // GraphProto.node(1) -> ... 3000 levels deep, a few kilobytes.
  std::string graph;
  for (int level = 0; level < 1000; ++level) graph = wrap(1, wrap(5, wrap(6, graph)));
  const std::string bomb = wrap(7, graph);
  expect_load_error(write(temp_dir("bomb") + "/bomb.onnx", bomb), {"nested deeper than 100 levels"});
  // Subgraphs nested within protobuf's limit but beyond braid's: If nodes inside If bodies.
  ModelProto m = add_model();
  ::onnx::GraphProto body;
  body.set_name("level");
  for (int level = 0; level < 12; ++level) {
    ::onnx::GraphProto outer;
    outer.set_name("level");
    auto* n = outer.add_node();
    n->set_op_type("If");
    n->add_input("x");
    n->add_output("o" + std::to_string(level));
    auto* a = n->add_attribute();
    a->set_name("then_branch");
    a->set_type(::onnx::AttributeProto::GRAPH);
    *a->mutable_g() = body;
    body = outer;
  }
  auto* n = m.mutable_graph()->add_node();
  *n = body.node(0);
  expect_load_error(save(m, "deep_if"), {"nested", "levels deep in subgraphs", "limit of 8"});
}

TEST(OnnxLoader, TestSuiteTensorsLoad) {
  // The ONNX test suite's own files: Abs's output is |input|.
  const std::string dir = "/usr/share/libonnx-testdata/data/node/test_abs/test_data_set_0";
  if (!fs::exists(dir)) GTEST_SKIP() << "libonnx-testdata is not installed (" << dir << ")";
  const Tensor x = onnx::load_tensor(dir + "/input_0.pb"), y = onnx::load_tensor(dir + "/output_0.pb");
  ASSERT_EQ(x.shape(), y.shape());
  ASSERT_GT(x.numel(), 0);
  EXPECT_EQ(amax(abs(abs(x) - y)).item(), 0.0);
  const onnx::Model m = onnx::load_model("/usr/share/libonnx-testdata/data/node/test_abs/model.onnx");
  ASSERT_EQ(m.graph.nodes.size(), 1u);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Abs");
}

}  // namespace
}  // namespace braid
