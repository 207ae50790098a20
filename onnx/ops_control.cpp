// ONNX control flow (If, Loop, Scan): the bodies run as subgraphs of the executor
// (OpContext::run_subgraph), with the outer scope's values visible.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ops_util.h"

namespace braid::onnx::ops {

namespace {

OpSchema control(const char* type, std::vector<std::string> attrs, std::function<Tensors(OpContext&)> fn, int64_t since) {
  OpSchema s = op(type, std::move(attrs), std::move(fn), since);
  s.storage_via_compute = false;
  return s;
}

// ---- control flow ----

Tensors if_op(OpContext& c) {
  const bool cond = c.input_scalar(0) != 0;
  const Attribute& branch = c.attr(cond ? "then_branch" : "else_branch");
  if (!branch.g) c.fail(cond ? "then_branch" : "else_branch", " is not a graph");
  return c.run_subgraph(*branch.g, {});
}

// Stacks a loop's per-iteration outputs; storage types (which braid's stack does not take) go
// through their compute type, which holds them exactly.
Tensor stack_iterations(const std::vector<Tensor>& v, int64_t axis) {
  const DType t = v[0].dtype();
  if (is_compute_type(t)) return stack(v, axis);
  std::vector<Tensor> wide;
  for (const Tensor& x : v) wide.push_back(cast(x, compute_type(t)));
  return cast(stack(wide, axis), t);
}

Tensor empty_scan_output(OpContext& c, const ValueInfo& v, Device device) {
  if (!v.has_type)
    c.fail("ran no iterations, and its body leaves the type of scan output '", v.name,
           "' unspecified, so its empty result has no element type; give the body output a type");
  Shape s{0};
  for (const Dim& d : v.shape) s.push_back(std::max<int64_t>(d.size, 0));
  return zeros(s, v.dtype, device);
}

Tensors loop_op(OpContext& c) {
  const Attribute& body_attr = c.attr("body");
  if (!body_attr.g) c.fail("body is not a graph");
  const Graph& body = *body_attr.g;
  int64_t trip = std::numeric_limits<int64_t>::max();
  if (c.has_input(0)) trip = static_cast<int64_t>(c.input_scalar(0));
  bool cond = c.has_input(1) ? c.input_scalar(1) != 0 : true;
  std::vector<Tensor> carried;
  for (size_t i = 2; i < c.num_inputs(); ++i) carried.push_back(c.input(i));
  const size_t nc = carried.size();
  if (body.outputs.size() < 1 + nc) c.fail("body has ", body.outputs.size(), " outputs for ", nc, " loop-carried values");
  const size_t ns = body.outputs.size() - 1 - nc;
  std::vector<std::vector<Tensor>> scans(ns);
  for (int64_t i = 0; i < trip && cond; ++i) {
    std::vector<Tensor> ins{scalar_tensor(static_cast<double>(i), kInt64, c.device()), tensor_bool({cond}, {}, c.device())};
    ins.insert(ins.end(), carried.begin(), carried.end());
    std::vector<Tensor> outs = c.run_subgraph(body, ins);
    cond = outs[0].item() != 0;
    for (size_t j = 0; j < nc; ++j) carried[j] = outs[1 + j];
    for (size_t j = 0; j < ns; ++j) scans[j].push_back(outs[1 + nc + j]);
  }
  Tensors out = carried;
  for (size_t j = 0; j < ns; ++j)
    out.push_back(scans[j].empty() ? empty_scan_output(c, body.outputs[1 + nc + j], c.device()) : stack_iterations(scans[j], 0));
  return out;
}

/// Scan (opset 9+) over states and scan inputs; returns final states then scan outputs.
Tensors scan_core(OpContext& c, const Graph& body, std::vector<Tensor> state, const std::vector<Tensor>& inputs,
                  std::vector<int64_t> in_axes, const std::vector<int64_t>& in_dirs, const std::vector<int64_t>& out_axes,
                  const std::vector<int64_t>& out_dirs) {
  const auto n = static_cast<int64_t>(state.size());
  const auto m = static_cast<int64_t>(inputs.size());
  const int64_t k = static_cast<int64_t>(body.outputs.size()) - n;
  if (k < 0) c.fail("body has fewer outputs than state variables");
  if (static_cast<int64_t>(in_axes.size()) != m || static_cast<int64_t>(in_dirs.size()) != m ||
      static_cast<int64_t>(out_axes.size()) != k || static_cast<int64_t>(out_dirs.size()) != k)
    c.fail("scan axes/directions attributes have the wrong number of values");
  int64_t len = -1;
  for (int64_t j = 0; j < m; ++j) {
    const Tensor& t = inputs[static_cast<size_t>(j)];
    in_axes[static_cast<size_t>(j)] = norm_axis(c, in_axes[static_cast<size_t>(j)], t.dim(), "scan_input_axes");
    const int64_t l = t.size(in_axes[static_cast<size_t>(j)]);
    if (len >= 0 && l != len) c.fail("scan inputs differ in sequence length (", len, " and ", l, ")");
    len = l;
  }
  std::vector<std::vector<Tensor>> outs(static_cast<size_t>(k));
  for (int64_t t = 0; t < len; ++t) {
    std::vector<Tensor> ins = state;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t at = in_dirs[static_cast<size_t>(j)] != 0 ? len - 1 - t : t;
      ins.push_back(inputs[static_cast<size_t>(j)].select(in_axes[static_cast<size_t>(j)], at));
    }
    std::vector<Tensor> res = c.run_subgraph(body, ins);
    for (int64_t i = 0; i < n; ++i) state[static_cast<size_t>(i)] = res[static_cast<size_t>(i)];
    for (int64_t j = 0; j < k; ++j) outs[static_cast<size_t>(j)].push_back(res[static_cast<size_t>(n + j)]);
  }
  Tensors result = state;
  for (int64_t j = 0; j < k; ++j) {
    auto& v = outs[static_cast<size_t>(j)];
    if (v.empty()) {
      result.push_back(empty_scan_output(c, body.outputs[static_cast<size_t>(n + j)], c.device()));
      continue;
    }
    if (out_dirs[static_cast<size_t>(j)] != 0) std::reverse(v.begin(), v.end());
    const int64_t axis = norm_axis(c, out_axes[static_cast<size_t>(j)], v[0].dim() + 1, "scan_output_axes");
    result.push_back(stack_iterations(v, axis));
  }
  return result;
}

Tensors scan_op(OpContext& c) {
  const Attribute& body_attr = c.attr("body");
  if (!body_attr.g) c.fail("body is not a graph");
  const Graph& body = *body_attr.g;
  const int64_t m = c.attr_int("num_scan_inputs", 0);
  const bool v8 = c.opset() < 9;  // opset 8: optional sequence_lens first, a batch axis 0 everywhere
  const size_t first = v8 ? 1 : 0;
  const auto ni = static_cast<int64_t>(c.num_inputs()) - static_cast<int64_t>(first);
  if (m <= 0 || m > ni) c.fail("num_scan_inputs ", m, " is out of range for ", ni, " inputs");
  const int64_t n = ni - m;  // state variables
  const int64_t k = static_cast<int64_t>(body.outputs.size()) - n;
  std::vector<Tensor> state, inputs;
  for (int64_t i = 0; i < n; ++i) state.push_back(c.input(first + static_cast<size_t>(i)));
  for (int64_t j = 0; j < m; ++j) inputs.push_back(c.input(first + static_cast<size_t>(n + j)));
  if (!v8)
    return scan_core(c, body, state, inputs, c.attr_ints("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(m), 0)),
                     c.attr_ints("scan_input_directions", std::vector<int64_t>(static_cast<size_t>(m), 0)),
                     c.attr_ints("scan_output_axes", std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0)),
                     c.attr_ints("scan_output_directions", std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0)));
  // Opset 8: run each batch entry on its own and stack the results.
  const std::vector<int64_t> dirs = c.attr_ints("directions", std::vector<int64_t>(static_cast<size_t>(m), 0));
  if (inputs.empty() || inputs[0].dim() < 2) c.fail("scan inputs need a batch and a sequence axis");
  const int64_t batch = inputs[0].size(0), len = inputs[0].size(1);
  if (c.has_input(0))
    for (int64_t l : c.input_ints(0))
      if (l != len)
        throw NotImplementedError(detail::cat(c.node().label(), ": Scan with sequence_lens shorter than the sequence is not supported"));
  std::vector<std::vector<Tensor>> per_batch(static_cast<size_t>(n + std::max<int64_t>(k, 0)));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> sb, ib;
    for (const Tensor& t : state) sb.push_back(t.select(0, b));
    for (const Tensor& t : inputs) ib.push_back(t.select(0, b));
    Tensors r = scan_core(c, body, sb, ib, std::vector<int64_t>(static_cast<size_t>(m), 0), dirs,
                          std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0),
                          std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), 0));
    for (size_t i = 0; i < r.size(); ++i) per_batch[i].push_back(r[i]);
  }
  Tensors result;
  for (auto& v : per_batch) result.push_back(stack(v, 0));
  return result;
}

}  // namespace

void register_control_ops(OpRegistry& r) {
  r.add(control("If", {"then_branch", "else_branch"}, if_op, 1));
  r.add(control("Loop", {"body"}, loop_op, 1));
  r.add(control("Scan", {"body", "num_scan_inputs", "scan_input_axes", "scan_input_directions", "scan_output_axes",
                         "scan_output_directions", "directions"},
                scan_op, 8));
}

}  // namespace braid::onnx::ops
