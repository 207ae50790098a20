// The conv pass: a Conv with what runs as part of it in inference, found and run as one
// convolution: a BatchNormalization folded into it, a scalar affine after it, and the activation
// (with a residual Add before it) that becomes its epilogue. Internal to onnx/.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes.h"

namespace braid::onnx {

namespace {

void match_conv(MatchContext& m) {
  const Graph& g = m.g;
  const auto& uses = m.uses;
  const auto& keep = m.keep;
  const auto& weights = m.weights;
  const auto& producer = m.producer;
  ExecPlan& plan = m.plan;
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

}  // namespace

// Note [Folding BatchNormalization into Conv]
// In inference (eval mode, no gradients) y = BN(conv(x, W, b)) is one convolution with
// W' = W s and b' = (b - mean) s + beta per output channel, s = gamma / sqrt(var + eps): one pass
// over the activations instead of three. The folded weights are kept between runs while the
// parameters they came from stay unchanged (Note [Folded weights kept]); training runs the graph
// as written.
bool Executor::run_folded(const Node& conv, const Node& bn, Scope& scope, const ExecPlan& plan, size_t node,
                          size_t bn_node, const Fused& fused) {
  (void)bn_node;
  auto get = [&](const Node& n, size_t k) {  // Note [Slots by the name's address]
    const Tensor* t = scope.find(n.inputs[k]);
    return t == nullptr ? Tensor() : *t;
  };
  Tensor x = get(conv, 0), w = get(conv, 1);
  Tensor b = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? get(conv, 2) : Tensor();
  Tensor gamma = get(bn, 1), beta = get(bn, 2), mean_ = get(bn, 3), var_ = get(bn, 4);
  for (const Tensor* t : {&x, &w, &gamma, &beta, &mean_, &var_})
    if (!t->defined() || (t->dtype() != kFloat32 && t->dtype() != kFloat64)) return false;
  if (w.dim() < 3 || gamma.numel() != w.size(0)) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  auto eps_it = bn.attributes.find("epsilon");
  const double eps = eps_it == bn.attributes.end() ? 1e-5 : eps_it->second.f;
  const std::vector<Tensor> sources{w, b, gamma, beta, mean_, var_};
  Tensor w2, b2;
  if (!plan.folded.find(node, sources, {eps}, w2, b2)) {
    const auto versions = versions_of(sources);
    Tensor scale = gamma * rsqrt(var_ + eps);
    Shape ws(static_cast<size_t>(w.dim()), 1);
    ws[0] = w.size(0);
    w2 = w * reshape(scale, ws);
    b2 = ((b.defined() ? b : zeros_like(mean_)) - mean_) * scale + beta;
    plan.folded.keep(node, sources, versions, {eps}, w2, b2);
  }
  run_conv_folded(conv, {x, w2, b2}, {&bn, nullptr}, bn.outputs[0], "Conv+BatchNormalization", scope, fused, start);
  return true;
}

// The Conv with folded weights and bias: its output (or the fused activation's) under output,
// errors naming what was folded, the time under the label in profiles.
void Executor::run_conv_folded(const Node& conv, std::vector<Tensor> inputs, std::array<const Node*, 2> folded,
                               const std::string& output, const std::string& label, Scope& scope, const Fused& fused,
                               std::chrono::steady_clock::time_point start) {
  std::vector<Tensor> outputs;
  try {
    OpContext ctx(conv, model_.opset(conv.domain), training_, std::move(inputs), this);
    outputs = fused.act ? ops::conv_fused(ctx, *fused.act) : registry_.find(conv.domain, conv.op_type)->run(ctx);
  } catch (const Error& e) {
    // What was folded is named here only, so that a run builds no message it does not throw.
    const std::string with =
        folded[1] != nullptr ? detail::cat(folded[0]->label(), " and ", folded[1]->label()) : folded[0]->label();
    throw ValueError(detail::cat(model_.path, ": ", conv.label(), " (folded with ", with, "): ", e.what()));
  }
  scope.at(fused.output ? *fused.output : output) = outputs.at(0);
  add_time(start, label, fused.label);
}

// Note [Folding a scalar affine into Conv]
// Some exporters write a learnable scale and shift after a convolution as Mul and Add by
// one-element constants (PP-LCNetV3's "learnable affine blocks" in PP-OCRv4): in inference
// y = conv(x, W, b) * a + d is one convolution with W' = a W and b' = a b + d, folded and kept as
// BatchNormalization is, and the activation after the Add can then fuse into it too.
bool Executor::run_affine(const Node& conv, const Node& mul, const Node& add, Scope& scope, const ExecPlan& plan,
                          size_t node, const Fused& fused) {
  const std::string& ka = mul.inputs[0] == conv.outputs[0] ? mul.inputs[1] : mul.inputs[0];
  const std::string& kd = add.inputs[0] == mul.outputs[0] ? add.inputs[1] : add.inputs[0];
  double a = 0, d = 0;
  if (!number(ka, scope, plan, a) || !number(kd, scope, plan, d)) return false;
  const Tensor* x = scope.find(conv.inputs[0]);
  const Tensor* w = scope.find(conv.inputs[1]);
  const Tensor* b = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? scope.find(conv.inputs[2]) : nullptr;
  if (x == nullptr || w == nullptr || w->dim() < 3 || (x->dtype() != kFloat32 && x->dtype() != kFloat64) ||
      w->dtype() != x->dtype() || (b != nullptr && b->dtype() != x->dtype()))
    return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  const std::vector<Tensor> sources{*w, b != nullptr ? *b : Tensor()};
  Tensor w2, b2;
  if (!plan.folded.find(node, sources, {a, d}, w2, b2)) {
    const auto versions = versions_of(sources);
    w2 = *w * a;
    b2 = (b != nullptr ? *b : zeros({w->size(0)}, w->dtype(), w->device())) * a + d;
    plan.folded.keep(node, sources, versions, {a, d}, w2, b2);
  }
  run_conv_folded(conv, {*x, w2, b2}, {&mul, &add}, add.outputs[0], "Conv+Affine", scope, fused, start);
  return true;
}

// Whether the activation the plan paired with conv can run as its epilogue in this run, and
// which: a 1-d or 2-d convolution, and the numbers it depends on known and as expected.
// src is the value the activation reads: the Conv's output, or its folded BatchNormalization's.
bool Executor::fusable(const Graph& g, size_t node, const std::string& src, const ActFusion& f, const Scope& scope,
                       const ExecPlan& plan, ops::FusedActivation& out) {
  const Tensor* x = scope.find(g.nodes[node].inputs[0]);
  if (x == nullptr || (x->dim() != 3 && x->dim() != 4)) return false;
  const Node& act = g.nodes[f.nodes[f.residual.empty() ? 0 : 1]];
  if (f.nodes.size() == 4) {  // x * Clip(x + 3, 0, 6) / 6, as PaddlePaddle writes HardSwish
    const Node &add = act, &clip = g.nodes[f.nodes[1]], &div = g.nodes[f.nodes[3]];
    const std::string& three = add.inputs[0] == src ? add.inputs[1] : add.inputs[0];
    double k3, lo, hi, k6;
    if (!number(three, scope, plan, k3) || clip.inputs.size() < 3 || !number(clip.inputs[1], scope, plan, lo) ||
        !number(clip.inputs[2], scope, plan, hi) || !number(div.inputs[1], scope, plan, k6))
      return false;
    if (k3 != 3 || lo != 0 || hi != 6 || k6 != 6) return false;
    out = {"hardswish"};
    return post_affine(g, f, scope, plan, out);
  }
  auto attr_f = [&](const char* name, double fallback) {
    auto it = act.attributes.find(name);
    return it == act.attributes.end() ? fallback : static_cast<double>(it->second.f);
  };
  if (act.op_type == "Relu") out = {"relu"};
  else if (act.op_type == "HardSwish") out = {"hardswish"};
  else if (act.op_type == "HardSigmoid") out = {"hardsigmoid", attr_f("alpha", 0.2), attr_f("beta", 0.5)};
  else if (act.op_type == "Clip") {
    const double lowest = std::numeric_limits<float>::lowest(), highest = std::numeric_limits<float>::max();
    out = {"clip", attr_f("min", lowest), attr_f("max", highest)};  // opsets before 11
    for (size_t k = 1; k < act.inputs.size() && k < 3; ++k)  // opset 11 on: optional scalar inputs
      if (!act.inputs[k].empty() && !number(act.inputs[k], scope, plan, k == 1 ? out.a : out.b)) return false;
  } else {
    return false;
  }
  if (!f.residual.empty()) {  // Note [Residual as a post-op]: of x's rank (ONNX broadcasting then matches)
    const Tensor* r = scope.find(f.residual);
    if (r == nullptr || r->dim() != x->dim()) return false;
    // Its memory may hold the result where no other node reads it from the convolution on
    // (the plan's ActFusion::residual_writable) and no other tensor (a caller's, a kept value, a
    // view) holds it: the scope's handle is the only one.
    out.residual_writable = f.residual_writable && r->impl_ptr().use_count() == 1 && r->storage().use_count() == 1;
    out.residual = *r;
  }
  return post_affine(g, f, scope, plan, out);
}

// The affine map after the activation that the plan found (Note [Folding a scalar affine into
// Conv]): its scale and shift into out; false when they are not known numbers.
bool Executor::post_affine(const Graph& g, const ActFusion& f, const Scope& scope, const ExecPlan& plan,
                         ops::FusedActivation& out) {
  if (f.post.empty()) return true;
  const Node &mul = g.nodes[f.post[0]], &add = g.nodes[f.post[1]];
  const std::string& from = g.nodes[f.nodes.back()].outputs[0];
  const std::string& ka = mul.inputs[0] == from ? mul.inputs[1] : mul.inputs[0];
  const std::string& kd = add.inputs[0] == mul.outputs[0] ? add.inputs[1] : add.inputs[0];
  return number(ka, scope, plan, out.scale) && number(kd, scope, plan, out.shift);
}

// The ladder the executor ran before the passes: a Conv folded with its BatchNormalization or its
// scalar affine, each with its epilogue where one fuses, or the Conv with its epilogue alone.
bool Executor::run_conv_group(const Graph& g, size_t i, Scope& scope, const ExecPlan& plan) {
  auto it = plan.conv_bn.find(i);
  // Note [Fusing activations into Conv]
  // In inference an activation (Relu, Clip, HardSwish, HardSigmoid) that alone reads a Conv's
  // output (or the output of the BatchNormalization folded into it) runs as the convolution's
  // epilogue (braid::conv2d_activation: oneDNN's post-ops on the CPU), so its pass over the
  // activations, which onnxruntime never makes either, disappears.
  auto af = plan.conv_affine.find(i);
  const size_t last = it != plan.conv_bn.end()       ? it->second
                      : af != plan.conv_affine.end() ? af->second.second
                                                     : i;
  auto a = plan.conv_act.find(last);
  ops::FusedActivation act;
  const ActFusion* fusion =
      a != plan.conv_act.end() && fusable(g, i, g.nodes[last].outputs[0], a->second, scope, plan, act) ? &a->second
                                                                                                        : nullptr;
  if (a != plan.conv_act.end() && fusion == nullptr) {
    // An activation that does not fuse in this run: the fold alone, then the activation's nodes as
    // written, their inner values dropped after them.
    const bool folded = it != plan.conv_bn.end()
                            ? run_folded(g.nodes[i], g.nodes[it->second], scope, plan, i, it->second)
                        : af != plan.conv_affine.end()
                            ? run_affine(g.nodes[i], g.nodes[af->second.first], g.nodes[af->second.second], scope,
                                         plan, i, Fused())
                            : false;
    if (!folded) return false;
    std::vector<size_t> rest = a->second.nodes;
    rest.insert(rest.end(), a->second.post.begin(), a->second.post.end());
    for (size_t k : rest) run_node(g.nodes[k], scope);
    scope.erase(g.nodes[last].outputs[0]);
    for (size_t k = 0; k + 1 < rest.size(); ++k) scope.erase(g.nodes[rest[k]].outputs[0]);
    return true;
  }
  const size_t out_node = fusion ? (fusion->post.empty() ? fusion->nodes.back() : fusion->post.back()) : 0;
  const Fused fused = fusion ? Fused{&act, &g.nodes[out_node].outputs[0], &fusion->label} : Fused();
  if (it != plan.conv_bn.end()) return run_folded(g.nodes[i], g.nodes[it->second], scope, plan, i, it->second, fused);
  if (af != plan.conv_affine.end())
    return run_affine(g.nodes[i], g.nodes[af->second.first], g.nodes[af->second.second], scope, plan, i, fused);
  if (fusion == nullptr) return false;
  run_node(g.nodes[i], scope, fused);
  return true;
}

namespace {

std::vector<FusedGroup> conv_groups(const Graph& g, const ExecPlan& plan) {
  std::map<size_t, FusedGroup> by_conv;
  for (const auto& [conv, bn] : plan.conv_bn) by_conv[conv] = {0, conv, {conv, bn}, {}};
  for (const auto& [conv, ms] : plan.conv_affine) by_conv[conv] = {0, conv, {conv, ms.first, ms.second}, {}};
  std::map<size_t, size_t> conv_of;  // a folded BatchNormalization or affine Add -> its Conv
  for (const auto& [conv, bn] : plan.conv_bn) conv_of[bn] = conv;
  for (const auto& [conv, ms] : plan.conv_affine) conv_of[ms.second] = conv;
  for (const auto& [at, f] : plan.conv_act) {
    auto c = conv_of.find(at);
    const size_t conv = c != conv_of.end() ? c->second : at;
    if (g.nodes[conv].op_type != "Conv") continue;  // an activation after a standalone folded node
    FusedGroup& grp = by_conv[conv];
    if (grp.nodes.empty()) grp = {0, conv, {conv}, {}};
    grp.nodes.insert(grp.nodes.end(), f.nodes.begin(), f.nodes.end());
    grp.nodes.insert(grp.nodes.end(), f.post.begin(), f.post.end());
  }
  std::vector<FusedGroup> out;
  for (auto& [conv, grp] : by_conv) out.push_back(std::move(grp));
  return out;
}

bool run_conv(Executor& ex, const Graph& g, size_t at, Scope& scope, const ExecPlan& plan) {
  return ex.run_conv_group(g, at, scope, plan);
}

}  // namespace

Pass conv_pass() {
  return {"conv", "FusedConv",
          "Conv with a folded BatchNormalization or scalar affine, and an activation (after a residual Add) as "
          "its epilogue",
          match_conv, conv_groups, run_conv};
}

}  // namespace braid::onnx
