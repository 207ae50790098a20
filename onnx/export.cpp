// Exporting braid models to ONNX (braid/onnx/export.h): one exporter per layer type in an explicit
// registry; containers export their children in order.
//
// Note [Layer exporters]
// An exporter gets the layer, its state_dict prefix and its input (a value name plus the example
// tensor it holds), adds the nodes of the layer's forward in eval mode, and returns the output
// value, whose example it computes by calling the layer's own forward: so shapes are always known
// and each exporter can be checked against the layer it describes. Weights are added under their
// state_dict names (prefix + "weight"), which is what makes import after export bitwise and
// name-for-name the same model. Exporters read only layers' public API (config(), Note [Layer
// config], and their named parameters and buffers), so the layers carry no ONNX code.
#include "braid/onnx/export.h"

#include <cmath>
#include <mutex>

#include "braid/autograd.h"
#include "braid/conv.h"
#include "braid/nn/attention.h"
#include "braid/nn/layers.h"
#include "braid/nn/recurrent.h"
#include "braid/nn/skip.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "trace_export.h"

namespace braid::onnx {

Attribute attr_int(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::Int;
  a.i = v;
  return a;
}
Attribute attr_float(double v) {
  Attribute a;
  a.kind = Attribute::Kind::Float;
  a.f = v;
  return a;
}
Attribute attr_ints(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::Ints;
  a.ints = std::move(v);
  return a;
}
Attribute attr_string(std::string v) {
  Attribute a;
  a.kind = Attribute::Kind::String;
  a.s = std::move(v);
  return a;
}

std::string GraphBuilder::fresh(const std::string& hint) {
  std::string s = hint;
  s += "_";
  s += std::to_string(counter_++);
  return s;
}

std::string GraphBuilder::weight(const std::string& name, const Tensor& t) {
  if (graph_.initializers.count(name) == 0) graph_.initializers[name] = t.detach();
  return name;
}

// Constants are Constant nodes, not initialisers: initialisers are the model's weights, and
// importing the file must give exactly the exported model's state_dict.
std::string GraphBuilder::ints(const std::vector<int64_t>& values) {
  Attribute a;
  a.kind = Attribute::Kind::Tensor;
  a.t = tensor(values, {static_cast<int64_t>(values.size())});
  return node("Constant", {}, {{"value", a}})[0];
}

std::string GraphBuilder::scalar(double value, DType dtype) {
  Attribute a;
  a.kind = Attribute::Kind::Tensor;
  a.t = scalar_tensor(value, dtype);
  return node("Constant", {}, {{"value", a}})[0];
}

std::vector<std::string> GraphBuilder::node(const std::string& op_type, const std::vector<std::string>& inputs,
                                            std::map<std::string, Attribute> attributes, int n_outputs) {
  Node n;
  n.op_type = op_type;
  n.name = fresh(op_type);
  n.inputs = inputs;
  for (int i = 0; i < n_outputs; ++i) n.outputs.push_back(fresh(op_type + "_out"));
  n.attributes = std::move(attributes);
  graph_.nodes.push_back(n);
  return n.outputs;
}

Value GraphBuilder::node1(const std::string& op_type, const std::vector<std::string>& inputs, const Tensor& example,
                          std::map<std::string, Attribute> attributes) {
  return {node(op_type, inputs, std::move(attributes))[0], example};
}

namespace {

std::map<std::string, LayerExporter>& exporters() {
  static std::map<std::string, LayerExporter> m;
  return m;
}

}  // namespace

void register_layer_exporter(const std::string& type_name, LayerExporter fn) {
  BRAID_CHECK(fn != nullptr, "register_layer_exporter: exporter for '", type_name, "' is null");
  exporters()[type_name] = std::move(fn);
}

namespace {
void register_builtin();
}  // namespace

Value export_layer(GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
  static std::once_flag once;
  std::call_once(once, register_builtin);
  auto it = exporters().find(m.type_name());
  // A module without an exporter (a hand-written forward, in C++ or Python) is traced.
  if (it == exporters().end()) return export_traced(g, m, prefix, x);
  return it->second(g, m, prefix, x);
}

namespace {

/// The example output of m on x (eval mode, no gradients: set by export_model).
Tensor run(nn::Module& m, const Tensor& x) { return m.forward(x); }

Value unary(GraphBuilder& g, nn::Module& m, const Value& x, const char* op, std::map<std::string, Attribute> attrs = {}) {
  return g.node1(op, {x.name}, run(m, x.example), std::move(attrs));
}

/// m's own parameter or buffer called name; undefined when it has none (bias=False).
Tensor own(const nn::Module& m, const std::string& name) {
  for (const auto& list : {m.named_parameters(false), m.named_buffers(false)})
    for (const auto& [n, t] : list)
      if (n == name) return t;
  return Tensor();
}

/// ONNX pads [begin..., end...] from braid's symmetric {h, w}.
std::vector<int64_t> sym_pads(const std::vector<int64_t>& p) {
  std::vector<int64_t> out(p);
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

void register_builtin() {
  auto reg = [](const char* type, LayerExporter f) {
    if (exporters().count(type) == 0) exporters()[type] = std::move(f);
  };
  auto seq = [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    Value v = x;
    for (auto& [name, child] : m.named_children()) v = export_layer(g, *child, prefix + name + ".", v);
    return v;
  };
  reg("Sequential", seq);
  reg("Identity", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) { return unary(g, m, x, "Identity"); });
  reg("Dropout", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) { return unary(g, m, x, "Identity"); });
  reg("ReLU", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) { return unary(g, m, x, "Relu"); });
  reg("Sigmoid", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) { return unary(g, m, x, "Sigmoid"); });
  reg("Tanh", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) { return unary(g, m, x, "Tanh"); });
  reg("LeakyReLU", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    return unary(g, m, x, "LeakyRelu", {{"alpha", attr_float(static_cast<nn::LeakyReLU&>(m).config().negative_slope)}});
  });
  reg("ReLU6", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    const DType t = x.example.dtype();
    return g.node1("Clip", {x.name, g.scalar(0.0, t), g.scalar(6.0, t)}, run(m, x.example));
  });
  reg("SiLU", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    std::string s = g.node("Sigmoid", {x.name})[0];
    return g.node1("Mul", {x.name, s}, run(m, x.example));
  });
  reg("GELU", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    const DType t = x.example.dtype();
    if (static_cast<nn::GELU&>(m).config().approximate == "tanh") {
      // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      std::string x3 = g.node("Mul", {x.name, g.node("Mul", {x.name, x.name})[0]})[0];
      std::string inner = g.node("Add", {x.name, g.node("Mul", {x3, g.scalar(0.044715, t)})[0]})[0];
      std::string th = g.node("Tanh", {g.node("Mul", {inner, g.scalar(std::sqrt(2.0 / M_PI), t)})[0]})[0];
      std::string one_plus = g.node("Add", {th, g.scalar(1.0, t)})[0];
      return g.node1("Mul", {g.node("Mul", {x.name, one_plus})[0], g.scalar(0.5, t)}, run(m, x.example));
    }
    // 0.5 x (1 + erf(x / sqrt(2)))
    std::string e = g.node("Erf", {g.node("Div", {x.name, g.scalar(std::sqrt(2.0), t)})[0]})[0];
    std::string one_plus = g.node("Add", {e, g.scalar(1.0, t)})[0];
    return g.node1("Mul", {g.node("Mul", {x.name, one_plus})[0], g.scalar(0.5, t)}, run(m, x.example));
  });
  reg("Softmax", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    return unary(g, m, x, "Softmax", {{"axis", attr_int(static_cast<nn::Softmax&>(m).config().dim)}});
  });
  reg("Flatten", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    const nn::FlattenConfig c = static_cast<nn::Flatten&>(m).config();
    Tensor y = run(m, x.example);
    const int64_t rank = x.example.dim();
    const int64_t start = c.start_dim < 0 ? c.start_dim + rank : c.start_dim;
    const int64_t end = c.end_dim < 0 ? c.end_dim + rank : c.end_dim;
    if (start == 1 && end == rank - 1) return g.node1("Flatten", {x.name}, y, {{"axis", attr_int(1)}});
    // General case: Reshape with 0 (copy) for the leading axes, -1 for the flattened ones.
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < start; ++d) shape.push_back(0);
    shape.push_back(-1);
    for (int64_t d = end + 1; d < rank; ++d) shape.push_back(x.example.size(d));
    return g.node1("Reshape", {x.name, g.ints(shape)}, y);
  });
  reg("Linear", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    auto& l = static_cast<nn::Linear&>(m);
    Tensor y = run(m, x.example);
    std::string w = g.weight(prefix + "weight", l.weight());
    if (x.example.dim() == 2) {
      std::vector<std::string> in{x.name, w};
      if (l.bias().defined()) in.push_back(g.weight(prefix + "bias", l.bias()));
      return g.node1("Gemm", in, y, {{"transB", attr_int(1)}});
    }
    std::string wt = g.node("Transpose", {w}, {{"perm", attr_ints({1, 0})}})[0];
    if (!l.bias().defined()) return g.node1("MatMul", {x.name, wt}, y);
    std::string mm = g.node("MatMul", {x.name, wt})[0];
    return g.node1("Add", {mm, g.weight(prefix + "bias", l.bias())}, y);
  });
  reg("Conv2d", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::Conv2dConfig c = static_cast<nn::Conv2d&>(m).config();
    const nn::Conv2dOptions& o = c.options;
    std::vector<std::string> in{x.name, g.weight(prefix + "weight", own(m, "weight"))};
    if (o.bias) in.push_back(g.weight(prefix + "bias", own(m, "bias")));
    const std::vector<int64_t> dilation = o.dilation.values();
    std::vector<int64_t> pads;
    if (o.padding.is_same()) {  // {top, bottom, left, right}
      const std::vector<int64_t> p = conv_padding_same(c.kernel_size, dilation);
      pads = {p[0], p[2], p[1], p[3]};
    } else {
      pads = sym_pads(o.padding.sizes().values());
    }
    return g.node1("Conv", in, run(m, x.example),
                   {{"kernel_shape", attr_ints(c.kernel_size)}, {"strides", attr_ints(o.stride.values())},
                    {"pads", attr_ints(pads)}, {"dilations", attr_ints(dilation)}, {"group", attr_int(o.groups)}});
  });
  reg("Conv1d", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::Conv1dConfig c = static_cast<nn::Conv1d&>(m).config();
    const nn::Conv1dOptions& o = c.options;
    std::vector<std::string> in{x.name, g.weight(prefix + "weight", own(m, "weight"))};
    if (o.bias) in.push_back(g.weight(prefix + "bias", own(m, "bias")));
    const std::vector<int64_t> pads = o.padding.is_same() ? conv_padding_same({c.kernel_size}, {o.dilation})
                                                          : sym_pads(o.padding.sizes().values());
    return g.node1("Conv", in, run(m, x.example),
                   {{"kernel_shape", attr_ints({c.kernel_size})}, {"strides", attr_ints({o.stride})},
                    {"pads", attr_ints(pads)}, {"dilations", attr_ints({o.dilation})}, {"group", attr_int(o.groups)}});
  });
  reg("ConvTranspose2d", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::ConvTranspose2dConfig c = static_cast<nn::ConvTranspose2d&>(m).config();
    const nn::ConvTranspose2dOptions& o = c.options;
    std::vector<std::string> in{x.name, g.weight(prefix + "weight", own(m, "weight"))};
    if (o.bias) in.push_back(g.weight(prefix + "bias", own(m, "bias")));
    return g.node1("ConvTranspose", in, run(m, x.example),
                   {{"kernel_shape", attr_ints(c.kernel_size)}, {"strides", attr_ints(o.stride.values())},
                    {"pads", attr_ints(sym_pads(o.padding.values()))}, {"output_padding", attr_ints(o.output_padding.values())},
                    {"dilations", attr_ints(o.dilation.values())}, {"group", attr_int(o.groups)}});
  });
  reg("MaxPool2d", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    const nn::MaxPool2dConfig c = static_cast<nn::MaxPool2d&>(m).config();
    return g.node1("MaxPool", {x.name}, run(m, x.example),
                   {{"kernel_shape", attr_ints(c.kernel_size)}, {"strides", attr_ints(c.options.stride.values())},
                    {"pads", attr_ints(sym_pads(c.options.padding.values()))},
                    {"dilations", attr_ints(c.options.dilation.values())}, {"ceil_mode", attr_int(c.options.ceil_mode ? 1 : 0)}});
  });
  reg("AvgPool2d", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    const nn::AvgPool2dConfig c = static_cast<nn::AvgPool2d&>(m).config();
    return g.node1("AveragePool", {x.name}, run(m, x.example),
                   {{"kernel_shape", attr_ints(c.kernel_size)}, {"strides", attr_ints(c.options.stride.values())},
                    {"pads", attr_ints(sym_pads(c.options.padding.values()))}, {"ceil_mode", attr_int(c.options.ceil_mode ? 1 : 0)},
                    {"count_include_pad", attr_int(c.options.count_include_pad ? 1 : 0)}});
  });
  reg("AdaptiveAvgPool2d", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    Tensor y = run(m, x.example);
    const int64_t h = x.example.size(-2), w = x.example.size(-1);
    const int64_t oh = y.size(-2), ow = y.size(-1);
    if (oh == 1 && ow == 1) return g.node1("GlobalAveragePool", {x.name}, y);
    if (h % oh != 0 || w % ow != 0)
      throw NotImplementedError(detail::cat("export_onnx: AdaptiveAvgPool2d from ", h, "x", w, " to ", oh, "x", ow,
                                            " (sizes that do not divide) has no ONNX equivalent"));
    return g.node1("AveragePool", {x.name}, y, {{"kernel_shape", attr_ints({h / oh, w / ow})}, {"strides", attr_ints({h / oh, w / ow})}});
  });
  auto batch_norm = [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::BatchNormConfig cfg = static_cast<nn::BatchNorm&>(m).config();
    const int64_t c = cfg.num_features;
    const bool affine = cfg.options.affine;
    const DType t = x.example.dtype();
    std::string w = g.weight(prefix + "weight", affine ? own(m, "weight") : ones({c}, t));
    std::string b = g.weight(prefix + "bias", affine ? own(m, "bias") : zeros({c}, t));
    if (!cfg.options.track_running_stats)
      throw NotImplementedError(detail::cat("export_onnx: ", m.type_name(), " '", prefix,
                                            "' without running statistics uses batch statistics in eval mode, which ONNX inference cannot express"));
    std::string mean_name = g.weight(prefix + "running_mean", own(m, "running_mean"));
    std::string var_name = g.weight(prefix + "running_var", own(m, "running_var"));
    g.weight(prefix + "num_batches_tracked", own(m, "num_batches_tracked"));
    return g.node1("BatchNormalization", {x.name, w, b, mean_name, var_name}, run(m, x.example),
                   {{"epsilon", attr_float(cfg.options.eps)}});
  };
  reg("BatchNorm1d", batch_norm);
  reg("BatchNorm2d", batch_norm);
  reg("LayerNorm", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::LayerNormConfig c = static_cast<nn::LayerNorm&>(m).config();
    const DType t = x.example.dtype();
    const bool affine = c.elementwise_affine;
    std::string w = g.weight(prefix + "weight", affine ? own(m, "weight") : ones(c.normalized_shape, t));
    std::vector<std::string> in{x.name, w};
    if (affine && own(m, "bias").defined()) in.push_back(g.weight(prefix + "bias", own(m, "bias")));
    return g.node1("LayerNormalization", in, run(m, x.example),
                   {{"axis", attr_int(-static_cast<int64_t>(c.normalized_shape.size()))}, {"epsilon", attr_float(c.eps)}});
  });
  reg("GroupNorm", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    // (N, C, ...) -> (N, G, -1), normalised over the last axis, back, then the per-channel affine.
    const nn::GroupNormConfig c = static_cast<nn::GroupNorm&>(m).config();
    const DType t = x.example.dtype();
    std::string r = g.node("Reshape", {x.name, g.ints({0, c.num_groups, -1})})[0];
    std::string mean_ = g.node("ReduceMean", {r}, {{"axes", attr_ints({2})}, {"keepdims", attr_int(1)}})[0];
    std::string centered = g.node("Sub", {r, mean_})[0];
    std::string var_ = g.node("ReduceMean", {g.node("Mul", {centered, centered})[0]}, {{"axes", attr_ints({2})}, {"keepdims", attr_int(1)}})[0];
    std::string denom = g.node("Sqrt", {g.node("Add", {var_, g.scalar(c.eps, t)})[0]})[0];
    std::string normed = g.node("Div", {centered, denom})[0];
    std::string shape = g.node("Shape", {x.name})[0];
    std::string back = g.node("Reshape", {normed, shape})[0];
    Tensor y = run(m, x.example);
    if (!c.affine) return Value{back, y};
    std::vector<int64_t> cs(static_cast<size_t>(x.example.dim() - 1), 1);
    cs[0] = c.num_channels;
    std::string w = g.node("Reshape", {g.weight(prefix + "weight", own(m, "weight")), g.ints(cs)})[0];
    std::string b = g.node("Reshape", {g.weight(prefix + "bias", own(m, "bias")), g.ints(cs)})[0];
    return g.node1("Add", {g.node("Mul", {back, w})[0], b}, y);
  });
  reg("Embedding", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    auto& l = static_cast<nn::Embedding&>(m);
    return g.node1("Gather", {g.weight(prefix + "weight", l.weight()), x.name}, run(m, x.example), {{"axis", attr_int(0)}});
  });
  reg("Residual", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    bool has_shortcut = false;
    for (const auto& [name, child] : m.named_children()) has_shortcut = has_shortcut || name == "shortcut";
    Value body = export_layer(g, *m.child("body"), prefix + "body.", x);
    Value sc = has_shortcut ? export_layer(g, *m.child("shortcut"), prefix + "shortcut.", x) : x;
    return g.node1("Add", {body.name, sc.name}, body.example + sc.example);
  });
  reg("SkipStash", [](GraphBuilder& g, nn::Module& m, const std::string&, const Value& x) {
    g.skips()[static_cast<nn::SkipStash&>(m).name()] = x;
    return x;
  });
  auto pop = [](GraphBuilder& g, const std::string& name, const std::string& prefix) {
    auto it = g.skips().find(name);
    if (it == g.skips().end())
      throw ValueError(detail::cat("export_onnx: layer '", prefix, "' uses skip '", name, "', which nothing stashed before it"));
    Value v = it->second;
    g.skips().erase(it);
    return v;
  };
  reg("SkipAdd", [pop](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    Value s = pop(g, static_cast<nn::SkipAdd&>(m).name(), prefix);
    return g.node1("Add", {x.name, s.name}, x.example + s.example);
  });
  reg("SkipConcat", [pop](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::SkipConcatConfig c = static_cast<nn::SkipConcat&>(m).config();
    Value s = pop(g, c.name, prefix);
    return g.node1("Concat", {x.name, s.name}, concat({x.example, s.example}, c.dim), {{"axis", attr_int(c.dim)}});
  });
  // Self-attention without masks (what forward(x) computes), as MatMul/Split/Reshape/Transpose/
  // Softmax; q is scaled before the product, as braid's MultiheadAttention does.
  reg("MultiheadAttention", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::MultiheadAttentionConfig c = static_cast<nn::MultiheadAttention&>(m).config();
    const bool batch_first = c.options.batch_first;
    const int64_t e = c.embed_dim, h = c.num_heads, d = e / h;
    if (x.example.dim() != 3)
      throw NotImplementedError(detail::cat("export_onnx: MultiheadAttention '", prefix, "' with an unbatched input"));
    const DType t = x.example.dtype();
    std::string in = x.name;
    if (!batch_first) in = g.node("Transpose", {in}, {{"perm", attr_ints({1, 0, 2})}})[0];
    std::string wt = g.node("Transpose", {g.weight(prefix + "in_proj_weight", own(m, "in_proj_weight"))}, {{"perm", attr_ints({1, 0})}})[0];
    std::string qkv = g.node("MatMul", {in, wt})[0];
    if (c.options.bias) qkv = g.node("Add", {qkv, g.weight(prefix + "in_proj_bias", own(m, "in_proj_bias"))})[0];
    std::vector<std::string> parts = g.node("Split", {qkv, g.ints({e, e, e})}, {{"axis", attr_int(-1)}}, 3);
    auto heads = [&](const std::string& v) {
      std::string r = g.node("Reshape", {v, g.ints({0, 0, h, d})})[0];
      return g.node("Transpose", {r}, {{"perm", attr_ints({0, 2, 1, 3})}})[0];  // (N, H, L, D)
    };
    std::string q = g.node("Mul", {heads(parts[0]), g.scalar(1.0 / std::sqrt(static_cast<double>(d)), t)})[0];
    std::string kt = g.node("Transpose", {heads(parts[1])}, {{"perm", attr_ints({0, 1, 3, 2})}})[0];
    std::string p = g.node("Softmax", {g.node("MatMul", {q, kt})[0]}, {{"axis", attr_int(-1)}})[0];
    std::string o = g.node("MatMul", {p, heads(parts[2])})[0];
    o = g.node("Transpose", {o}, {{"perm", attr_ints({0, 2, 1, 3})}})[0];
    o = g.node("Reshape", {o, g.ints({0, 0, e})})[0];
    Tensor y = run(m, x.example);
    // Examples carry shapes (and dtypes) for the exporters downstream; values are not needed here.
    const Shape& xs = x.example.shape();
    Tensor o_example = zeros(batch_first ? xs : Shape{xs[1], xs[0], xs[2]}, t, x.example.device());
    Value proj = export_layer(g, *m.child("out_proj"), prefix + "out_proj.", Value{o, o_example});
    if (batch_first) return Value{proj.name, y};
    return g.node1("Transpose", {proj.name}, y, {{"perm", attr_ints({1, 0, 2})}});
  });
  reg("TransformerEncoderLayer", [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::TransformerEncoderLayerOptions& o = static_cast<nn::TransformerEncoderLayer&>(m).config().options;
    auto sub = [&](const char* name, const Value& v) { return export_layer(g, *m.child(name), prefix + name + ".", v); };
    auto add = [&](const Value& a, const Value& b) { return g.node1("Add", {a.name, b.name}, a.example + b.example); };
    auto ff = [&](const Value& v) {
      Value hdn = sub("linear1", v);
      hdn = o.activation == "relu" ? Value{g.node("Relu", {hdn.name})[0], relu(hdn.example)} : [&] {
        nn::GELU gelu;
        return export_layer(g, gelu, prefix, hdn);
      }();
      return sub("linear2", hdn);
    };
    Value out;
    if (o.norm_first) {
      Value a = add(x, sub("self_attn", sub("norm1", x)));
      out = add(a, ff(sub("norm2", a)));
    } else {
      Value a = sub("norm1", add(x, sub("self_attn", x)));
      out = sub("norm2", add(a, ff(a)));
    }
    return Value{out.name, run(m, x.example)};
  });
  // LSTM and GRU as ONNX's LSTM/GRU ops, one per layer. The initialisers are braid's own
  // (weight_ih_l0, ...: bitwise round trip); the ONNX gate order (LSTM i, o, f, c; GRU z, r, h)
  // and the stacked W/R/B are built from them by Split/Concat nodes.
  auto rnn = [](GraphBuilder& g, nn::Module& m, const std::string& prefix, const Value& x) {
    const nn::RNNConfig c = static_cast<nn::RNNBase&>(m).config();
    const nn::RNNOptions& o = c.options;
    const bool lstm = m.type_name() == "LSTM";
    const int64_t hs = c.hidden_size, gates = lstm ? 4 : 3, dirs = o.bidirectional ? 2 : 1;
    // PyTorch's gate rows -> ONNX's: LSTM (i, f, g, o) -> (i, o, f, g); GRU (r, z, n) -> (z, r, n).
    const std::vector<int> order = lstm ? std::vector<int>{0, 3, 1, 2} : std::vector<int>{1, 0, 2};
    if (x.example.dim() != 3)
      throw NotImplementedError(detail::cat("export_onnx: ", m.type_name(), " '", prefix, "' with an unbatched input"));
    auto reorder = [&](const std::string& w) {
      std::vector<std::string> parts = g.node("Split", {w, g.ints(std::vector<int64_t>(static_cast<size_t>(gates), hs))},
                                              {{"axis", attr_int(0)}}, static_cast<int>(gates));
      std::vector<std::string> in;
      for (int k : order) in.push_back(parts[static_cast<size_t>(k)]);
      return g.node("Concat", in, {{"axis", attr_int(0)}})[0];
    };
    auto stack_dirs = [&](const std::vector<std::string>& per_dir) {
      std::vector<std::string> u;
      for (const auto& v : per_dir) u.push_back(g.node("Unsqueeze", {v, g.ints({0})})[0]);
      return u.size() == 1 ? u[0] : g.node("Concat", u, {{"axis", attr_int(0)}})[0];
    };
    std::string seq = x.name;
    if (o.batch_first) seq = g.node("Transpose", {seq}, {{"perm", attr_ints({1, 0, 2})}})[0];
    for (int64_t layer = 0; layer < o.num_layers; ++layer) {
      std::vector<std::string> w, r, b;
      for (int64_t d = 0; d < dirs; ++d) {
        std::string sfx = detail::cat("_l", layer, d == 1 ? "_reverse" : "");
        auto param = [&](const char* name) { return g.weight(prefix + name + sfx, own(m, name + sfx)); };
        w.push_back(reorder(param("weight_ih")));
        r.push_back(reorder(param("weight_hh")));
        if (o.bias)
          b.push_back(g.node("Concat", {reorder(param("bias_ih")), reorder(param("bias_hh"))},
                             {{"axis", attr_int(0)}})[0]);
      }
      std::vector<std::string> in{seq, stack_dirs(w), stack_dirs(r)};
      if (o.bias) in.push_back(stack_dirs(b));
      std::map<std::string, Attribute> attrs{{"hidden_size", attr_int(hs)},
                                             {"direction", attr_string(dirs == 2 ? "bidirectional" : "forward")}};
      if (!lstm) attrs["linear_before_reset"] = attr_int(1);
      std::string y = g.node(lstm ? "LSTM" : "GRU", in, attrs)[0];                  // (L, D, N, H)
      y = g.node("Transpose", {y}, {{"perm", attr_ints({0, 2, 1, 3})}})[0];       // (L, N, D, H)
      seq = g.node("Reshape", {y, g.ints({0, 0, -1})})[0];                          // (L, N, D * H)
    }
    Tensor out = run(m, x.example);
    if (o.batch_first) return g.node1("Transpose", {seq}, out, {{"perm", attr_ints({1, 0, 2})}});
    return Value{seq, out};
  };
  reg("LSTM", rnn);
  reg("GRU", rnn);
  reg("OnnxModule", [](GraphBuilder&, nn::Module&, const std::string& prefix, const Value&) -> Value {
    throw NotImplementedError(detail::cat("export_onnx: an imported model ('", prefix,
                                          "') inside another model is not exported yet; export it on its own"));
  });
}

}  // namespace

namespace {

ValueInfo value_info(const std::string& name, const Tensor& t, bool dynamic_batch) {
  ValueInfo v;
  v.name = name;
  v.dtype = t.dtype();
  v.has_type = true;
  v.has_shape = true;
  for (int64_t d = 0; d < t.dim(); ++d) {
    Dim dim;
    if (d == 0 && dynamic_batch) dim.symbol = "batch";
    else dim.size = t.size(d);
    v.shape.push_back(dim);
  }
  return v;
}

/// An imported model's own graph with its current weights.
Model onnx_module_model(OnnxModule& m) {
  Model out = m.model();
  for (const auto& [name, t] : m.weights()) out.graph.initializers[name] = t.detach();
  out.producer_name = "braid";
  return out;
}

}  // namespace

Model export_model(nn::Module& m, const Tensor& example, const ExportOptions& options) {
  if (auto* om = dynamic_cast<OnnxModule*>(&m)) return onnx_module_model(*om);
  BRAID_CHECK(example.defined(), "export_onnx: the example input is undefined");
  const bool was_training = m.is_training();
  m.eval();
  NoGradGuard no_grad;
  GraphBuilder g(options.opset);
  const int traced_before = traced_module_count();
  Value out;
  try {
    out = export_layer(g, m, "", Value{options.input_name, example});
  } catch (...) {
    m.train(was_training);
    throw;
  }
  Model model;
  model.ir_version = 8;
  model.opsets[""] = options.opset;
  model.producer_name = "braid";
  model.graph.name = m.type_name();
  model.graph.inputs.push_back(value_info(options.input_name, example, options.dynamic_batch));
  // The output must be a node's output with the requested name: rename the last value.
  if (out.name == options.input_name || g.graph().initializers.count(out.name) != 0) {
    out = g.node1("Identity", {out.name}, out.example);
  }
  for (Node& n : g.graph().nodes)
    for (std::string& o : n.outputs)
      if (o == out.name) o = options.output_name;
  for (Node& n : g.graph().nodes)
    for (std::string& i : n.inputs)
      if (i == out.name) i = options.output_name;
  model.graph.nodes = std::move(g.graph().nodes);
  model.graph.initializers = std::move(g.graph().initializers);
  model.graph.outputs.push_back(value_info(options.output_name, out.example, options.dynamic_batch));
  try {
    if (traced_module_count() != traced_before) check_traced_export(model, m, example, options);
  } catch (...) {
    m.train(was_training);
    throw;
  }
  m.train(was_training);
  return model;
}

void export_onnx(nn::Module& m, const Tensor& example, const std::string& path, const ExportOptions& options) {
  Model model = export_model(m, example, options);
  save_model(model, path);
}

}  // namespace braid::onnx
