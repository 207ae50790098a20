// ONNX export: models built from braid's layers are written with export_onnx and then
//  1. pass the ONNX project's checker (Debian's libonnx, the C++ bx::checker),
//  2. run in onnxruntime (tests/onnx_ort_run.py) on a batch size other than the export example's,
//     giving braid's outputs to 1e-5 relative (max |ort - braid| <= 1e-5 max |braid|),
//  3. import back (OnnxModule) with bitwise the same weights under the same state_dict names, and
//     the same outputs.
// An imported model that was fine-tuned exports its own graph with the new weights (same checks), and
// a module with a hand-written forward exports by tracing it (same checks).
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "braid/autograd.h"
#include "braid/nn/attention.h"
#include "braid/nn/layers.h"
#include "braid/nn/recurrent.h"
#include "braid/nn/skip.h"
#include "braid/onnx/export.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "braid/optim/optimizers.h"
#include "models.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using namespace braid;
using nn::Sequential;
namespace bx = braid::onnx;  // ::onnx is the ONNX project's protobuf namespace

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("braid_onnx_export_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void check_with_onnx_checker(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ::onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes)) << path;
  EXPECT_NO_THROW(::onnx::checker::check_model(proto)) << path;
  try {
    ::onnx::checker::check_model(proto);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "ONNX checker: " << e.what();
  }
}

/// onnxruntime's outputs for inputs, or nothing (with a reason in *skip) when it is unavailable.
std::vector<Tensor> run_onnxruntime(const std::string& model, const std::vector<Tensor>& inputs, std::string* skip) {
  fs::path dir = fs::path(model).parent_path();
  std::string cmd = "python3 '" + std::string(braid::test::source_dir()) + "/onnx_ort_run.py' '" + model + "' '" +
                    (dir / "ort_out_").string() + "'";
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string p = (dir / ("ort_in_" + std::to_string(i) + ".pb")).string();
    bx::save_tensor(inputs[i], p);
    cmd += " '" + p + "'";
  }
  cmd += " 2>" + (dir / "ort_err.txt").string();
  const int rc = std::system(cmd.c_str());
  std::ifstream err(dir / "ort_err.txt");
  std::string err_text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    *skip = err_text;
    return {};
  }
  EXPECT_EQ(rc, 0) << "onnxruntime failed on " << model << ":\n" << err_text;
  std::vector<Tensor> out;
  for (size_t i = 0; fs::exists(dir / ("ort_out_" + std::to_string(i) + ".pb")); ++i) {
    out.push_back(bx::load_tensor((dir / ("ort_out_" + std::to_string(i) + ".pb")).string()));
    fs::remove(dir / ("ort_out_" + std::to_string(i) + ".pb"));
  }
  return out;
}

double max_rel_diff(const Tensor& got, const Tensor& want) {
  std::vector<double> g = cast(got, kFloat64).to_vector<double>(), w = cast(want, kFloat64).to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff = std::max(diff, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

/// Export, check, compare with onnxruntime on `probe`, import back and compare weights and outputs.
void round_trip(nn::Module& model, const Tensor& example, const Tensor& probe, const std::string& name) {
  SCOPED_TRACE(name);
  model.eval();
  const std::string path = (temp_dir() / (name + ".onnx")).string();
  bx::export_onnx(model, example, path);
  check_with_onnx_checker(path);
  Tensor want;
  {
    NoGradGuard no_grad;
    want = model.forward(probe);
  }
  // Import: the same weights, bit for bit, under the same names; the same outputs.
  auto imported = bx::OnnxModule::load(path, {.frozen = true});
  nn::StateDict a = model.state_dict(), b = imported->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) {
    ASSERT_TRUE(b.count(k)) << "imported model lacks '" << k << "'";
    EXPECT_TRUE(equal(v, b.at(k))) << k << " differs after the round trip";
  }
  {
    NoGradGuard no_grad;
    Tensor again = imported->forward(probe);
    EXPECT_LE(max_rel_diff(again, want), 1e-6) << "braid import of the export differs";
  }
  std::string skip;
  std::vector<Tensor> ort = run_onnxruntime(path, {probe}, &skip);
  if (!skip.empty()) GTEST_SKIP() << "onnxruntime comparison skipped: " << skip;
  ASSERT_EQ(ort.size(), 1u);
  ASSERT_EQ(ort[0].shape(), want.shape());
  EXPECT_LE(max_rel_diff(ort[0], want), 1e-5) << "onnxruntime differs from braid";
}

/// A few SGD steps in training mode so that BatchNorm's running statistics and the weights move
/// away from their initial values.
void train_a_little(nn::Module& model, const Tensor& x) {
  model.train();
  optim::SGD opt(model.parameters(), {.lr = 0.05});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    Tensor loss = mean(square(model.forward(x)));
    loss.backward();
    opt.step();
  }
  model.eval();
}

TEST(OnnxExport, Mlp) {
  manual_seed(1);
  Sequential m;
  m.add(std::make_shared<nn::Linear>(20, 32)).add(std::make_shared<nn::BatchNorm1d>(32)).add(std::make_shared<nn::ReLU>());
  m.add(std::make_shared<nn::Dropout>(0.3)).add(std::make_shared<nn::Linear>(32, 16)).add(std::make_shared<nn::GELU>());
  m.add(std::make_shared<nn::Linear>(16, 10, false)).add(std::make_shared<nn::Softmax>(1));
  train_a_little(m, randn({8, 20}));
  round_trip(m, randn({2, 20}), randn({5, 20}), "mlp");
}

TEST(OnnxExport, Cnn) {
  manual_seed(2);
  Sequential m;
  m.add(std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1)).add(std::make_shared<nn::BatchNorm2d>(8)).add(std::make_shared<nn::ReLU>());
  m.add(std::make_shared<nn::MaxPool2d>(2));
  m.add(std::make_shared<nn::Conv2d>(8, 16, 3, 1, "same", 1, 2)).add(std::make_shared<nn::GELU>("tanh"));
  m.add(std::make_shared<nn::AvgPool2d>(3, 2, 1, true, false)).add(std::make_shared<nn::GroupNorm>(4, 16));
  m.add(std::make_shared<nn::SiLU>()).add(std::make_shared<nn::Conv2d>(16, 16, 3, 2, 1, 2));
  m.add(std::make_shared<nn::LeakyReLU>(0.1)).add(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  m.add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(16, 5)).add(std::make_shared<nn::Tanh>());
  m.add(std::make_shared<nn::ReLU6>());
  train_a_little(m, randn({4, 3, 16, 16}));
  round_trip(m, randn({2, 3, 16, 16}), randn({3, 3, 16, 16}), "cnn");
}

TEST(OnnxExport, ResidualSkipsAndTransposedConv) {
  manual_seed(3);
  auto body = std::make_shared<Sequential>();
  body->add(std::make_shared<nn::Conv2d>(4, 4, 3, 1, 1)).add(std::make_shared<nn::ReLU>());
  Sequential m;
  m.add(std::make_shared<nn::SkipStash>("a")).add(std::make_shared<nn::Residual>(body));
  m.add(std::make_shared<nn::Conv2d>(4, 4, 1)).add(std::make_shared<nn::SkipAdd>("a"));
  m.add(std::make_shared<nn::SkipStash>("b")).add(std::make_shared<nn::Sigmoid>());
  m.add(std::make_shared<nn::SkipConcat>("b", 1));
  m.add(std::make_shared<nn::ConvTranspose2d>(8, 3, 3, 2, 1, 1)).add(std::make_shared<nn::Flatten>(2));
  m.add(std::make_shared<nn::LayerNorm>(std::vector<int64_t>{256})).add(std::make_shared<nn::Identity>());
  train_a_little(m, randn({2, 4, 8, 8}));
  round_trip(m, randn({2, 4, 8, 8}), randn({1, 4, 8, 8}), "residual");
}

TEST(OnnxExport, EmbeddingAndConv1d) {
  manual_seed(4);
  Sequential m;
  m.add(std::make_shared<nn::Embedding>(30, 6)).add(std::make_shared<nn::Flatten>(1, -1));
  m.add(std::make_shared<nn::Linear>(6 * 7, 12)).add(std::make_shared<nn::Flatten>(0, -1));
  m.eval();
  Tensor idx = randint(0, 30, {2, 7});
  // The batch axis is flattened away here, so the export is for a fixed batch.
  const std::string path = (temp_dir() / "embedding.onnx").string();
  bx::export_onnx(m, idx, path, {.dynamic_batch = false});
  check_with_onnx_checker(path);
  auto imported = bx::OnnxModule::load(path);
  NoGradGuard no_grad;
  Tensor want = m.forward(idx);
  EXPECT_TRUE(equal(imported->forward(idx), want));
  std::string skip;
  auto ort = run_onnxruntime(path, {idx}, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_EQ(ort.size(), 1u);
  EXPECT_LE(max_rel_diff(ort[0], want), 1e-5);

  Sequential c;
  c.add(std::make_shared<nn::Conv1d>(3, 5, 4, 1, "same")).add(std::make_shared<nn::ReLU>());
  c.add(std::make_shared<nn::Conv1d>(5, 2, 3, 2, 1, 2));
  round_trip(c, randn({2, 3, 16}), randn({4, 3, 16}), "conv1d");
}

TEST(OnnxExport, TransformerEncoder) {
  manual_seed(6);
  for (bool batch_first : {true, false}) {
    Sequential m;
    m.add(std::make_shared<nn::Linear>(8, 16));
    m.add(std::make_shared<nn::TransformerEncoderLayer>(16, 4, 32, 0.1, "gelu", 1e-5, batch_first, false));
    m.add(std::make_shared<nn::TransformerEncoderLayer>(16, 2, 24, 0.1, "relu", 1e-5, batch_first, true));
    m.add(std::make_shared<nn::MultiheadAttention>(16, 8, 0.0, true, batch_first));
    m.add(std::make_shared<nn::Linear>(16, 3));
    train_a_little(m, batch_first ? randn({2, 5, 8}) : randn({5, 2, 8}));
    // The batch axis is symbolic only for batch_first; sequence-first exports use a fixed shape.
    if (batch_first) {
      round_trip(m, randn({2, 5, 8}), randn({3, 5, 8}), "transformer_bf");
    } else {
      m.eval();
      const std::string path = (temp_dir() / "transformer_sf.onnx").string();
      bx::export_onnx(m, randn({5, 2, 8}), path, {.dynamic_batch = false});
      check_with_onnx_checker(path);
      Tensor x = randn({5, 2, 8});
      NoGradGuard no_grad;
      Tensor want = m.forward(x);
      EXPECT_LE(max_rel_diff(bx::OnnxModule::load(path)->forward(x), want), 1e-6);
      std::string skip;
      auto ort = run_onnxruntime(path, {x}, &skip);
      if (!skip.empty()) GTEST_SKIP() << skip;
      EXPECT_LE(max_rel_diff(ort[0], want), 1e-5);
    }
  }
}

TEST(OnnxExport, LstmAndGru) {
  manual_seed(8);
  Sequential m;
  m.add(std::make_shared<nn::LSTM>(6, 10, 2, true, true, 0.0, true));
  m.add(std::make_shared<nn::GRU>(20, 7, 2, true, true, 0.0, true));
  m.add(std::make_shared<nn::GRU>(14, 5, 1, false, true));
  m.add(std::make_shared<nn::LSTM>(5, 4, 1, true, true));
  m.eval();
  round_trip(m, randn({2, 9, 6}), randn({3, 9, 6}), "rnn");
}

TEST(OnnxExport, ModelZoo) {
  // The models braid-train trains, as trained (BatchNorm statistics moved), to ONNX and back.
  for (const std::string& name : zoo::model_names()) {
    manual_seed(9);
    const int64_t c = name == "resnet" ? 3 : 1, hw = name == "resnet" ? 32 : 28;
    auto m = zoo::make_model(name, c, 10);
    train_a_little(*m, randn({4, c, hw, hw}));
    round_trip(*m, randn({2, c, hw, hw}), randn({3, c, hw, hw}), "zoo_" + name);
  }
}

TEST(OnnxExport, ResNet50) {
  // torchvision.models.resnet50() has 25,557,032 parameters; the same count pins down every width,
  // kernel, bias and the expansion factor. Running it in onnxruntime checks the wiring (strides,
  // shortcuts, pooling) at a small image size.
  manual_seed(4);
  auto m = zoo::resnet50(1000);
  EXPECT_EQ(m->num_parameters(), 25557032);
  m->eval();
  round_trip(*m, randn({1, 3, 64, 64}), randn({2, 3, 64, 64}), "resnet50");
}

TEST(OnnxExport, FineTunedImportExportsNewWeights) {
  // Export a model, import it, train the import (it is an ordinary module), export the import and
  // check the new file against onnxruntime and against the fine-tuned weights.
  manual_seed(5);
  Sequential m;
  m.add(std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1)).add(std::make_shared<nn::BatchNorm2d>(4)).add(std::make_shared<nn::ReLU>());
  m.add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(4 * 6 * 6, 3));
  m.eval();
  const std::string path = (temp_dir() / "base.onnx").string();
  bx::export_onnx(m, randn({2, 1, 6, 6}), path);
  auto imported = bx::OnnxModule::load(path);
  Tensor before = imported->state_dict().at("4.weight").clone();
  imported->train();
  optim::SGD opt(imported->parameters(), {.lr = 0.1});
  Tensor x = randn({8, 1, 6, 6});
  Tensor target = tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8});
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    opt.zero_grad();
    Tensor logits = imported->forward(x);
    Tensor loss = -mean(sum(log_softmax(logits, 1) * one_hot(target, 3, kFloat32), {1}));
    if (i == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, first) << "fine-tuning the imported model did not lower the loss";
  EXPECT_FALSE(equal(before, imported->state_dict().at("4.weight")));
  imported->eval();
  round_trip(*imported, x, randn({3, 1, 6, 6}), "finetuned");
}

// A hand-written forward (no layer exporter) is exported by tracing (Note [Export by tracing]):
// elementwise ops with constants, a residual, reductions, views, concat, pad, a convolution and
// pooling, with weights registered by the module itself.
class HandWritten : public nn::Module {
 public:
  HandWritten() : Module("HandWritten") {
    conv_ = register_module("conv", std::make_shared<nn::Conv2d>(2, 4, 3, 1, 1));
    w_ = register_parameter("w", randn({4 * 3 * 3 + 3, 5}) * 0.1);
    gate_ = register_parameter("gate", randn({5}));
  }
  Tensor forward(const Tensor& x) override {  // x (N, 2, 6, 6)
    Tensor h = relu(conv_->forward(x));                                   // (N, 4, 6, 6)
    h = max_pool2d(h, {2, 2});                                            // (N, 4, 3, 3)
    Tensor stats = concat({amax(h, {1, 2, 3}, true), mean(h, {1, 2, 3}, true), sqrt(var(h, {1, 2, 3}, 0, true) + 1e-5)},
                          1)
                       .reshape({x.size(0), 3});
    Tensor flat = concat({h.flatten(1), stats}, 1);                       // (N, 39)
    Tensor y = matmul(flat, w_) * sigmoid(gate_) + 0.5;                   // (N, 5)
    Tensor t = y.permute({1, 0}).slice(0, 1, 5, 2).permute({1, 0});       // (N, 2)
    y = y + pad(t, {0, 3}) - where(gt(y, scalar_like(y, 1.0)), y * 0.1, scalar_like(y, 0.0));
    return log_softmax(tanh(y) * 2.0, 1);
  }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  Tensor w_, gate_;
};

TEST(OnnxExport, HandWrittenForwardExportsByTracing) {
  manual_seed(21);
  HandWritten m;
  round_trip(m, randn({2, 2, 6, 6}), randn({5, 2, 6, 6}), "handwritten");
}

TEST(OnnxExport, TracedIndexOps) {
  // Gather, index_select (an embedding lookup of the int64 input itself) and scatter_add.
  class Lookup : public nn::Module {
   public:
    Lookup() : Module("Lookup") { table_ = register_parameter("table", randn({7, 4})); }
    Tensor forward(const Tensor& ids) override {  // ids (N, 3) int64
      Tensor e = index_select(table_, 0, ids.reshape({-1})).reshape({-1, 3, 4});
      Tensor idx = minimum(ids, scalar_like(ids, 3)).unsqueeze(2);  // (N, 3, 1) in [0, 3]
      Tensor picked = gather(e, 2, idx);
      return scatter_add(e, 2, 3.0 - idx, picked);
    }

   private:
    Tensor table_;
  };
  manual_seed(22);
  Lookup m;
  round_trip(m, randint(0, 7, {2, 3}), randint(0, 7, {4, 3}), "lookup");
}

TEST(OnnxExport, TracingRefusesWhatItCannotReproduce) {
  // A value read on the host (item) becomes a constant of the trace: the check on a second input
  // sees the difference and the export is refused, naming the module; no file is left behind.
  class HostValue : public nn::Module {
   public:
    HostValue() : Module("HostValue") {}
    Tensor forward(const Tensor& x) override { return x * amax(x).item(); }
  };
  HostValue host;
  try {
    bx::export_onnx(host, randn({2, 3}), (temp_dir() / "bad.onnx").string());
    FAIL() << "expected NotImplementedError";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("traced from HostValue does not reproduce its forward"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(temp_dir() / "bad.onnx"));
}

}  // namespace
