// The qdq pass: a QuantizeLinear and the DequantizeLinear that alone reads it as one
// braid::fake_quantize in inference (Note [QDQ pairs]). Internal to onnx/.
#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes.h"

namespace braid::onnx {

// Note [QDQ pairs]
// A quantised model written as QDQ (QuantizeLinear, then a DequantizeLinear with the same scale
// and zero point that alone reads its output) rounds each activation to its int8 grid in float.
// In inference, with one scale and zero point, the pair runs as braid::fake_quantize: one pass
// and no 8-bit tensor between them, bitwise the same values. Otherwise, or when the values are
// not what the fused op takes, the two nodes run as written.
bool Executor::qdq_numbers(const Node& q, const Scope& scope, double& scale, int64_t& zero, DType& qtype) {
  const Tensor* s = q.inputs.size() > 1 ? scope.find(q.inputs[1]) : nullptr;
  const Tensor* z = q.inputs.size() > 2 && !q.inputs[2].empty() ? scope.find(q.inputs[2]) : nullptr;
  if (s == nullptr || !s->defined() || s->numel() != 1 || s->dtype() != kFloat32 ||
      (z != nullptr && (!z->defined() || z->numel() != 1 || (z->dtype() != kInt8 && z->dtype() != kUInt8))))
    return false;
  scale = s->item();
  qtype = z != nullptr ? z->dtype() : kUInt8;
  zero = z != nullptr ? static_cast<int64_t>(z->item()) : 0;
  return std::isfinite(scale) && scale > 0;
}

bool Executor::run_fake_quantize(const Node& q, const Node& dq, Scope& scope) {
  const Tensor* x = scope.find(q.inputs[0]);
  double s = 0;
  int64_t zero = 0;
  DType qtype = kUInt8;
  if (x == nullptr || !x->defined() || x->dtype() != kFloat32 || x->device() != device_ ||
      !qdq_numbers(q, scope, s, zero, qtype))
    return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  scope.at(dq.outputs[0]) = fake_quantize(*x, s, zero, qtype);
  add_time(start, "QuantizeLinear+DequantizeLinear");
  return true;
}

namespace {

// A QuantizeLinear read only by a DequantizeLinear of the same scale and zero point, neither with
// attributes beyond a per-axis axis (unused per tensor).
void match_qdq(MatchContext& m) {
  const Graph& g = m.g;
  const size_t n = g.nodes.size();
  for (size_t i = 0; i < n; ++i) {
    const Node& q = g.nodes[i];
    if (q.op_type != "QuantizeLinear" || !q.domain.empty() || q.outputs.size() != 1 || q.inputs.size() < 2) continue;
    if (m.plan.static_node[i]) continue;  // of weights and constants: kept, not run (Note [Static nodes evaluated once])
    auto u = m.uses.find(q.outputs[0]);
    if (u == m.uses.end() || u->second != 1 || m.keep.count(q.outputs[0]) != 0) continue;
    size_t j = i + 1;
    while (j < n &&
           std::find(g.nodes[j].inputs.begin(), g.nodes[j].inputs.end(), q.outputs[0]) == g.nodes[j].inputs.end())
      ++j;
    if (j == n) continue;
    const Node& dq = g.nodes[j];
    const auto zero_of = [](const Node& node) { return node.inputs.size() > 2 ? node.inputs[2] : std::string(); };
    if (dq.op_type != "DequantizeLinear" || !dq.domain.empty() || dq.inputs[0] != q.outputs[0] ||
        dq.inputs.size() < 2 || dq.inputs[1] != q.inputs[1] || zero_of(dq) != zero_of(q) || dq.outputs.size() != 1)
      continue;
    bool plain = true;
    for (const Node* node : {&q, &dq})
      for (const auto& [name, a] : node->attributes) plain = plain && name == "axis";
    if (plain) m.plan.qdq[i] = j;
  }
}

std::vector<FusedGroup> qdq_groups(const Graph&, const ExecPlan& plan) {
  return groups_of(plan.qdq, [](size_t q, size_t dq) { return std::vector<size_t>{q, dq}; });
}

bool run_qdq(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_fake_quantize(g.nodes[at], g.nodes[plan.qdq.at(at)], scope);
}

}  // namespace

Pass qdq_pass() {
  return {"qdq", "FakeQuantize", "QuantizeLinear + DequantizeLinear of one scale as one rounding to the grid",
          match_qdq, qdq_groups, run_qdq};
}

}  // namespace braid::onnx
