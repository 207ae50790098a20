// Inference latency of imported ONNX models in braid; benchmarks/onnx_bench.py runs it beside
// onnxruntime on the same models, inputs and thread count and prints the ratio table.
//
//   braid-onnx-bench export-resnet18 OUT.onnx     writes an ImageNet-shaped ResNet-18 built from
//                                                 braid's layers (seeded weights, dynamic batch)
//   braid-onnx-bench time MODEL.onnx NxCxHxW ITERS
//                                                 prints "median_ms min_ms" over ITERS runs after
//                                                 two warm-up runs (threads: BRAID_NUM_THREADS)
//   braid-onnx-bench time MODEL.onnx tokens:NxL ITERS
//                                                 the same for a text model whose inputs are int64
//                                                 (N, L): token ids in [1000, 2000) (the same
//                                                 numbers as onnx_bench.py gives onnxruntime), and
//                                                 ones for an input whose name holds "mask", zeros
//                                                 for one whose name holds "type" 
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <sstream>

#include "braid/autograd.h"
#include "braid/nn/layers.h"
#include "braid/onnx/export.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"

using namespace braid;

namespace {

nn::ModulePtr conv_bn(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad, bool relu) {
  auto s = std::make_shared<nn::Sequential>();
  s->add(std::make_shared<nn::Conv2d>(in, out, k, stride, pad, 1, 1, false)).add(std::make_shared<nn::BatchNorm2d>(out));
  if (relu) s->add(std::make_shared<nn::ReLU>());
  return s;
}

nn::ModulePtr basic_block(int64_t in, int64_t out, int64_t stride) {
  auto body = std::make_shared<nn::Sequential>();
  body->add(conv_bn(in, out, 3, stride, 1, true)).add(conv_bn(out, out, 3, 1, 1, false));
  nn::ModulePtr shortcut = (stride != 1 || in != out) ? conv_bn(in, out, 1, stride, 0, false) : nullptr;
  auto block = std::make_shared<nn::Sequential>();
  block->add(std::make_shared<nn::Residual>(body, shortcut)).add(std::make_shared<nn::ReLU>());
  return block;
}

/// torchvision's resnet18 layout: 7x7/2 stem, 3x3/2 max pool, four stages of two basic blocks
/// (64, 128, 256, 512 channels), global average pool, 1000-way linear.
nn::ModulePtr resnet18() {
  auto m = std::make_shared<nn::Sequential>();
  m->add(conv_bn(3, 64, 7, 2, 3, true)).add(std::make_shared<nn::MaxPool2d>(3, 2, 1));
  int64_t in = 64;
  for (int64_t width : {64, 128, 256, 512}) {
    m->add(basic_block(in, width, width == 64 ? 1 : 2)).add(basic_block(width, width, 1));
    in = width;
  }
  m->add(std::make_shared<nn::AdaptiveAvgPool2d>(1)).add(std::make_shared<nn::Flatten>()).add(std::make_shared<nn::Linear>(512, 1000));
  return m;
}

Shape parse_shape(const std::string& s) {
  Shape out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, 'x')) out.push_back(std::stoll(part));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "export-resnet18" && argc == 3) {
      manual_seed(0);
      auto m = resnet18();
      // Move BatchNorm statistics off their initial values so the exported graph is realistic.
      m->train();
      {
        NoGradGuard no_grad;
        m->forward(randn({4, 3, 64, 64}));
      }
      m->eval();
      onnx::export_onnx(*m, randn({1, 3, 224, 224}), argv[2]);
      std::printf("wrote %s (%lld parameters)\n", argv[2], static_cast<long long>(m->num_parameters()));
      return 0;
    }
    if (cmd == "time" && argc == 5) {
      auto m = onnx::OnnxModule::load(argv[2], {.frozen = true});
      const std::string spec = argv[3];
      const bool tokens = spec.rfind("tokens:", 0) == 0;
      const Shape shape = parse_shape(tokens ? spec.substr(7) : spec);
      const int iters = std::stoi(argv[4]);
      NoGradGuard no_grad;
      std::vector<Tensor> x;
      if (!tokens) x.push_back(rand(shape));
      for (const std::string& name : tokens ? m->input_names() : std::vector<std::string>{}) {
        if (name.find("mask") != std::string::npos) x.push_back(ones(shape, kInt64));
        else if (name.find("type") != std::string::npos) x.push_back(zeros(shape, kInt64));
        else {
          std::vector<int64_t> ids(static_cast<size_t>(shape[0] * shape[1]));
          for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + static_cast<int64_t>(i % 1000);
          x.push_back(tensor(ids, shape));
        }
      }
      std::vector<double> ms;
      for (int i = 0; i < iters + 2; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<Tensor> out = m->run(x);
        auto t1 = std::chrono::steady_clock::now();
        if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%.3f %.3f\n", ms[ms.size() / 2], ms.front());
      if (std::getenv("BRAID_ONNX_PROFILE") != nullptr) {
        // Per run, averaged over up to 20 profiled runs (one run's times are too noisy to read).
        const int runs = std::max(1, std::min(iters, 20));
        m->set_profiling(true);
        for (int i = 0; i < runs; ++i) m->run(x);
        std::vector<std::pair<double, std::string>> rows;
        for (const auto& [op, t] : m->profile()) rows.emplace_back(t.ms / runs, op);
        std::sort(rows.rbegin(), rows.rend());
        for (const auto& [t, op] : rows)
          std::fprintf(stderr, "%-24s %9.3f ms %6lld calls\n", op.c_str(), t,
                       static_cast<long long>(m->profile().at(op).calls / runs));
      }
      return 0;
    }
    std::fprintf(stderr,
                 "usage: braid-onnx-bench export-resnet18 OUT.onnx | time MODEL.onnx NxCxHxW|tokens:NxL ITERS\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-onnx-bench: %s\n", e.what());
    return 1;
  }
}
