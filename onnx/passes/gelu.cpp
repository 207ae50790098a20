// The gelu pass: an exact GELU written out as five nodes, found and run as one braid::gelu in
// inference (Note [GELU as one op]). Internal to onnx/.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes.h"

namespace braid::onnx {

// Note [GELU as one op]
// Exporters write the exact GELU of BERT-style models as five nodes, Div by sqrt 2, Erf, Add 1, Mul
// by x and Mul by 0.5 (in either order): five passes over the widest activation of a transformer
// block. In inference, with those numbers known and each intermediate read only by the next node,
// they run as one pass in the float operations of the order written: x times half of (1 + erf)
// (either Mul first) as braid::gelu (UnaryOp::Gelu), x * (1 + erf) then halved, PyTorch's export, as
// detail::gelu_half_last (UnaryOp::GeluHalfLast). Moving the halving is exact short of subnormals
// and overflow (x above half the largest float gives inf written that way, x as braid::gelu), which
// the special-value test of the passes found: each order keeps its own bits.
bool Executor::gelu_numbers(const Node& div, const GeluFusion& f, const Scope& scope, const ExecPlan& plan) {
  double k = 0, one = 0, half = 0;
  if (!number(div.inputs[1], scope, plan, k) || !number(f.one, scope, plan, one) || !number(f.half, scope, plan, half))
    return false;
  return static_cast<float>(k) == static_cast<float>(1.4142135623730951) && one == 1 && half == 0.5;
}

bool Executor::run_gelu(const Graph& g, const Node& div, const GeluFusion& f, Scope& scope, const ExecPlan& plan) {
  if (!gelu_numbers(div, f, scope, plan)) return false;
  const Tensor* x = scope.find(div.inputs[0]);
  if (x == nullptr || !x->defined() || (x->dtype() != kFloat32 && x->dtype() != kFloat64) || x->device() != device_)
    return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  scope.at(g.nodes[f.mul2].outputs[0]) = f.half_last ? detail::gelu_half_last(*x) : gelu(*x);
  add_time(start, "Gelu");
  return true;
}

static void find_gelus(const Graph& g, const std::map<std::string, size_t>& uses, const std::set<std::string>& keep,
                ExecPlan& plan) {
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& in : g.nodes[i].inputs) readers[in].push_back(i);
  // The one node reading value v, which must be op (of the default domain, with one output), or
  // none when v has other readers or is a graph output.
  const auto sole = [&](const std::string& v, const char* op) -> const size_t* {
    auto u = uses.find(v);
    auto r = readers.find(v);
    if (u == uses.end() || u->second != 1 || keep.count(v) != 0 || r == readers.end() || r->second.size() != 1)
      return nullptr;
    const Node& m = g.nodes[r->second[0]];
    return m.op_type == op && m.domain.empty() && m.outputs.size() == 1 ? &r->second[0] : nullptr;
  };
  const auto other = [](const Node& m, const std::string& v) -> const std::string& {
    return m.inputs[0] == v ? m.inputs[1] : m.inputs[0];
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& div = g.nodes[i];
    if (div.op_type != "Div" || !div.domain.empty() || div.inputs.size() != 2 || div.outputs.size() != 1 ||
        plan.static_node[i])  // of weights and constants: kept, not run (Note [Static nodes evaluated once])
      continue;
    const std::string& x = div.inputs[0];
    const size_t* erf = sole(div.outputs[0], "Erf");
    const size_t* add = erf ? sole(g.nodes[*erf].outputs[0], "Add") : nullptr;
    const size_t* m1 = add ? sole(g.nodes[*add].outputs[0], "Mul") : nullptr;
    const size_t* m2 = m1 ? sole(g.nodes[*m1].outputs[0], "Mul") : nullptr;
    if (m2 == nullptr || g.nodes[*add].inputs.size() != 2) continue;
    const Node &a = g.nodes[*add], &n1 = g.nodes[*m1], &n2 = g.nodes[*m2];
    GeluFusion f{*erf, *add, *m1, *m2, other(a, g.nodes[*erf].outputs[0]), {}};
    // x * (1 + erf) then * 0.5, or (1 + erf) * 0.5 then * x.
    if (other(n1, a.outputs[0]) == x && other(n2, n1.outputs[0]) != x) {
      f.half = other(n2, n1.outputs[0]);
      f.half_last = true;
    }
    else if (other(n2, n1.outputs[0]) == x && other(n1, a.outputs[0]) != x)
      f.half = other(n1, a.outputs[0]);
    else
      continue;
    plan.gelu[i] = f;
  }
}

namespace {

void match_gelus(MatchContext& m) { find_gelus(m.g, m.uses, m.keep, m.plan); }

std::vector<FusedGroup> gelu_groups(const Graph&, const ExecPlan& plan) {
  return groups_of(plan.gelu, [](size_t div, const GeluFusion& f) {
    return std::vector<size_t>{div, f.erf, f.add, f.mul1, f.mul2};
  });
}

bool run_gelu_group(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_gelu(g, g.nodes[at], plan.gelu.at(at), scope, plan);
}

}  // namespace

Pass gelu_pass() {
  return {"gelu", "Gelu", "an exact GELU written as Div, Erf, Add, Mul, Mul as one op", match_gelus, gelu_groups,
          run_gelu_group};
}

}  // namespace braid::onnx
