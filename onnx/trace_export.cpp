// ONNX export of modules that have no layer exporter, by tracing one forward pass.
//
// Note [Export by tracing]
// A model whose forward is hand-written (a C++ Module subclass, or a Python nn.Module) has no entry
// in the layer-exporter registry (Note [Layer exporters]). export_layer then runs its forward once
// on the example input with an op trace active (src/ops/trace.h): every op's front door appends its
// name, operands, output and non-tensor arguments. The entries that the output depends on become
// ONNX nodes, one small rule per op (kRules below); a tensor no entry produced is the graph input,
// a parameter or buffer of the module (an initialiser under its state_dict name), or a constant
// (a Constant node). Shapes that carry the batch keep it symbolic where ONNX allows (Reshape's 0,
// Expand's 1, Slice's open end). What tracing cannot see (a Python if on tensor values, an op
// without a rule) is caught, not exported silently wrong: export_model runs the written graph with
// braid's own executor on a second input (another batch size, other values) and refuses the export
// when it does not reproduce the module's forward (check_traced_export).
#include "trace_export.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "braid/autograd.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "ops/trace.h"
#include "ops_util.h"

namespace braid::onnx {

namespace {

using detail::TraceEntry;
using ops::onnx_type_code;

int g_traced_modules = 0;

// What a rule works with: the entry, its operands' value names (cast on request) and the builder.
struct Emit {
  GraphBuilder& g;
  const TraceEntry& e;
  std::vector<std::string> in;

  const Tensor& x(size_t i = 0) const { return e.inputs[i]; }
  const Tensor& out() const { return e.output; }
  std::string cast(size_t i, DType t) {
    if (x(i).dtype() == t) return in[i];
    return g.node("Cast", {in[i]}, {{"to", attr_int(onnx_type_code(t))}})[0];
  }
  std::string one(const std::string& op, std::vector<std::string> inputs, std::map<std::string, Attribute> a = {}) {
    return g.node(op, inputs, std::move(a))[0];
  }
  std::string scalar(double v, DType t) { return g.scalar(v, t); }
  double f(size_t i) const { return e.attrs.floats.at(i); }
  int64_t n(size_t i) const { return e.attrs.ints.at(i); }
};

using Rule = std::function<std::string(Emit&)>;

Rule unary(const char* op) {
  return [op](Emit& m) { return m.one(op, {m.cast(0, m.out().dtype())}); };
}
Rule binary(const char* op) {
  return [op](Emit& m) { return m.one(op, {m.cast(0, m.out().dtype()), m.cast(1, m.out().dtype())}); };
}
Rule compare(const char* op, bool negate = false) {
  return [op, negate](Emit& m) {
    const DType t = promote_types(m.x(0).dtype(), m.x(1).dtype());
    std::string r = m.one(op, {m.cast(0, t), m.cast(1, t)});
    return negate ? m.one("Not", {r}) : r;
  };
}
Rule logical(const char* op) {
  return [op](Emit& m) { return m.one(op, {m.cast(0, kBool), m.cast(1, kBool)}); };
}
// Reductions whose axes are an attribute in opset 17 (ReduceMax, ReduceMin, ReduceProd).
Rule reduce_attr(const char* op) {
  return [op](Emit& m) {
    std::map<std::string, Attribute> a{{"keepdims", attr_int(m.f(0) != 0)}};
    if (!m.e.attrs.ints.empty()) a["axes"] = attr_ints(m.e.attrs.ints);
    return m.one(op, {m.cast(0, m.out().dtype())}, a);
  };
}
std::vector<int64_t> pads4(const Emit& m, size_t at) { return {m.n(at), m.n(at + 1), m.n(at), m.n(at + 1)}; }

const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> r = [] {
    std::map<std::string, Rule> r;
    for (auto [name, op] : std::vector<std::pair<const char*, const char*>>{
             {"neg", "Neg"}, {"abs", "Abs"}, {"exp", "Exp"}, {"log", "Log"}, {"sqrt", "Sqrt"}, {"reciprocal", "Reciprocal"},
             {"sin", "Sin"}, {"cos", "Cos"}, {"tanh", "Tanh"}, {"sigmoid", "Sigmoid"}, {"relu", "Relu"}, {"erf", "Erf"},
             {"floor", "Floor"}, {"ceil", "Ceil"}, {"round", "Round"}, {"sign", "Sign"}, {"asin", "Asin"},
             {"acos", "Acos"}, {"atan", "Atan"}, {"softplus", "Softplus"}, {"hardswish", "HardSwish"}})
      r[name] = unary(op);
    r["logical_not"] = [](Emit& m) { return m.one("Not", {m.cast(0, kBool)}); };
    r["isnan"] = [](Emit& m) { return m.one("IsNaN", {m.in[0]}); };
    r["rsqrt"] = [](Emit& m) { return m.one("Reciprocal", {m.one("Sqrt", {m.in[0]})}); };
    r["square"] = [](Emit& m) { return m.one("Mul", {m.in[0], m.in[0]}); };
    r["log1p"] = [](Emit& m) { return m.one("Log", {m.one("Add", {m.in[0], m.scalar(1, m.x().dtype())})}); };
    r["expm1"] = [](Emit& m) { return m.one("Sub", {m.one("Exp", {m.in[0]}), m.scalar(1, m.x().dtype())}); };
    r["leaky_relu"] = [](Emit& m) { return m.one("LeakyRelu", {m.in[0]}, {{"alpha", attr_float(m.f(0))}}); };
    r["elu"] = [](Emit& m) { return m.one("Elu", {m.in[0]}, {{"alpha", attr_float(m.f(0))}}); };
    r["hardsigmoid"] = [](Emit& m) {
      return m.one("HardSigmoid", {m.in[0]}, {{"alpha", attr_float(m.f(0))}, {"beta", attr_float(m.f(1))}});
    };
    r["pow"] = [](Emit& m) {
      if (m.e.inputs.size() == 2) return binary("Pow")(m);
      return m.one("Pow", {m.in[0], m.scalar(m.f(0), m.x().dtype())});  // pow(x, scalar)
    };
    r["clamp"] = [](Emit& m) {
      const DType t = m.x().dtype();
      auto bound = [&](double v) { return std::isinf(v) ? std::string() : m.scalar(v, t); };
      return m.one("Clip", {m.in[0], bound(m.f(0)), bound(m.f(1))});
    };
    // The exact GELU is traced without arguments; the tanh form comes through the unary path,
    // which always records two (unused) numbers.
    r["gelu"] = [](Emit& m) {
      const DType t = m.x().dtype();
      const std::string& x = m.in[0];
      if (m.e.attrs.floats.empty()) {  // 0.5 x (1 + erf(x / sqrt 2))
        std::string e = m.one("Erf", {m.one("Div", {x, m.scalar(std::sqrt(2.0), t)})});
        return m.one("Mul", {m.one("Mul", {x, m.one("Add", {e, m.scalar(1, t)})}), m.scalar(0.5, t)});
      }
      std::string x3 = m.one("Mul", {x, m.one("Mul", {x, x})});
      std::string inner = m.one("Add", {x, m.one("Mul", {x3, m.scalar(0.044715, t)})});
      std::string th = m.one("Tanh", {m.one("Mul", {inner, m.scalar(std::sqrt(2.0 / M_PI), t)})});
      return m.one("Mul", {m.one("Mul", {x, m.one("Add", {th, m.scalar(1, t)})}), m.scalar(0.5, t)});
    };
    for (auto [name, op] : std::vector<std::pair<const char*, const char*>>{
             {"add", "Add"}, {"sub", "Sub"}, {"mul", "Mul"}, {"div", "Div"}, {"maximum", "Max"}, {"minimum", "Min"}})
      r[name] = binary(op);
    r["where"] = [](Emit& m) {
      return m.one("Where", {m.cast(0, kBool), m.cast(1, m.out().dtype()), m.cast(2, m.out().dtype())});
    };
    r["eq"] = compare("Equal");
    r["ne"] = compare("Equal", true);
    r["lt"] = compare("Less");
    r["le"] = compare("LessOrEqual");
    r["gt"] = compare("Greater");
    r["ge"] = compare("GreaterOrEqual");
    r["logical_and"] = logical("And");
    r["logical_or"] = logical("Or");
    r["logical_xor"] = logical("Xor");
    r["sum"] = [](Emit& m) {
      std::vector<std::string> in{m.cast(0, m.out().dtype())};
      if (!m.e.attrs.ints.empty()) in.push_back(m.g.ints(m.e.attrs.ints));
      return m.one("ReduceSum", in, {{"keepdims", attr_int(m.f(0) != 0)}});
    };
    r["prod"] = reduce_attr("ReduceProd");
    r["amax"] = reduce_attr("ReduceMax");
    r["amin"] = reduce_attr("ReduceMin");
    r["argmax"] = [](Emit& m) {
      return m.one("ArgMax", {m.in[0]}, {{"axis", attr_int(m.n(0))}, {"keepdims", attr_int(m.f(0) != 0)}});
    };
    r["argmin"] = [](Emit& m) {
      return m.one("ArgMin", {m.in[0]}, {{"axis", attr_int(m.n(0))}, {"keepdims", attr_int(m.f(0) != 0)}});
    };
    r["softmax"] = [](Emit& m) { return m.one("Softmax", {m.in[0]}, {{"axis", attr_int(m.n(0))}}); };
    r["log_softmax"] = [](Emit& m) { return m.one("LogSoftmax", {m.in[0]}, {{"axis", attr_int(m.n(0))}}); };
    r["matmul"] = binary("MatMul");
    r["reshape"] = [](Emit& m) {
      // The shape as requested (a -1 stays inferred); a leading axis carried over from the input
      // stays symbolic (Reshape copies a 0).
      Shape s = m.e.attrs.ints;
      if (m.x().dim() > 0 && !s.empty() && s[0] == m.x().size(0) && s[0] > 0) s[0] = 0;
      return m.one("Reshape", {m.in[0], m.g.ints(s)});
    };
    r["permute"] = [](Emit& m) { return m.one("Transpose", {m.in[0]}, {{"perm", attr_ints(m.e.attrs.ints)}}); };
    r["slice"] = [](Emit& m) {
      const int64_t axis = m.n(0), start = m.n(1), step = m.n(3), size = m.x().size(axis);
      const int64_t end = m.n(2) >= size ? std::numeric_limits<int64_t>::max() : m.n(2);
      if (start == 0 && end == std::numeric_limits<int64_t>::max() && step == 1) return m.one("Identity", {m.in[0]});
      return m.one("Slice", {m.in[0], m.g.ints({start}), m.g.ints({end}), m.g.ints({axis}), m.g.ints({step})});
    };
    r["expand"] = [](Emit& m) {
      Shape s = m.out().shape();
      const size_t lead = s.size() - m.x().shape().size();
      for (size_t i = lead; i < s.size(); ++i)
        if (m.x().shape()[i - lead] == s[i]) s[i] = 1;  // kept axes broadcast as 1, so the batch stays free
      return m.one("Expand", {m.in[0], m.g.ints(s)});
    };
    for (const char* name : {"contiguous", "clone", "to"}) r[name] = [](Emit& m) { return m.one("Identity", {m.in[0]}); };
    r["cast"] = [](Emit& m) { return m.one("Cast", {m.in[0]}, {{"to", attr_int(onnx_type_code(m.out().dtype()))}}); };
    r["concat"] = [](Emit& m) {
      std::vector<std::string> in;
      for (size_t i = 0; i < m.in.size(); ++i) in.push_back(m.cast(i, m.out().dtype()));
      return m.one("Concat", in, {{"axis", attr_int(m.n(0))}});
    };
    r["pad"] = [](Emit& m) {
      // braid's pads are (before, after) pairs from the last axis inwards; ONNX's all befores, then all afters.
      const int64_t d = m.x().dim();
      std::vector<int64_t> onnx(2 * d, 0);
      for (size_t p = 0; p < m.e.attrs.ints.size() / 2; ++p) {
        const int64_t axis = d - 1 - static_cast<int64_t>(p);
        onnx[axis] = m.n(2 * p);
        onnx[d + axis] = m.n(2 * p + 1);
      }
      return m.one("Pad", {m.in[0], m.g.ints(onnx), m.scalar(m.f(0), m.x().dtype())}, {{"mode", attr_string("constant")}});
    };
    r["index_select"] = [](Emit& m) {
      std::string idx = m.one("Reshape", {m.cast(1, kInt64), m.g.ints({-1})});
      return m.one("Gather", {m.in[0], idx}, {{"axis", attr_int(m.n(0))}});
    };
    r["gather"] = [](Emit& m) {
      return m.one("GatherElements", {m.in[0], m.cast(1, kInt64)}, {{"axis", attr_int(m.n(0))}});
    };
    r["scatter_add"] = [](Emit& m) {
      return m.one("ScatterElements", {m.in[0], m.cast(1, kInt64), m.cast(2, m.out().dtype())},
                   {{"axis", attr_int(m.n(0))}, {"reduction", attr_string("add")}});
    };
    r["conv2d"] = [](Emit& m) {
      std::vector<std::string> in{m.in[0], m.in[1]};
      if (m.x(2).defined()) in.push_back(m.in[2]);
      return m.one("Conv", in,
                   {{"kernel_shape", attr_ints({m.n(0), m.n(1)})}, {"strides", attr_ints({m.n(2), m.n(3)})},
                    {"pads", attr_ints(pads4(m, 4))}, {"dilations", attr_ints({m.n(6), m.n(7)})},
                    {"group", attr_int(m.n(8))}});
    };
    r["max_pool2d"] = [](Emit& m) {
      return m.one("MaxPool", {m.in[0]},
                   {{"kernel_shape", attr_ints({m.n(0), m.n(1)})}, {"strides", attr_ints({m.n(2), m.n(3)})},
                    {"pads", attr_ints(pads4(m, 4))}, {"dilations", attr_ints({m.n(6), m.n(7)})},
                    {"ceil_mode", attr_int(m.n(8))}});
    };
    r["avg_pool2d"] = [](Emit& m) {
      return m.one("AveragePool", {m.in[0]},
                   {{"kernel_shape", attr_ints({m.n(0), m.n(1)})}, {"strides", attr_ints({m.n(2), m.n(3)})},
                    {"pads", attr_ints(pads4(m, 4))}, {"ceil_mode", attr_int(m.n(6))},
                    {"count_include_pad", attr_int(m.n(7))}});
    };
    return r;
  }();
  return r;
}

std::string constant(GraphBuilder& g, const Tensor& t) {
  Attribute a;
  a.kind = Attribute::Kind::Tensor;
  a.t = t.detach().cpu().contiguous().clone();
  return g.node("Constant", {}, {{"value", a}})[0];
}

}  // namespace

Value export_traced(GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
  detail::Trace trace;
  Tensor y;
  {
    detail::TraceScope scope(&trace);
    y = m.forward(x.example);
  }
  ++g_traced_modules;
  const std::string where = prefix.empty() ? std::string("(model)") : prefix.substr(0, prefix.size() - 1);
  std::map<const TensorImpl*, size_t> producer;  // the last entry that wrote each tensor
  for (size_t i = 0; i < trace.entries.size(); ++i) producer[trace.entries[i].output.impl_ptr().get()] = i;
  std::map<const TensorImpl*, std::string> names{{x.example.impl_ptr().get(), x.name}};
  std::map<const TensorImpl*, std::pair<std::string, Tensor>> state;  // added when a node reads them
  for (const auto& [name, t] : m.named_parameters()) state.emplace(t.impl_ptr().get(), std::make_pair(prefix + name, t));
  for (const auto& [name, t] : m.named_buffers()) state.emplace(t.impl_ptr().get(), std::make_pair(prefix + name, t));

  // The entries y depends on, found from y backwards; inputs, weights and constants end the walk.
  std::set<size_t> needed;
  std::vector<const TensorImpl*> pending{y.impl_ptr().get()};
  while (!pending.empty()) {
    const TensorImpl* t = pending.back();
    pending.pop_back();
    auto it = producer.find(t);
    if (names.count(t) != 0 || state.count(t) != 0 || it == producer.end() || !needed.insert(it->second).second) continue;
    for (const Tensor& in : trace.entries[it->second].inputs)
      if (in.defined()) pending.push_back(in.impl_ptr().get());
  }
  for (size_t i : needed) {  // in the order forward ran them
    const TraceEntry& e = trace.entries[i];
    auto rule = rules().find(e.op);
    if (rule == rules().end())
      throw NotImplementedError(detail::cat("export_onnx: tracing '", where, "' (", m.type_name(), ") met the op '", e.op,
                                            "', which has no ONNX form yet"));
    Emit em{g, e, {}};
    for (const Tensor& in : e.inputs) {
      if (!in.defined()) {
        em.in.emplace_back();
        continue;
      }
      const TensorImpl* key = in.impl_ptr().get();
      auto known = names.find(key);
      if (known == names.end()) {
        auto w = state.find(key);
        known = names.emplace(key, w != state.end() ? g.weight(w->second.first, w->second.second) : constant(g, in)).first;
      }
      em.in.push_back(known->second);
    }
    names[e.output.impl_ptr().get()] = rule->second(em);
  }
  auto out = names.find(y.impl_ptr().get());
  if (out == names.end()) return Value{constant(g, y), y};  // forward returned a constant
  return Value{out->second, y};
}

int traced_module_count() { return g_traced_modules; }

void check_traced_export(const Model& model, nn::Module& m, const Tensor& example, const ExportOptions& options) {
  // A second input: one more row when the batch is symbolic, and other values for float input.
  Tensor x = example;
  if (options.dynamic_batch && x.dim() > 0 && x.size(0) > 0) x = concat({x, x.narrow(0, 0, 1)}, 0);
  if (is_floating(x.dtype())) x = x * 1.25 - 0.125;
  const std::string input_desc = detail::cat("an input of shape ", shape_str(x.shape()));
  Tensor want = m.forward(x), got;
  try {
    OnnxModule om(model);
    got = om.forward(x);
  } catch (const Error& e) {
    throw NotImplementedError(detail::cat("export_onnx: the graph traced from ", m.type_name(),
                                          " cannot run on ", input_desc, ": ", e.what()));
  }
  const bool same_shape = got.shape() == want.shape();
  const bool close = same_shape && (is_floating(want.dtype()) ? allclose(got.to(kFloat64), want.to(kFloat64), 1e-3, 1e-4)
                                                              : equal(got.to(want.dtype()), want));
  if (!close)
    throw NotImplementedError(detail::cat(
        "export_onnx: the graph traced from ", m.type_name(), " does not reproduce its forward on ", input_desc,
        same_shape ? "" : detail::cat(" (shape ", shape_str(got.shape()), " instead of ", shape_str(want.shape()), ")"),
        ": forward depends on something tracing records as a constant (a Python or C++ branch on tensor values, a "
        "size used in arithmetic), or on the batch size in a way ONNX cannot express; register a layer exporter "
        "for it (register_layer_exporter) or export with dynamic_batch=false"));
}

}  // namespace braid::onnx
