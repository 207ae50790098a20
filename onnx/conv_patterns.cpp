// Finding the Conv patterns that the executor runs as one convolution in inference: a
// BatchNormalization folded into the Conv before it, a scalar affine after it, and the activation
// (with a residual Add before it) that becomes its epilogue. Internal to onnx/.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "executor.h"

namespace braid::onnx {

void find_conv_patterns(const Graph& g, const std::map<std::string, size_t>& uses, const std::set<std::string>& keep,
                        const std::map<std::string, Tensor>& weights, const std::map<std::string, size_t>& producer,
                        ExecPlan& plan) {
  const size_t n = g.nodes.size();
  const auto used = [&uses](const std::string& v) {
    auto it = uses.find(v);
    return it == uses.end() ? size_t{0} : it->second;
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& bn = g.nodes[i];
    if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.inputs.size() < 5) continue;
    auto tm = bn.attributes.find("training_mode");
    if (tm != bn.attributes.end() && tm->second.i != 0) continue;
    bool extra_outputs = false;
    for (size_t k = 1; k < bn.outputs.size(); ++k) extra_outputs = extra_outputs || !bn.outputs[k].empty();
    if (extra_outputs) continue;
    auto p = producer.find(bn.inputs[0]);
    if (p == producer.end()) continue;
    const Node& conv = g.nodes[p->second];
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) continue;
    if (used(bn.inputs[0]) != 1 || keep.count(bn.inputs[0]) != 0) continue;
    plan.conv_bn[p->second] = i;
  }
  // Note [Fusing activations into Conv]: an activation whose input only it reads, made by a Conv or
  // by a BatchNormalization folded into one; or HardSwish written out as x * Clip(x + 3, 0, 6) / 6
  // (x read by the Add and the Mul only), whose numbers the executor checks when it runs.
  for (const Node& c : g.nodes) {
    auto v = c.attributes.find("value");
    if (c.op_type == "Constant" && c.domain.empty() && c.outputs.size() == 1 && v != c.attributes.end() &&
        v->second.kind == Attribute::Kind::Tensor && v->second.t.defined() && v->second.t.numel() == 1 &&
        is_floating(v->second.t.dtype()))
      plan.constants[c.outputs[0]] = v->second.t.item();
  }
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < n; ++i)
    for (const auto& r : g.nodes[i].inputs) readers[r].push_back(i);
  // The one node that reads name (and is of op_type), or n when there is not exactly one.
  auto only_reader = [&](const std::string& name, const char* op_type) {
    auto it = readers.find(name);
    if (it == readers.end() || it->second.size() != 1 || keep.count(name) != 0 || used(name) != 1) return n;
    const Node& r = g.nodes[it->second[0]];
    return r.op_type == op_type && r.domain.empty() && r.outputs.size() == 1 ? it->second[0] : n;
  };
  // Note [Folding a scalar affine into Conv]: a Conv (not already folded with a BatchNormalization)
  // whose output only a Mul by a one-element constant reads, whose output only an Add of one reads.
  auto one_element = [&](const std::string& name) {
    auto w = weights.find(name);
    if (w != weights.end()) return w->second.numel() == 1 && w->second.dim() <= 1;
    auto pr = producer.find(name);
    if (pr == producer.end()) return false;
    const Node& c = g.nodes[pr->second];
    auto v = c.attributes.find("value");
    return c.op_type == "Constant" && v != c.attributes.end() && v->second.kind == Attribute::Kind::Tensor &&
           v->second.t.defined() && v->second.t.numel() == 1 && v->second.t.dim() <= 1;
  };
  auto other = [](const Node& node, const std::string& x) -> const std::string& {
    return node.inputs[0] == x ? node.inputs[1] : node.inputs[0];
  };
  // The Mul and Add by one-element constants that alone follow node i, or none.
  auto affine_after = [&](size_t i) -> std::vector<size_t> {
    const std::string& y = g.nodes[i].outputs[0];
    const size_t mul = only_reader(y, "Mul");
    if (mul == n || g.nodes[mul].inputs.size() != 2 || !one_element(other(g.nodes[mul], y))) return {};
    const size_t add = only_reader(g.nodes[mul].outputs[0], "Add");
    if (add == n || g.nodes[add].inputs.size() != 2 || !one_element(other(g.nodes[add], g.nodes[mul].outputs[0])))
      return {};
    return {mul, add};
  };
  std::set<size_t> affine_add;
  for (size_t p = 0; p < n; ++p) {
    const Node& c = g.nodes[p];
    if (c.op_type != "Conv" || !c.domain.empty() || c.outputs.size() != 1 || plan.conv_bn.count(p) != 0) continue;
    const std::vector<size_t> affine = affine_after(p);
    if (affine.empty()) continue;
    plan.conv_affine[p] = {affine[0], affine[1]};
    affine_add.insert(affine[1]);
  }
  std::set<size_t> folded_bn;
  for (const auto& [conv, bn] : plan.conv_bn) folded_bn.insert(bn);
  // The Conv node where the pattern ending at node p starts running (p itself, or the Conv that
  // p's folded BatchNormalization or scalar affine follows).
  std::map<size_t, size_t> conv_of_end;
  for (const auto& [conv, bn] : plan.conv_bn) conv_of_end[bn] = conv;
  for (const auto& [conv, ms] : plan.conv_affine) conv_of_end[ms.second] = conv;
  const auto start_of = [&](size_t p) {
    auto it = conv_of_end.find(p);
    return it == conv_of_end.end() ? p : it->second;
  };
  for (size_t p = 0; p < n; ++p) {
    const Node& src = g.nodes[p];
    const bool conv = src.op_type == "Conv" && src.domain.empty() && src.outputs.size() == 1;
    if ((!conv && folded_bn.count(p) == 0 && affine_add.count(p) == 0) || src.outputs.empty() ||
        keep.count(src.outputs[0]) != 0)
      continue;
    const std::string& x = src.outputs[0];
    auto rd = readers.find(x);
    if (rd == readers.end()) continue;
    if (rd->second.size() == 1 && used(x) == 1) {
      static const std::set<std::string> kFusable{"Relu", "Clip", "HardSwish", "HardSigmoid"};
      const auto activation = [&](size_t r, const std::string& of) {
        const Node& act = g.nodes[r];
        return act.domain.empty() && kFusable.count(act.op_type) != 0 && act.outputs.size() == 1 && act.inputs[0] == of;
      };
      if (activation(rd->second[0], x)) {
        plan.conv_act[p] = {{rd->second[0]}, g.nodes[rd->second[0]].op_type, affine_after(rd->second[0])};
        continue;
      }
      // Note [Residual as a post-op] (src/backend/cpu/conv.cpp): an Add of a value made before
      // the convolution starts (a residual block's shortcut), then an activation that alone reads
      // the sum.
      const size_t add = rd->second[0];
      const Node& a = g.nodes[add];
      if (a.op_type != "Add" || !a.domain.empty() || a.inputs.size() != 2 || a.outputs.size() != 1 ||
          a.inputs[0] == a.inputs[1] || keep.count(a.outputs[0]) != 0)
        continue;
      const std::string& residual = other(a, x);
      auto made = producer.find(residual);
      if (residual.empty() || (made != producer.end() && made->second >= start_of(p))) continue;
      auto ra = readers.find(a.outputs[0]);
      if (ra == readers.end() || ra->second.size() != 1 || used(a.outputs[0]) != 1 ||
          !activation(ra->second[0], a.outputs[0]))
        continue;
      const std::string& op = g.nodes[ra->second[0]].op_type;
      // Its memory may take the result only if no node reads it between the convolution's start
      // and the Add (the convolution itself included), directly or inside a subgraph, and it is not
      // a weight or a graph output; the executor checks at run time that nothing else holds it.
      auto rr = readers.find(residual);
      bool writable = rr != readers.end() && rr->second.size() == used(residual) && keep.count(residual) == 0 &&
                      weights.count(residual) == 0;
      for (size_t r : rr != readers.end() ? rr->second : std::vector<size_t>())
        writable = writable && (r < start_of(p) || r == add);
      plan.conv_act[p] = {{add, ra->second[0]}, "Add+" + op, affine_after(ra->second[0]), residual, writable};
      continue;
    }
    if (rd->second.size() != 2) continue;
    size_t add = n, mul = n;
    for (size_t r : rd->second) {
      if (g.nodes[r].op_type == "Add" && g.nodes[r].domain.empty()) add = r;
      if (g.nodes[r].op_type == "Mul" && g.nodes[r].domain.empty()) mul = r;
    }
    if (add == n || mul == n || g.nodes[add].inputs.size() != 2) continue;
    const size_t clip = only_reader(g.nodes[add].outputs[0], "Clip");
    if (clip == n || g.nodes[clip].inputs[0] != g.nodes[add].outputs[0]) continue;
    const Node& m = g.nodes[mul];
    const std::string& clip_out = g.nodes[clip].outputs[0];
    if (m.inputs.size() != 2 ||
        !((m.inputs[0] == x && m.inputs[1] == clip_out) || (m.inputs[1] == x && m.inputs[0] == clip_out)))
      continue;
    if (only_reader(clip_out, "Mul") != mul) continue;
    const size_t div = only_reader(m.outputs[0], "Div");
    if (div == n || g.nodes[div].inputs.size() != 2 || g.nodes[div].inputs[0] != m.outputs[0]) continue;
    plan.conv_act[p] = {{add, clip, mul, div}, "HardSwish", affine_after(div)};
  }
}

}  // namespace braid::onnx
