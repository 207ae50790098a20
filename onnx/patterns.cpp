// The node patterns that the executor runs as one braid op in inference: finding the exact GELUs,
// and the Executor's runs of QDQ pairs, GELU, Conv folded with a BatchNormalization or a scalar
// affine, and a standalone BatchNormalization. Internal to onnx/.
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

// Note [GELU as one op]
// Exporters write the exact GELU of BERT-style models as five nodes, Div by sqrt 2, Erf, Add 1, Mul
// by x and Mul by 0.5 (in either order): five passes over the widest activation of a transformer
// block. In inference, with those numbers known and each intermediate read only by the next node,
// they run as braid::gelu, one pass (UnaryOp::Gelu). Its float operations are the composite
// x * (0.5 * (1 + erf(x / sqrt 2))): the halving moves, which is exact short of subnormals.
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
  scope.at(g.nodes[f.mul2].outputs[0]) = gelu(*x);
  add_time(start, "Gelu");
  return true;
}

// Note [Folding BatchNormalization into Conv]
// In inference (eval mode, no gradients) y = BN(conv(x, W, b)) is one convolution with
// W' = W s and b' = (b - mean) s + beta per output channel, s = gamma / sqrt(var + eps): one pass
// over the activations instead of three. The folded weights are kept between runs while the
// parameters they came from stay unchanged (Note [Folded weights kept]); training runs the graph
// as written.
bool Executor::run_folded(const Node& conv, const Node& bn, Scope& scope, const ExecPlan& plan, size_t node,
                          size_t bn_node, const Fused& fused) {
  // Note [Value slots]: each input at the slot the plan resolved for it, by name otherwise.
  const std::vector<int>*conv_slots = input_slots(plan, scope, node), *bn_slots = input_slots(plan, scope, bn_node);
  auto get = [&](const Node& n, const std::vector<int>* slots, size_t k) {
    const Tensor* t = scope.find(n.inputs[k], slots != nullptr ? (*slots)[k] : -1);
    return t == nullptr ? Tensor() : *t;
  };
  Tensor x = get(conv, conv_slots, 0), w = get(conv, conv_slots, 1);
  Tensor b = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? get(conv, conv_slots, 2) : Tensor();
  Tensor gamma = get(bn, bn_slots, 1), beta = get(bn, bn_slots, 2), mean_ = get(bn, bn_slots, 3),
         var_ = get(bn, bn_slots, 4);
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

// A BatchNormalization that no Conv folds (its input quantised, say) in inference: its scale and
// shift, gamma / sqrt(var + eps) and beta - mean * scale (Note [BatchNorm as scale and shift] in
// layers/normalization.cpp), kept as folded weights are, then one pass over the activations
// (braid::channel_affine) instead of half a dozen small ops and two passes on every run.
bool Executor::batch_norm_affine(const Node& bn, const Scope& scope, const ExecPlan& plan, size_t node,
                                 int64_t channels, Tensor& scale, Tensor& shift) {
  if (!bn.domain.empty() || bn.inputs.size() < 5 || bn.outputs.size() != 1) return false;
  auto tm = bn.attributes.find("training_mode");
  if (tm != bn.attributes.end() && tm->second.i != 0) return false;
  std::vector<Tensor> sources;
  for (size_t k = 1; k < 5; ++k) {
    const Tensor* t = scope.find(bn.inputs[k]);
    if (t == nullptr || !t->defined() || t->dtype() != kFloat32 || t->device() != device_ || t->dim() != 1 ||
        t->numel() != channels)
      return false;
    sources.push_back(*t);
  }
  auto eps_it = bn.attributes.find("epsilon");
  const double eps = eps_it == bn.attributes.end() ? 1e-5 : eps_it->second.f;
  if (!plan.folded.find(node, sources, {eps}, scale, shift)) {
    const auto versions = versions_of(sources);
    scale = rsqrt(sources[3] + eps) * sources[0];
    shift = sources[1] - sources[2] * scale;
    plan.folded.keep(node, sources, versions, {eps}, scale, shift);
  }
  return true;
}

bool Executor::run_batch_norm(const Node& bn, Scope& scope, const ExecPlan& plan, size_t node) {
  const Tensor* x = bn.inputs.empty() ? nullptr : scope.find(bn.inputs[0]);
  if (x == nullptr || !x->defined() || x->dtype() != kFloat32 || x->device() != device_ || x->dim() < 2) return false;
  const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  Tensor scale, shift;
  if (!batch_norm_affine(bn, scope, plan, node, x->size(1), scale, shift)) return false;
  scope.at(bn.outputs[0]) = channel_affine(*x, scale, shift);
  add_time(start, "BatchNormalization");
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

}  // namespace braid::onnx
