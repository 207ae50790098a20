// The gate pass: squeeze-and-excitation blocks written as nodes, run as one detail::channel_gate
// in inference (Note [Channel gates as one op] in src/ops/gate.cpp): finding
// them in the top-level graph, and running one. Internal to onnx/.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "braid/conv.h"
#include "ops/fused.h"
#include "passes.h"

namespace braid::onnx {

namespace {

bool plain_node(const Node& n, const char* op_type) {
  return n.op_type == op_type && n.domain.empty() && n.outputs.size() == 1 && !n.inputs.empty();
}

// A Conv that is a 1x1 product of channels: kernel 1x1, stride, dilation and group 1, no padding.
bool pointwise_conv(const Node& n) {
  if (!plain_node(n, "Conv") || n.inputs.size() < 2) return false;
  for (const auto& [name, a] : n.attributes) {
    bool ok;
    if (name == "kernel_shape")
      ok = a.ints == std::vector<int64_t>{1, 1};
    else if (name == "strides" || name == "dilations")
      ok = a.ints == std::vector<int64_t>{1, 1};
    else if (name == "pads")
      ok = a.ints == std::vector<int64_t>{0, 0, 0, 0};
    else if (name == "group")
      ok = a.i == 1;
    else if (name == "auto_pad")
      ok = a.s == "NOTSET" || a.s == "VALID";
    else
      ok = false;
    if (!ok) return false;
  }
  return true;
}

bool activation(const Node& n) {
  static const std::set<std::string> kKinds{"Relu", "Clip", "HardSwish", "HardSigmoid"};
  return n.domain.empty() && kKinds.count(n.op_type) != 0 && n.outputs.size() == 1 && !n.inputs.empty();
}

}  // namespace

// A block is found from its GlobalAveragePool along the only reader of each value, Identity nodes
// passed over: per stage a 1x1 Conv of weights (initialisers, or values of Constant and static
// nodes) with an optional bias among them, optionally an Add of such a value (the bias as
// PaddlePaddle writes it) and an activation that a convolution epilogue
// computes; then a Mul of the pool's input by the gate. Every value inside is read once and is not
// a graph output. Whether the weights' shapes and the activations' numbers fit is checked when the
// block runs; the nodes run one by one where they do not.
namespace {

void match_gates(MatchContext& m) {
  const Graph& g = m.g;
  const auto& uses = m.uses;
  const auto& keep = m.keep;
  const auto& weights = m.weights;
  ExecPlan& plan = m.plan;
  const size_t n = g.nodes.size();
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < n; ++i)
    for (const auto& r : g.nodes[i].inputs) readers[r].push_back(i);
  std::set<size_t> taken;
  for (const auto& [conv, bn] : plan.conv_bn) taken.insert({conv, bn});
  for (const auto& [conv, ms] : plan.conv_affine) taken.insert({conv, ms.first, ms.second});
  for (const auto& [q, dq] : plan.qdq) taken.insert({q, dq});
  for (const auto& [div, f] : plan.gelu) taken.insert({div, f.erf, f.add, f.mul1, f.mul2});
  // A value that does not change between runs: an initialiser, or made by a Constant or static node.
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
  const auto weight = [&](const std::string& name) {
    if (weights.count(name) != 0) return true;
    auto p = producer.find(name);
    return p != producer.end() && (g.nodes[p->second].op_type == "Constant" || plan.static_node[p->second]);
  };
  std::set<size_t> early;
  size_t first = 0;
  const auto fixed = [&](const std::string& name) {
    return weight(name) && available_early(g, producer, keep, plan, name, first, early);
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& pool = g.nodes[i];
    if (!plain_node(pool, "GlobalAveragePool") || pool.inputs.size() != 1 || taken.count(i) != 0 ||
        plan.static_node[i])
      continue;
    GateFusion f;
    early.clear();
    first = i;
    f.input = pool.inputs[0];
    f.nodes.push_back(i);
    std::string v = pool.outputs[0];
    // The one node that reads v (Identity nodes passed over, into f.nodes), or n.
    const auto next = [&]() -> size_t {
      for (;;) {
        auto it = readers.find(v);
        auto u = uses.find(v);
        if (it == readers.end() || it->second.size() != 1 || u == uses.end() || u->second != 1 || keep.count(v) != 0)
          return n;
        const size_t r = it->second[0];
        if (taken.count(r) != 0) return n;
        if (!plain_node(g.nodes[r], "Identity")) return r;
        f.nodes.push_back(r);
        v = g.nodes[r].outputs[0];
      }
    };
    bool ok = true;
    size_t j = next();
    for (GateFusion::Stage& st : f.stages) {
      if (j == n || !pointwise_conv(g.nodes[j]) || g.nodes[j].inputs[0] != v || !fixed(g.nodes[j].inputs[1]) ||
          (g.nodes[j].inputs.size() > 2 && !g.nodes[j].inputs[2].empty() && !fixed(g.nodes[j].inputs[2]))) {
        ok = false;
        break;
      }
      st.conv = j;
      f.nodes.push_back(j);
      v = g.nodes[j].outputs[0];
      j = next();
      if (j != n && plain_node(g.nodes[j], "Add") && g.nodes[j].inputs.size() == 2) {
        const Node& add = g.nodes[j];
        const std::string& other = add.inputs[0] == v ? add.inputs[1] : add.inputs[0];
        if (other != v && fixed(other)) {
          st.add = j;
          st.bias = other;
          f.nodes.push_back(j);
          v = add.outputs[0];
          j = next();
        }
      }
      if (j != n && activation(g.nodes[j]) && g.nodes[j].inputs[0] == v) {
        st.act = j;
        f.nodes.push_back(j);
        v = g.nodes[j].outputs[0];
        j = next();
      }
    }
    if (!ok || j == n || !plain_node(g.nodes[j], "Mul") || g.nodes[j].inputs.size() != 2) continue;
    const Node& mul = g.nodes[j];
    if (!((mul.inputs[0] == f.input && mul.inputs[1] == v) || (mul.inputs[1] == f.input && mul.inputs[0] == v)))
      continue;
    f.nodes.push_back(j);
    f.gate = v;
    f.output = mul.outputs[0];
    f.early.assign(early.begin(), early.end());
    // The block computes its Convs' activations itself.
    for (const GateFusion::Stage& st : f.stages) plan.conv_act.erase(st.conv);
    taken.insert(f.nodes.begin(), f.nodes.end());
    plan.gates[i] = std::move(f);
  }
}

}  // namespace

// Where a chain took a block's Mul, the block makes its gate alone (called by the chain pass).
void settle_gates(ExecPlan& plan) {
  std::set<size_t> chained;
  for (const auto& [first, chain] : plan.chains) chained.insert(chain.nodes.begin(), chain.nodes.end());
  for (auto& [pool, f] : plan.gates)
    if (chained.count(f.nodes.back()) != 0) {
      f.gate_only = true;
      f.nodes.pop_back();
    }
}

bool Executor::run_gate(const Graph& g, const GateFusion& gate, Scope& scope, const ExecPlan& plan) {
  const Tensor* x = scope.find(gate.input);
  if (x == nullptr || !x->defined() || x->dtype() != kFloat32 || x->dim() != 4 || x->device() != device_ ||
      x->numel() == 0)
    return false;
  // Per stage: the 1x1 weight (C_out, C_in, 1, 1), its bias (C_out) and its activation.
  Tensor w[2], b[2];
  detail::ConvActivation act[2];
  int64_t c_in = x->size(1);
  for (int s = 0; s < 2; ++s) {
    const GateFusion::Stage& st = gate.stages[s];
    const Node& conv = g.nodes[st.conv];
    const Tensor* wt = scope.find(conv.inputs[1]);
    if (wt == nullptr || !wt->defined() || wt->dtype() != kFloat32 || wt->dim() != 4 || wt->size(1) != c_in ||
        wt->size(2) != 1 || wt->size(3) != 1 || wt->device() != device_)
      return false;
    const int64_t c_out = wt->size(0);
    w[s] = *wt;
    const auto bias_of = [&](const std::string& name, bool conv_bias) -> bool {
      const Tensor* t = scope.find(name);
      if (t == nullptr || !t->defined() || t->dtype() != kFloat32 || t->numel() != c_out || t->device() != device_)
        return false;
      // A Conv's bias is (C_out); an Add's operand must broadcast to (N, C_out, 1, 1) as it is.
      if (conv_bias ? t->dim() != 1 : (t->dim() > 4 || (t->dim() >= 3 ? t->size(-3) != c_out : c_out != 1)))
        return false;
      const Tensor flat = t->reshape({c_out});
      b[s] = b[s].defined() ? b[s] + flat : flat;
      return true;
    };
    if (conv.inputs.size() > 2 && !conv.inputs[2].empty() && !bias_of(conv.inputs[2], true)) return false;
    if (st.add != GateFusion::kNone && !bias_of(st.bias, false)) return false;
    if (st.act != GateFusion::kNone) {
      const Node& a = g.nodes[st.act];
      const auto attr_f = [&](const char* name, double fallback) {
        auto it = a.attributes.find(name);
        return it == a.attributes.end() ? fallback : static_cast<double>(it->second.f);
      };
      if (a.op_type == "Relu") {
        act[s] = {"relu"};
      } else if (a.op_type == "HardSwish") {
        act[s] = {"hardswish"};
      } else if (a.op_type == "HardSigmoid") {
        act[s] = {"hardsigmoid", attr_f("alpha", 0.2), attr_f("beta", 0.5)};
      } else {  // Clip: attributes before opset 11, optional one-element inputs since
        const double lowest = std::numeric_limits<float>::lowest(), highest = std::numeric_limits<float>::max();
        act[s] = {"clip", attr_f("min", lowest), attr_f("max", highest)};
        for (size_t k = 1; k < a.inputs.size() && k < 3; ++k)
          if (!a.inputs[k].empty() && !number(a.inputs[k], scope, plan, k == 1 ? act[s].a : act[s].b)) return false;
      }
    }
    c_in = c_out;
  }
  if (c_in != x->size(1)) return false;  // the gate has one value per channel of x
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  if (gate.gate_only)
    scope.at(gate.gate) = detail::channel_gate_values(*x, w[0], b[0], act[0], w[1], b[1], act[1]);
  else
    scope.at(gate.output) = detail::channel_gate(*x, w[0], b[0], act[0], w[1], b[1], act[1]);
  add_time(start, "gate");
  return true;
}

namespace {

std::vector<FusedGroup> gate_groups(const Graph&, const ExecPlan& plan) {
  return groups_of(plan.gates, [](size_t, const GateFusion& f) { return f.nodes; });
}

bool run_gate_group(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_gate(g, plan.gates.at(at), scope, plan);
}

}  // namespace

Pass gate_pass() {
  return {"gate", "Gate",
          "a squeeze-and-excitation block (pool, two 1x1 Convs with activations, the gate's Mul) as one op",
          match_gates, gate_groups, run_gate_group};
}

}  // namespace braid::onnx
