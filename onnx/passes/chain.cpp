// The chain pass: runs of elementwise nodes run as one braid::elementwise_chain in inference (Note
// [Elementwise chains] in src/ops/chain.cpp), with the float32 or int8 product before them where
// one heads them: finding them in the top-level graph, and running one. Internal to onnx/.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes.h"

namespace braid::onnx {

namespace {

bool no_attributes(const Node& n) { return n.attributes.empty(); }

std::optional<ChainStep::Kind> arithmetic(const Node& n) {
  if (!n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1 || !no_attributes(n)) return std::nullopt;
  if (n.op_type == "Add") return ChainStep::Kind::Add;
  if (n.op_type == "Sub") return ChainStep::Kind::Sub;
  if (n.op_type == "Mul") return ChainStep::Kind::Mul;
  if (n.op_type == "Div") return ChainStep::Kind::Div;
  return std::nullopt;
}

bool inference_batch_norm(const Node& n) {
  if (n.op_type != "BatchNormalization" || !n.domain.empty() || n.inputs.size() != 5 || n.outputs.size() != 1)
    return false;
  auto tm = n.attributes.find("training_mode");
  return tm == n.attributes.end() || tm->second.i == 0;
}

}  // namespace

bool available_early(const Graph& g, const std::map<std::string, size_t>& producer, const std::set<std::string>& keep,
                     const ExecPlan& plan, const std::string& v, size_t first, std::set<size_t>& early) {
  auto p = producer.find(v);
  if (p == producer.end() || p->second < first || early.count(p->second) != 0) return true;
  const Node& node = g.nodes[p->second];
  const bool constant_node =
      node.op_type == "Constant" && node.domain.empty() && node.outputs.size() == 1 && keep.count(node.outputs[0]) == 0;
  if (!constant_node && !plan.static_node[p->second]) return false;
  early.insert(p->second);
  for (const auto& in : node.inputs)
    if (!in.empty() && !available_early(g, producer, keep, plan, in, first, early)) return false;
  return true;
}

// A chain grows from its first node along the nodes that read its values, in graph order: a QDQ
// pair, an inference BatchNormalization, an exact GELU written out, or an Add/Sub/Mul/Div whose
// operands are chain values and at most one other value (a one-element constant, or a tensor that
// broadcasts to the chain's shape: both checked when the chain runs). A Cast to float32 may head it.
// It ends at the first node that reads a chain value and is none of those, and is cut back to its
// longest prefix whose values, but the last, no node outside it reads, and whose other inputs exist
// before it runs (made earlier, or by Constant and static nodes it runs early). Nodes already in
// another pattern (Conv folding, fused activations) stay out. The chain runs at its first node.
void settle_gates(ExecPlan& plan);  // gate.cpp

namespace {

void match_chains(MatchContext& m) {
  const Graph& g = m.g;
  const auto& uses = m.uses;
  const auto& keep = m.keep;
  const auto& weights = m.weights;
  ExecPlan& plan = m.plan;
  const size_t n = g.nodes.size();
  std::set<size_t> taken;
  for (const auto& [conv, bn] : plan.conv_bn) taken.insert(bn);
  for (const auto& [conv, ms] : plan.conv_affine) taken.insert({ms.first, ms.second});
  for (const auto& [at, f] : plan.conv_act) {
    taken.insert(f.nodes.begin(), f.nodes.end());
    taken.insert(f.post.begin(), f.post.end());
  }
  for (const auto& [div, f] : plan.gelu) taken.insert({f.erf, f.add, f.mul1, f.mul2});  // the Div heads a step
  for (const auto& [pool, f] : plan.gates) taken.insert(f.nodes.begin(), f.nodes.end() - 1);  // not the Mul
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
  // A weight, a Constant node's value or a static node's: not the chain's input when a head has a
  // better one.
  const auto fixed = [&](const std::string& v) {
    if (plan.constants.count(v) != 0 || weights.count(v) != 0) return true;
    auto p = producer.find(v);
    return p != producer.end() && (plan.static_node[p->second] || g.nodes[p->second].op_type == "Constant");
  };
  const auto available = [&](const std::string& v, size_t first, std::set<size_t>& early) {
    return available_early(g, producer, keep, plan, v, first, early);
  };
  // Whether the model declares v broader than x in some dimension (size 1 in x, more in v): an
  // operand that would make the result larger than the chain's input, which a chain cannot take
  // (a squeeze-and-excitation's input seen from its channel scale).
  std::map<std::string, const ValueInfo*> declared;
  for (const auto* infos : {&g.inputs, &g.value_info, &g.outputs})
    for (const ValueInfo& vi : *infos)
      if (vi.has_shape) declared[vi.name] = &vi;
  // A value's declared shape, or that of the value a QDQ pair's node took (undeclared in files
  // that onnxruntime's quantiser wrote).
  const auto shape_of = [&](std::string v) -> const std::vector<Dim>* {
    for (int hop = 0; hop < 4; ++hop) {
      if (auto d = declared.find(v); d != declared.end()) return &d->second->shape;
      auto p = producer.find(v);
      if (p == producer.end()) return nullptr;
      const Node& node = g.nodes[p->second];
      if ((node.op_type != "QuantizeLinear" && node.op_type != "DequantizeLinear") || node.inputs.empty())
        return nullptr;
      v = node.inputs[0];
    }
    return nullptr;
  };
  // Unknown and symbolic sizes in v count as possibly more than 1.
  const auto widens = [&](const std::string& v, const std::string& x) {
    const std::vector<Dim>*sv = shape_of(v), *sx = shape_of(x);
    if (sv == nullptr || sx == nullptr || sv->size() > sx->size()) return false;
    for (size_t d = 1; d <= sv->size(); ++d)
      if ((*sv)[sv->size() - d].size != 1 && (*sx)[sx->size() - d].size == 1) return true;
    return false;
  };
  std::set<size_t> dq_of_pair;
  for (const auto& [q, dq] : plan.qdq) dq_of_pair.insert(dq);
  for (size_t first = 0; first < n; ++first) {
    if (taken.count(first) != 0 || dq_of_pair.count(first) != 0) continue;
    ChainFusion chain;
    std::map<std::string, int> slot;  // chain value -> slot
    std::vector<std::string> slot_value;
    // The step node m makes, given the chain's slots, or false when it is not one.
    const auto step_of = [&](size_t m, ChainFusion::Step& st) {
      const Node& node = g.nodes[m];
      if (taken.count(m) != 0 || dq_of_pair.count(m) != 0 || plan.static_node[m]) return false;
      st = ChainFusion::Step{};
      st.node = m;
      if (auto q = plan.qdq.find(m); q != plan.qdq.end()) {
        if (slot.count(node.inputs[0]) == 0) return false;
        st.kind = ChainStep::Kind::FakeQuantize;
        st.also = {q->second};
        st.a = slot[node.inputs[0]];
        return true;
      }
      if (auto ge = plan.gelu.find(m); ge != plan.gelu.end()) {  // Note [GELU as one op]
        if (slot.count(node.inputs[0]) == 0) return false;
        st.kind = ge->second.half_last ? ChainStep::Kind::GeluHalfLast : ChainStep::Kind::Gelu;
        st.also = {ge->second.erf, ge->second.add, ge->second.mul1, ge->second.mul2};
        st.a = slot[node.inputs[0]];
        return true;
      }
      if (inference_batch_norm(node)) {
        if (slot.count(node.inputs[0]) == 0) return false;
        st.kind = ChainStep::Kind::ChannelAffine;
        st.a = slot[node.inputs[0]];
        return true;
      }
      if (auto kind = arithmetic(node)) {
        st.kind = *kind;
        int* operand[2] = {&st.a, &st.b};
        for (size_t k = 0; k < 2; ++k) {
          const std::string& v = node.inputs[k];
          if (auto s = slot.find(v); s != slot.end()) {
            *operand[k] = s->second;
          } else if (st.constant.empty() && !widens(v, slot_value[0])) {  // told apart when it runs
            *operand[k] = ChainStep::kConstant;
            st.constant = v;
          } else {
            return false;
          }
        }
        return st.a >= 0 || st.b >= 0;
      }
      return false;
    };
    const Node& head = g.nodes[first];
    if (head.inputs.empty() || head.inputs[0].empty()) continue;
    // A Cast to float32 may head a chain (of int32 values, checked when it runs: MatMulInteger's
    // product before its scale); slot 0 is then its output.
    auto to = head.attributes.find("to");
    const bool cast_head = head.op_type == "Cast" && head.domain.empty() && head.outputs.size() == 1 &&
                           to != head.attributes.end() && to->second.i == 1 && keep.count(head.outputs[0]) == 0;
    const std::string& input = cast_head                                                             ? head.outputs[0]
                               : arithmetic(head) && fixed(head.inputs[0]) && !fixed(head.inputs[1]) ? head.inputs[1]
                                                                                                     : head.inputs[0];
    // Note [float32 epilogues]: a float32 MatMul by a 2-D weight whose product alone the head reads
    // runs with the chain, which may then be one step long (a bias).
    size_t product_of = ChainFusion::kNone;
    if (!cast_head) {
      auto p = producer.find(input);
      auto u = uses.find(input);
      if (p != producer.end() && taken.count(p->second) == 0 && keep.count(input) == 0 && u != uses.end() &&
          u->second == 1) {
        const Node& mm = g.nodes[p->second];
        auto w = mm.op_type == "MatMul" && mm.domain.empty() && mm.inputs.size() == 2 && mm.outputs.size() == 1
                     ? weights.find(mm.inputs[1])
                     : weights.end();
        if (w != weights.end() && w->second.dim() == 2 && w->second.dtype() == kFloat32) product_of = p->second;
      }
    }
    slot[input] = 0;
    slot_value.push_back(input);
    for (size_t m = cast_head ? first + 1 : first; m < n; ++m) {
      const Node& node = g.nodes[m];
      bool reads_chain = false;
      for (const auto& in : node.inputs) reads_chain = reads_chain || slot.count(in) != 0;
      if (!reads_chain) continue;
      ChainFusion::Step st;
      if (!step_of(m, st)) break;
      const std::string& out = g.nodes[st.also.empty() ? m : st.also.back()].outputs[0];
      slot[out] = static_cast<int>(slot_value.size());
      slot_value.push_back(out);
      chain.steps.push_back(st);
      if (chain.steps.size() == 1 && m != first && !cast_head) break;  // it starts at `first` or not at all
    }
    // The longest prefix of two steps or more whose inner values only its own nodes read, whose
    // other inputs exist before `first`.
    const size_t least = cast_head || product_of != ChainFusion::kNone ? 1 : 2;
    while (chain.steps.size() >= least) {
      const size_t count = chain.steps.size();
      std::set<size_t> inside;
      if (cast_head) inside.insert(first);
      for (size_t s = 0; s < count; ++s) {
        inside.insert(chain.steps[s].node);
        inside.insert(chain.steps[s].also.begin(), chain.steps[s].also.end());
      }
      bool ok = true;
      for (size_t s = cast_head ? 0 : 1; s < count && ok; ++s) {  // the inner values
        const std::string& v = slot_value[s];
        if (keep.count(v) != 0) ok = false;
        size_t readers = 0;
        for (size_t m : inside)  // nodes, as `uses` counts them (Mul(v, v) reads v once)
          readers += std::find(g.nodes[m].inputs.begin(), g.nodes[m].inputs.end(), v) != g.nodes[m].inputs.end();
        auto u = uses.find(v);
        ok = ok && u != uses.end() && u->second == readers;
      }
      chain.early.clear();
      std::set<size_t> early;
      for (size_t m : inside)
        for (const auto& in : g.nodes[m].inputs) {
          auto p = producer.find(in);
          if (!in.empty() && in != slot_value[0] && (p == producer.end() || inside.count(p->second) == 0))
            ok = ok && available(in, first, early);
        }
      if (ok) {
        chain.early.assign(early.begin(), early.end());
        break;
      }
      chain.steps.pop_back();
    }
    if (chain.steps.size() < least || (!cast_head && chain.steps[0].node != first)) continue;
    chain.input = cast_head ? head.inputs[0] : slot_value[0];
    chain.cast_input = cast_head;
    chain.output = slot_value[chain.steps.size()];
    if (cast_head) chain.nodes.push_back(first);
    for (const auto& st : chain.steps) {
      chain.nodes.push_back(st.node);
      chain.nodes.insert(chain.nodes.end(), st.also.begin(), st.also.end());
    }
    size_t at = first;
    // The product that the chain's input alone is runs with it when the chain's other inputs exist
    // before the product runs.
    const auto take_product = [&](size_t product, const std::string& value) {
      std::set<size_t> inside(chain.nodes.begin(), chain.nodes.end()), early(chain.early.begin(), chain.early.end());
      bool ok = true;
      for (size_t m : inside)
        for (const auto& in : g.nodes[m].inputs) {
          auto q = producer.find(in);
          if (!in.empty() && in != value && (q == producer.end() || inside.count(q->second) == 0))
            ok = ok && available(in, product, early);
        }
      if (!ok) return false;
      at = chain.matmul = product;
      chain.early.assign(early.begin(), early.end());
      chain.nodes.insert(chain.nodes.begin(), at);
      return true;
    };
    if (cast_head) {  // Note [int8 epilogues]: the product that the Cast alone reads runs with the chain
      auto p = producer.find(head.inputs[0]);
      auto u = uses.find(head.inputs[0]);
      if (p != producer.end() && g.nodes[p->second].op_type == "MatMulInteger" && g.nodes[p->second].domain.empty() &&
          g.nodes[p->second].outputs.size() == 1 && taken.count(p->second) == 0 && keep.count(head.inputs[0]) == 0 &&
          u != uses.end() && u->second == 1)
        take_product(p->second, head.inputs[0]);
    } else if (product_of != ChainFusion::kNone && !take_product(product_of, chain.input) && chain.steps.size() < 2) {
      continue;  // one step alone is no chain
    }
    taken.insert(chain.nodes.begin(), chain.nodes.end());
    plan.chains[at] = std::move(chain);
  }
  settle_gates(plan);
}

std::vector<FusedGroup> chain_groups(const Graph&, const ExecPlan& plan) {
  return groups_of(plan.chains, [](size_t, const ChainFusion& c) { return c.nodes; });
}

bool run_chain_group(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_chain(g, plan.chains.at(at), scope, plan);
}

}  // namespace

Pass chain_pass() {
  return {"chain", "ElementwiseChain",
          "a run of elementwise nodes (and the MatMul or MatMulInteger heading it) as one pass over the values",
          match_chains, chain_groups, run_chain_group};
}

bool Executor::chain_steps(const Graph& g, const ChainFusion& chain, const Scope& scope, const ExecPlan& plan,
                           const Shape& x, std::vector<ChainStep>& steps) {
  const int64_t rank = static_cast<int64_t>(x.size());
  for (const ChainFusion::Step& st : chain.steps) {
    const Node& node = g.nodes[st.node];
    ChainStep s;
    s.kind = st.kind;
    s.a = st.a;
    s.b = st.b;
    if (st.kind == ChainStep::Kind::FakeQuantize) {
      if (!qdq_numbers(node, scope, s.scale, s.zero, s.qtype)) return false;
    } else if (st.kind == ChainStep::Kind::Gelu || st.kind == ChainStep::Kind::GeluHalfLast) {
      if (!gelu_numbers(node, plan.gelu.at(st.node), scope, plan)) return false;
    } else if (st.kind == ChainStep::Kind::ChannelAffine) {
      if (rank < 2 || !batch_norm_affine(node, scope, plan, st.node, x[1], s.channel_scale, s.channel_shift))
        return false;
    } else if (!st.constant.empty()) {
      const Tensor* k = scope.find(st.constant);
      if (k == nullptr || !k->defined() || k->dtype() != kFloat32 || k->device() != device_ || k->dim() > rank)
        return false;
      if (k->numel() == 1) {
        s.k = static_cast<float>(k->item());
      } else {  // a tensor operand (a bias, a residual, a mask), which must keep x's shape
        for (int64_t d = 1; d <= k->dim(); ++d)
          if (k->size(-d) != 1 && k->size(-d) != x[static_cast<size_t>(rank - d)]) return false;
        (s.a == ChainStep::kConstant ? s.a : s.b) = ChainStep::kTensor;
        s.operand = *k;
      }
    }
    steps.push_back(std::move(s));
  }
  return true;
}

bool Executor::run_int_matmul_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan) {
  const Node& mm = g.nodes[chain.matmul];
  const auto input = [&](size_t k) -> const Tensor* {
    return k < mm.inputs.size() && !mm.inputs[k].empty() ? scope.find(mm.inputs[k]) : nullptr;
  };
  const Tensor *a = input(0), *b = input(1), *az = input(2), *bz = input(3);
  const auto eight_bit = [&](const Tensor* t) {
    return t != nullptr && t->defined() && (t->dtype() == kInt8 || t->dtype() == kUInt8) && t->device() == device_;
  };
  const auto zero_of = [&](const Tensor* z, const Tensor* t, int64_t& v) {
    if (z == nullptr) return (v = 0, true);
    if (!z->defined() || z->numel() != 1 || z->dtype() != t->dtype() || z->device() != device_) return false;
    v = static_cast<int64_t>(z->item());
    return true;
  };
  if (!eight_bit(a) || !eight_bit(b) || a->dim() < 2 || b->dim() != 2 || a->size(-1) != b->size(0) ||
      (mm.inputs.size() > 2 && !mm.inputs[2].empty() && az == nullptr) ||
      (mm.inputs.size() > 3 && !mm.inputs[3].empty() && bz == nullptr))
    return false;
  Shape product(a->shape().begin(), a->shape().end() - 1);
  product.push_back(b->size(1));
  std::vector<ChainStep> steps;
  if (!chain_steps(g, chain, scope, plan, product, steps)) return false;
  int64_t za = 0, zb = 0;
  if (!zero_of(az, a, za) || !zero_of(bz, b, zb)) {  // zero points per row or column: the product as its node
    run_node(mm, scope);
    const Tensor* x = scope.find(chain.input);
    if (x == nullptr || !x->defined() || x->dtype() != kInt32 || x->shape() != product)
      throw ValueError(detail::cat(model_.path, ": ", mm.label(), " did not give the int32 product of shape ",
                                   shape_str(product), " that the chain after it reads"));
    const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    scope.at(chain.output) = detail::elementwise_chain(*x, steps);
    add_time(start, "elementwise chain");
    return true;
  }
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  scope.at(chain.output) = detail::int_matmul_chain(*a, *b, za, zb, steps);
  add_time(start, "MatMulInteger+chain");
  return true;
}

bool Executor::run_matmul_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan) {
  const Node& mm = g.nodes[chain.matmul];
  const Tensor *a = scope.find(mm.inputs[0]), *b = scope.find(mm.inputs[1]);
  const auto usable = [&](const Tensor* t) {
    return t != nullptr && t->defined() && t->dtype() == kFloat32 && t->device() == device_;
  };
  if (!usable(a) || !usable(b) || a->dim() < 2 || b->dim() != 2 || a->size(-1) != b->size(0)) return false;
  Shape product(a->shape().begin(), a->shape().end() - 1);
  product.push_back(b->size(1));
  std::vector<ChainStep> steps;
  if (!chain_steps(g, chain, scope, plan, product, steps)) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  scope.at(chain.output) = detail::matmul_chain(*a, *b, steps);
  add_time(start, "MatMul+chain");
  return true;
}

bool Executor::run_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan) {
  if (chain.matmul != ChainFusion::kNone)
    return g.nodes[chain.matmul].op_type == "MatMul" ? run_matmul_chain(g, chain, scope, plan)
                                                     : run_int_matmul_chain(g, chain, scope, plan);
  const Tensor* x = scope.find(chain.input);
  if (x == nullptr || !x->defined() || x->dtype() != (chain.cast_input ? kInt32 : kFloat32) || x->device() != device_ ||
      x->numel() == 0)
    return false;
  std::vector<ChainStep> steps;
  if (!chain_steps(g, chain, scope, plan, x->shape(), steps)) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  scope.at(chain.output) = detail::elementwise_chain(*x, steps);
  add_time(start, "elementwise chain");
  return true;
}

}  // namespace braid::onnx
