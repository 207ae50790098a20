// The op registry, the preflight that checks a model against it, and OpContext: what an op
// implementation sees of its node (inputs, attributes with their kinds checked, the executor for
// subgraphs). The executor and OnnxModule are in module.cpp.
#include <algorithm>
#include <set>

#include "braid/onnx/module.h"
#include "braid/ops.h"

namespace braid::onnx {

// ---- OpContext ----

const Tensor& OpContext::input(size_t i) const {
  if (!has_input(i)) fail("input ", i, " is required but missing");
  return inputs_[i];
}

std::vector<int64_t> OpContext::input_ints(size_t i) const {
  const Tensor& t = input(i);
  if (t.dtype() != kInt64 && t.dtype() != kInt32) fail("input ", i, " must be an integer tensor, got ", dtype_name(t.dtype()));
  if (t.dim() > 1) fail("input ", i, " must be 1-d, got shape ", shape_str(t.shape()));
  return t.to_vector<int64_t>();
}

double OpContext::input_scalar(size_t i) const {
  const Tensor& t = input(i);
  if (t.numel() != 1) fail("input ", i, " must hold one value, got shape ", shape_str(t.shape()));
  return t.item();
}

const Attribute& OpContext::attr(const std::string& name) const {
  auto it = node_.attributes.find(name);
  if (it == node_.attributes.end()) fail("attribute '", name, "' is required but missing");
  return it->second;
}

namespace {
const char* kind_name(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::Float: return "float";
    case Attribute::Kind::Int: return "int";
    case Attribute::Kind::String: return "string";
    case Attribute::Kind::Tensor: return "tensor";
    case Attribute::Kind::Graph: return "graph";
    case Attribute::Kind::Floats: return "floats";
    case Attribute::Kind::Ints: return "ints";
    case Attribute::Kind::Strings: return "strings";
    case Attribute::Kind::Tensors: return "tensors";
    case Attribute::Kind::Graphs: return "graphs";
  }
  return "?";
}
}  // namespace

int64_t OpContext::attr_int(const std::string& name, int64_t fallback) const {
  if (!has_attr(name)) return fallback;
  const Attribute& a = attr(name);
  if (a.kind != Attribute::Kind::Int) fail("attribute '", name, "' must be an int, got ", kind_name(a.kind));
  return a.i;
}

double OpContext::attr_float(const std::string& name, double fallback) const {
  if (!has_attr(name)) return fallback;
  const Attribute& a = attr(name);
  if (a.kind == Attribute::Kind::Int) return static_cast<double>(a.i);
  if (a.kind != Attribute::Kind::Float) fail("attribute '", name, "' must be a float, got ", kind_name(a.kind));
  return a.f;
}

std::string OpContext::attr_string(const std::string& name, const std::string& fallback) const {
  if (!has_attr(name)) return fallback;
  const Attribute& a = attr(name);
  if (a.kind != Attribute::Kind::String) fail("attribute '", name, "' must be a string, got ", kind_name(a.kind));
  return a.s;
}

std::vector<int64_t> OpContext::attr_ints(const std::string& name, const std::vector<int64_t>& fallback) const {
  if (!has_attr(name)) return fallback;
  const Attribute& a = attr(name);
  if (a.kind == Attribute::Kind::Int) return {a.i};
  if (a.kind != Attribute::Kind::Ints) fail("attribute '", name, "' must be ints, got ", kind_name(a.kind));
  return a.ints;
}

std::vector<double> OpContext::attr_floats(const std::string& name, const std::vector<double>& fallback) const {
  if (!has_attr(name)) return fallback;
  const Attribute& a = attr(name);
  if (a.kind == Attribute::Kind::Float) return {a.f};
  if (a.kind != Attribute::Kind::Floats) fail("attribute '", name, "' must be floats, got ", kind_name(a.kind));
  return a.floats;
}

// ---- registry ----

OpRegistry& OpRegistry::global() {
  static OpRegistry* r = [] {
    auto* reg = new OpRegistry;
    register_builtin_ops(*reg);
    return reg;
  }();
  return *r;
}

void OpRegistry::add(OpSchema schema) {
  BRAID_CHECK(!schema.op_type.empty() && schema.run, "OpRegistry::add: an op needs a type and a run function");
  if (schema.domain == "ai.onnx") schema.domain.clear();
  auto key = std::make_pair(schema.domain, schema.op_type);
  OpSchema& kept = ops_[key] = std::move(schema);
  if (key.first.empty()) default_domain_[key.second] = &kept;
}

void OpRegistry::index() {
  default_domain_.clear();
  for (const auto& [key, schema] : ops_)
    if (key.first.empty()) default_domain_[key.second] = &schema;
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type) const {
  if (domain.empty() || domain == "ai.onnx") {
    auto it = default_domain_.find(op_type);
    return it == default_domain_.end() ? nullptr : it->second;
  }
  auto it = ops_.find({domain, op_type});
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::op_types(const std::string& domain) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : ops_)
    if (k.first == domain) out.push_back(k.second);
  return out;
}

std::vector<std::string> OpRegistry::domains() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : ops_)
    if (out.empty() || out.back() != k.first) out.push_back(k.first);
  return out;
}

namespace {

void preflight_graph(const Model& m, const Graph& g, const OpRegistry& r, std::vector<std::string>& problems) {
  for (const Node& n : g.nodes) {
    const int64_t opset = m.opset(n.domain);
    const OpSchema* s = r.find(n.domain, n.op_type);
    if (s == nullptr) {
      // An op of another domain (onnxruntime's com.microsoft, a custom one) is named with its
      // domain, and the message says what braid runs of that domain and where the list is.
      std::string where = " (`braid-onnx ops` lists the ops braid runs)";
      if (!n.domain.empty() && n.domain != "ai.onnx") {
        const size_t known = r.op_types(n.domain).size();
        where = known == 0 ? detail::cat(": braid runs no op of domain '", n.domain,
                                         "' (`braid-onnx ops all` lists the domains it runs)")
                           : detail::cat(": braid runs ", known, " op", known == 1 ? "" : "s", " of domain '",
                                         n.domain, "' (`braid-onnx ops ", n.domain, "` lists them)");
      }
      problems.push_back(detail::cat(n.label(), ": op '", n.domain.empty() ? "" : n.domain + ".", n.op_type,
                                     "' is not supported", where));
    } else {
      if (opset < s->since_opset)
        problems.push_back(detail::cat(n.label(), ": opset ", opset, " is not supported (braid implements ",
                                       n.op_type, " from opset ", s->since_opset, ")"));
      if (opset > s->until_opset)
        problems.push_back(detail::cat(n.label(), ": opset ", opset, " redefined ", n.op_type, " and braid implements it ",
                                       "as of opset ", s->until_opset));
      for (const auto& [name, a] : n.attributes)
        if (std::find(s->attributes.begin(), s->attributes.end(), name) == s->attributes.end())
          problems.push_back(detail::cat(n.label(), ": attribute '", name, "' is not supported"));
      if (s->check) {
        std::string why = s->check(n, opset);
        if (!why.empty()) problems.push_back(detail::cat(n.label(), ": ", why));
      }
    }
    for (const auto& [name, a] : n.attributes) {
      if (a.g) preflight_graph(m, *a.g, r, problems);
      for (const auto& sub : a.graphs)
        if (sub) preflight_graph(m, *sub, r, problems);
    }
  }
}

}  // namespace

std::vector<std::string> preflight(const Model& model, const OpRegistry& registry) {
  std::vector<std::string> problems;
  preflight_graph(model, model.graph, registry, problems);
  return problems;
}

}  // namespace braid::onnx
