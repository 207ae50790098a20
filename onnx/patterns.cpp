// Node patterns that the executor runs as one braid op in inference (Note [GELU as one op] in
// executor.h). Internal to onnx/.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "executor.h"

namespace braid::onnx {

void find_gelus(const Graph& g, const std::map<std::string, size_t>& uses, const std::set<std::string>& keep,
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
    if (div.op_type != "Div" || !div.domain.empty() || div.inputs.size() != 2 || div.outputs.size() != 1) continue;
    const std::string& x = div.inputs[0];
    const size_t* erf = sole(div.outputs[0], "Erf");
    const size_t* add = erf ? sole(g.nodes[*erf].outputs[0], "Add") : nullptr;
    const size_t* m1 = add ? sole(g.nodes[*add].outputs[0], "Mul") : nullptr;
    const size_t* m2 = m1 ? sole(g.nodes[*m1].outputs[0], "Mul") : nullptr;
    if (m2 == nullptr || g.nodes[*add].inputs.size() != 2) continue;
    const Node &a = g.nodes[*add], &n1 = g.nodes[*m1], &n2 = g.nodes[*m2];
    GeluFusion f{*erf, *add, *m1, *m2, other(a, g.nodes[*erf].outputs[0]), {}};
    // x * (1 + erf) then * 0.5, or (1 + erf) * 0.5 then * x.
    if (other(n1, a.outputs[0]) == x && other(n2, n1.outputs[0]) != x)
      f.half = other(n2, n1.outputs[0]);
    else if (other(n2, n1.outputs[0]) == x && other(n1, a.outputs[0]) != x)
      f.half = other(n1, a.outputs[0]);
    else
      continue;
    plan.gelu[i] = f;
  }
}

}  // namespace braid::onnx
