// Small ONNX models written in tests (tests/test_onnx_module.cpp, tests/test_onnx_chains.cpp): the
// model around a graph, a value's declared type and shape, and a module's outputs as written and in
// inference.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "braid/autograd.h"
#include "braid/onnx/module.h"

namespace onnx_test {

namespace bx = braid::onnx;
using braid::DType;
using braid::Tensor;

/// A model of IR 8 importing the default domain at opset, around graph (empty when not given).
inline bx::Model model_of(const std::string& path, int64_t opset, bx::Graph graph = bx::Graph()) {
  bx::Model m;
  m.path = path;
  m.ir_version = 8;
  m.opsets[""] = opset;
  m.graph = std::move(graph);
  return m;
}

inline bx::ValueInfo info(const std::string& name, DType t, std::vector<int64_t> dims, bool dynamic_batch = true) {
  bx::ValueInfo v;
  v.name = name;
  v.dtype = t;
  v.has_shape = true;
  for (size_t i = 0; i < dims.size(); ++i) {
    bx::Dim d;
    if (i == 0 && dynamic_batch)
      d.symbol = "N";
    else
      d.size = dims[i];
    v.shape.push_back(d);
  }
  return v;
}

/// The module's output with gradients recording (the graph as written) and in inference (folded
/// and fused), on the same input.
inline std::pair<Tensor, Tensor> as_written_and_in_inference(bx::OnnxModule& mod, const Tensor& x) {
  const Tensor as_written = mod.forward(x).detach();
  braid::NoGradGuard no_grad;
  return {as_written, mod.forward(x)};
}

}  // namespace onnx_test
