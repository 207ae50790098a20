// OnnxModule: an imported ONNX graph run as braid ops (braid/onnx/module.h).
//
// Note [Executing an ONNX graph]
// The loader has already put the nodes in a topological order, so running a graph is one pass:
// a scope maps value names to tensors (initialisers, the caller's inputs, then each node's outputs);
// a node's implementation is looked up once per node in the OpRegistry and called with its inputs.
// Subgraphs (If branches, Loop bodies) run in a child scope that sees the enclosing scopes' values.
// Initialisers are the module's parameter and buffer tensors themselves, so an optimizer step on
// the parameters changes what the next run computes, and gradients flow to them through autograd.
// A failure inside an op is rethrown with the same type, prefixed with the model's file and the
// node ("model.onnx: Conv 'conv1': ..."), so a user knows where in the graph it happened.
#include "braid/onnx/module.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::onnx {

// ---- execution ----

struct Scope {
  const Scope* parent = nullptr;
  std::map<std::string, Tensor> values;
  const Tensor* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->values.find(name);
      if (it != s->values.end()) return &it->second;
    }
    return nullptr;
  }
};

/// What OnnxModule precomputes about its top-level graph (see make_plan).
struct ExecPlan {
  std::vector<std::vector<std::string>> release_after;  // values whose last use is node i
  std::map<size_t, size_t> conv_bn;                     // Conv node -> the BatchNormalization it feeds
};

class Executor {
 public:
  Executor(const Model& m, const OpRegistry& r, bool training, std::map<std::string, OnnxModule::OpTime>* profile)
      : model_(m), registry_(r), training_(training), profile_(profile) {}

  /// Runs g's nodes in scope; returns g's outputs. With a plan (the top-level graph), values are
  /// released after their last use and, in inference, Conv+BatchNormalization pairs run folded.
  std::vector<Tensor> run_graph(const Graph& g, Scope& scope, const ExecPlan* plan = nullptr) {
    const bool fold = plan != nullptr && !training_ && !is_grad_enabled();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (fold) {
        auto it = plan->conv_bn.find(i);
        if (it != plan->conv_bn.end()) {
          if (run_folded(g.nodes[i], g.nodes[it->second], scope)) {
            skip_.insert(it->second);
            release(plan, i, scope);
            continue;
          }
        }
        if (skip_.count(i) != 0) {
          release(plan, i, scope);
          continue;
        }
      }
      run_node(g.nodes[i], scope);
      release(plan, i, scope);
    }
    std::vector<Tensor> out;
    for (const ValueInfo& o : g.outputs) {
      const Tensor* t = scope.find(o.name);
      if (t == nullptr || !t->defined())
        throw ValueError(detail::cat(model_.path, ": graph output '", o.name, "' was not computed"));
      out.push_back(*t);
    }
    return out;
  }

  std::vector<Tensor> run_subgraph(const Graph& g, const std::vector<Tensor>& inputs) {
    BRAID_CHECK(inputs.size() <= g.inputs.size(), model_.path, ": subgraph '", g.name, "' takes ", g.inputs.size(),
                " inputs, got ", inputs.size());
    Scope scope;
    scope.parent = current_;
    for (const auto& [name, t] : g.initializers) scope.values[name] = t;
    for (size_t i = 0; i < inputs.size(); ++i) scope.values[g.inputs[i].name] = inputs[i];
    const Scope* saved = current_;
    current_ = &scope;
    try {
      auto out = run_graph(g, scope);
      current_ = saved;
      return out;
    } catch (...) {
      current_ = saved;
      throw;
    }
  }

  void set_current(const Scope* s) { current_ = s; }
  /// Where the graph runs: the device of the caller's inputs (Note [Graph values on the device]).
  void set_device(Device d) { device_ = d; }
  Device device() const { return device_; }

 private:
  void release(const ExecPlan* plan, size_t i, Scope& scope) {
    if (plan == nullptr) return;
    for (const std::string& name : plan->release_after[i]) scope.values.erase(name);
  }

  // Note [Folding BatchNormalization into Conv]
  // In inference (eval mode, no gradients) y = BN(conv(x, W, b)) is one convolution with
  // W' = W s and b' = (b - mean) s + beta per output channel, s = gamma / sqrt(var + eps): one pass
  // over the activations instead of three. The folded weights are computed from the current
  // parameters on every run (their size is the weights', not the activations'), so fine-tuning and
  // load_state_dict need no invalidation; training runs the graph as written.
  bool run_folded(const Node& conv, const Node& bn, Scope& scope) {
    auto get = [&](const std::string& name) {
      const Tensor* t = scope.find(name);
      return t == nullptr ? Tensor() : *t;
    };
    Tensor x = get(conv.inputs[0]), w = get(conv.inputs[1]);
    Tensor b = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? get(conv.inputs[2]) : Tensor();
    Tensor gamma = get(bn.inputs[1]), beta = get(bn.inputs[2]), mean_ = get(bn.inputs[3]), var_ = get(bn.inputs[4]);
    for (const Tensor* t : {&x, &w, &gamma, &beta, &mean_, &var_})
      if (!t->defined() || (t->dtype() != kFloat32 && t->dtype() != kFloat64)) return false;
    if (w.dim() < 3 || gamma.numel() != w.size(0)) return false;
    const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    auto eps_it = bn.attributes.find("epsilon");
    const double eps = eps_it == bn.attributes.end() ? 1e-5 : eps_it->second.f;
    Tensor scale = gamma * rsqrt(var_ + eps);
    Shape ws(static_cast<size_t>(w.dim()), 1);
    ws[0] = w.size(0);
    Tensor w2 = w * reshape(scale, ws);
    Tensor b2 = ((b.defined() ? b : zeros_like(mean_)) - mean_) * scale + beta;
    const OpSchema* s = registry_.find(conv.domain, conv.op_type);
    std::vector<Tensor> outputs;
    try {
      OpContext ctx(conv, model_.opset(conv.domain), training_, {x, w2, b2}, this);
      outputs = s->run(ctx);
    } catch (const Error& e) {
      throw ValueError(detail::cat(model_.path, ": ", conv.label(), " (folded with ", bn.label(), "): ", e.what()));
    }
    scope.values[bn.outputs[0]] = outputs.at(0);
    if (profile_ != nullptr) {
      auto& slot = (*profile_)["Conv+BatchNormalization"];
      slot.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      slot.calls++;
    }
    return true;
  }

  template <typename E>
  [[noreturn]] void rethrow_as(const E& e, const Node& n) {
    throw E(detail::cat(model_.path, ": ", n.label(), ": ", e.what()));
  }

  void run_node(const Node& n, Scope& scope) {
    const OpSchema* s = registry_.find(n.domain, n.op_type);
    if (s == nullptr)
      throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": op '", n.op_type, "' is not supported"));
    std::vector<Tensor> inputs;
    inputs.reserve(n.inputs.size());
    DType half = kFloat32;
    bool has_half = false;
    for (const std::string& name : n.inputs) {
      if (name.empty()) {
        inputs.emplace_back();
        continue;
      }
      const Tensor* t = scope.find(name);
      if (t == nullptr)
        throw ValueError(detail::cat(model_.path, ": ", n.label(), ": input '", name, "' has no value"));
      Tensor v = *t;
      if (s->half_via_float && v.defined() && (v.dtype() == kFloat16 || v.dtype() == kBFloat16)) {
        has_half = true;
        half = v.dtype();
        v = cast(v, kFloat32);
      }
      if (v.defined() && v.device() != device_) v = v.to(device_);
      inputs.push_back(std::move(v));
    }
    std::vector<Tensor> outputs;
    const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const Scope* saved = current_;
    current_ = &scope;
    try {
      OpContext ctx(n, model_.opset(n.domain), training_, std::move(inputs), this);
      outputs = s->run(ctx);
    } catch (const NotImplementedError& e) {
      current_ = saved;
      rethrow_as(e, n);
    } catch (const IndexError& e) {
      current_ = saved;
      rethrow_as(e, n);
    } catch (const TypeError& e) {
      current_ = saved;
      rethrow_as(e, n);
    } catch (const ValueError& e) {
      current_ = saved;
      rethrow_as(e, n);
    } catch (const DistributedError&) {
      current_ = saved;
      throw;
    } catch (const Error& e) {
      current_ = saved;
      rethrow_as(e, n);
    }
    current_ = saved;
    if (profile_ != nullptr) {
      auto& slot = (*profile_)[n.op_type];
      slot.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      slot.calls++;
    }
    if (outputs.size() < n.outputs.size()) {
      // Trailing optional outputs may be left undefined only if nobody asked for them.
      for (size_t i = outputs.size(); i < n.outputs.size(); ++i)
        if (!n.outputs[i].empty())
          throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": output ", i, " ('", n.outputs[i],
                                                "') is not produced by braid's ", n.op_type));
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i].empty()) continue;
      Tensor t = outputs[i];
      if (!t.defined())
        throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": output ", i, " ('", n.outputs[i],
                                              "') is not produced by braid's ", n.op_type));
      if (has_half && is_floating(t.dtype()) && t.dtype() != half) t = cast(t, half);
      // Note [Graph values on the device]
      // Values an op makes from attributes or from the host (Constant, Shape, ConstantOfShape, index
      // lists) start on the CPU; every value the graph hands on lives on the device the caller's
      // inputs are on, as onnxruntime places initialisers and constants on its execution provider.
      if (t.device() != device_) t = t.to(device_);
      scope.values[n.outputs[i]] = std::move(t);
    }
  }

  const Model& model_;
  const OpRegistry& registry_;
  bool training_;
  Device device_;
  const Scope* current_ = nullptr;
  std::map<std::string, OnnxModule::OpTime>* profile_;
  std::set<size_t> skip_;  // BatchNormalization nodes folded into their Conv in this run
};

Device OpContext::device() const {
  if (executor_ != nullptr) return executor_->device();
  for (const Tensor& t : inputs_)
    if (t.defined()) return t.device();
  return Device::cpu();
}

std::vector<Tensor> OpContext::run_subgraph(const Graph& g, const std::vector<Tensor>& inputs) {
  BRAID_ASSERT(executor_ != nullptr);
  return executor_->run_subgraph(g, inputs);
}

// ---- OnnxModule ----

namespace {

/// Holds the parameters and buffers under one dotted prefix ("layer1.0" in "layer1.0.conv1.weight").
class WeightGroup : public nn::Module {
 public:
  WeightGroup() : Module("OnnxWeights") {}
  Tensor forward(const Tensor&) override {
    throw TypeError("OnnxWeights holds an ONNX model's weights and does not run on its own");
  }
  Tensor add_weight(const std::string& name, const Tensor& t, bool parameter, bool requires_grad) {
    return parameter ? register_parameter(name, t, requires_grad) : register_buffer(name, t);
  }
  std::shared_ptr<WeightGroup> group(const std::string& name) {
    for (const auto& [n, m] : named_children())
      if (n == name) return std::dynamic_pointer_cast<WeightGroup>(m);
    return register_module(name, std::make_shared<WeightGroup>());
  }
};

/// Inputs 3 and 4 of BatchNormalization (running mean and variance) are state, not parameters.
std::set<std::string> statistics_inputs(const Graph& g) {
  std::set<std::string> out;
  for (const Node& n : g.nodes)
    if (n.op_type == "BatchNormalization" && n.domain.empty())
      for (size_t i = 3; i < n.inputs.size() && i < 5; ++i) out.insert(n.inputs[i]);
  return out;
}

/// Note [Constants as weights]
/// Some exporters (PaddlePaddle's) store every weight as a Constant node instead of an
/// initialiser. Fine-tuning needs them as parameters, so floating-point Constant tensors with more
/// than one element become initialisers named after the node's output (scalars such as HardSwish's
/// 1/6 stay constants).
void lift_constants(Graph& g) {
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    auto it = n.attributes.find("value");
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 && it != n.attributes.end() &&
        it->second.kind == Attribute::Kind::Tensor && it->second.t.defined() && is_floating(it->second.t.dtype()) &&
        it->second.t.numel() > 1 && g.initializers.count(n.outputs[0]) == 0) {
      g.initializers[n.outputs[0]] = it->second.t;
      continue;
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

/// Every value name a node reads, its subgraphs' reads of outer values included.
void collect_reads(const Node& n, std::set<std::string>& out) {
  for (const auto& i : n.inputs)
    if (!i.empty()) out.insert(i);
  for (const auto& [name, a] : n.attributes) {
    std::vector<std::shared_ptr<Graph>> subs = a.graphs;
    if (a.g) subs.push_back(a.g);
    for (const auto& g : subs)
      for (const Node& m : g->nodes) collect_reads(m, out);
  }
}

}  // namespace

std::shared_ptr<ExecPlan> make_plan(const Graph& g, const std::map<std::string, Tensor>& weights) {
  auto plan = std::make_shared<ExecPlan>();
  const size_t n = g.nodes.size();
  plan->release_after.resize(n);
  std::set<std::string> keep;
  for (const auto& o : g.outputs) keep.insert(o.name);
  std::map<std::string, size_t> last_use, uses;
  std::vector<std::set<std::string>> reads(n);
  for (size_t i = 0; i < n; ++i) {
    collect_reads(g.nodes[i], reads[i]);
    for (const auto& r : reads[i]) {
      last_use[r] = i;
      uses[r]++;
    }
  }
  for (const auto& [name, i] : last_use)
    if (keep.count(name) == 0 && weights.count(name) == 0) plan->release_after[i].push_back(name);
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = i;
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
    if (uses[bn.inputs[0]] != 1 || keep.count(bn.inputs[0]) != 0) continue;
    plan->conv_bn[p->second] = i;
  }
  return plan;
}

// Note [ONNX weight names]
// state_dict() names of an imported model are the initialisers' names, so a checkpoint or an
// exported file reads naturally ("layer1.0.conv1.weight"). Module names cannot contain '.', so a
// dotted name is stored as a path of WeightGroup children. A name that cannot be a path (an empty
// component such as "a..b", or "a" that is both a weight and a prefix of "a.b") is stored flat
// with its dots replaced by '_' (and a numeric suffix on a clash); the ONNX name is kept for export.
OnnxModule::OnnxModule(Model model, const OnnxOptions& options)
    : Module("OnnxModule"), model_(std::move(model)),
      registry_(options.registry != nullptr ? options.registry : &OpRegistry::global()) {
  std::vector<std::string> problems = preflight(model_, *registry_);
  if (!problems.empty()) {
    std::string msg = detail::cat(model_.path, ": ", problems.size(), " unsupported op",
                                  problems.size() == 1 ? "" : "s", "/attribute", problems.size() == 1 ? "" : "s",
                                  " (nothing was run):");
    for (const std::string& p : problems) {
      msg += "\n  ";
      msg += p;
    }
    throw NotImplementedError(msg);
  }
  if (options.constants_as_weights) lift_constants(model_.graph);
  const std::set<std::string> stats = statistics_inputs(model_.graph);
  auto root = std::make_shared<WeightGroup>();
  std::set<std::string> leaf_paths, prefix_paths;
  for (const auto& [name, t] : model_.graph.initializers) {
    for (size_t p = name.find('.'); p != std::string::npos; p = name.find('.', p + 1)) prefix_paths.insert(name.substr(0, p));
  }
  std::set<std::string> used_flat;
  for (const auto& [name, t0] : model_.graph.initializers) {
    const bool parameter = is_floating(t0.dtype()) && stats.count(name) == 0;
    Tensor t = t0;
    std::vector<std::string> parts;
    size_t start = 0;
    bool path_ok = prefix_paths.count(name) == 0;
    while (true) {
      size_t p = name.find('.', start);
      parts.push_back(name.substr(start, p == std::string::npos ? std::string::npos : p - start));
      if (parts.back().empty()) path_ok = false;
      if (p == std::string::npos) break;
      start = p + 1;
    }
    WeightGroup* g = root.get();
    std::shared_ptr<WeightGroup> keep;
    std::string leaf = parts.back();
    if (path_ok && parts.size() > 1) {
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        keep = g->group(parts[i]);
        if (!keep) {
          path_ok = false;
          break;
        }
        g = keep.get();
      }
    }
    if (!path_ok) {
      g = root.get();
      leaf = name;
      std::replace(leaf.begin(), leaf.end(), '.', '_');
      if (leaf.empty()) leaf.push_back('_');
      std::string base = leaf;
      for (int k = 1; used_flat.count(leaf) != 0 || prefix_paths.count(leaf) != 0; ++k) leaf = detail::cat(base, "_", k);
    }
    if (g == root.get()) used_flat.insert(leaf);
    weights_[name] = g->add_weight(leaf, t, parameter, !options.frozen);
  }
  for (const auto& [n, m] : root->named_children()) register_module(n, m);
  // Root-level weights move onto this module itself (the tensors are shared, not copied).
  for (const auto& [n, t] : root->named_parameters(false)) register_parameter(n, t, t.requires_grad());
  for (const auto& [n, t] : root->named_buffers(false)) register_buffer(n, t);
  for (const ValueInfo& in : model_.graph.inputs)
    if (model_.graph.initializers.count(in.name) == 0) input_names_.push_back(in.name);
  plan_ = make_plan(model_.graph, weights_);
  eval();  // an imported model starts in inference mode, as onnxruntime runs it; train() to fine-tune
}

std::shared_ptr<OnnxModule> OnnxModule::load(const std::string& path, const OnnxOptions& options,
                                             const LoadOptions& load_options) {
  return std::make_shared<OnnxModule>(load_model(path, load_options), options);
}

std::vector<std::string> OnnxModule::output_names() const {
  std::vector<std::string> out;
  for (const ValueInfo& o : model_.graph.outputs) out.push_back(o.name);
  return out;
}

std::string OnnxModule::describe() const {
  return detail::cat("OnnxModule(", model_.path, ", ", model_.graph.nodes.size(), " nodes, opset ",
                     model_.opset(""), ")");
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ", ";
    s += "'";
    s += x;
    s += "'";
  }
  return s;
}
}  // namespace

// Note [Cutting an ONNX graph into layers]
// The pipeline partitioner cuts a Sequential, so to_sequential() splits the graph (nodes in their
// topological order) at every position where exactly one activation crosses and no weight is used
// on both sides: each segment between such positions becomes an OnnxSegment that runs its nodes on
// that one input. Constant nodes are evaluated once and given to every segment that reads them,
// so they never pin a cut. The segments hold this module's parameter and buffer tensors
// themselves (names with '.' replaced by '_'), so training the Sequential trains this module.
namespace {

class OnnxSegment : public nn::Module {
 public:
  OnnxSegment(std::shared_ptr<const Model> model, Graph graph, const OpRegistry* registry,
              std::map<std::string, Tensor> constants)
      : Module("OnnxSegment"), model_(std::move(model)), graph_(std::move(graph)), registry_(registry),
        constants_(std::move(constants)) {}
  void add_weight(const std::string& onnx_name, const Tensor& t, bool parameter) {
    std::string name = onnx_name;
    std::replace(name.begin(), name.end(), '.', '_');
    if (name.empty()) name.push_back('_');
    std::string base = name;
    for (int k = 1; taken_.count(name) != 0; ++k) name = detail::cat(base, "_", k);
    taken_.insert(name);
    weights_[onnx_name] = parameter ? register_parameter(name, t, t.requires_grad()) : register_buffer(name, t);
  }
  Tensor forward(const Tensor& x) override {
    Scope scope;
    for (const auto& [name, t] : constants_) scope.values[name] = t;
    for (const auto& [name, t] : weights_) scope.values[name] = t;
    scope.values[graph_.inputs[0].name] = x;
    Executor ex(*model_, *registry_, is_training(), nullptr);
    ex.set_current(&scope);
    ex.set_device(x.device());
    return ex.run_graph(graph_, scope)[0];
  }
  std::string describe() const override {
    return detail::cat("OnnxSegment(", graph_.nodes.size(), " nodes: ", graph_.nodes.front().label(), " .. ",
                       graph_.nodes.back().label(), ")");
  }

 private:
  std::shared_ptr<const Model> model_;
  Graph graph_;
  const OpRegistry* registry_;
  std::map<std::string, Tensor> constants_, weights_;
  std::set<std::string> taken_;
};

}  // namespace

std::shared_ptr<nn::Sequential> OnnxModule::to_sequential() {
  const Graph& g = model_.graph;
  BRAID_CHECK(input_names_.size() == 1 && g.outputs.size() == 1, model_.path,
              ": to_sequential() needs a model with one input and one output; this one takes [", join(input_names_),
              "] and gives [", join(output_names()), "]");
  // Constants, evaluated once.
  std::map<std::string, Tensor> constants;
  std::vector<size_t> order;  // the non-Constant nodes
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1) {
      OpContext ctx(n, model_.opset(""), false, {}, nullptr);
      constants[n.outputs[0]] = registry_->find("", "Constant")->run(ctx).at(0);
    } else {
      order.push_back(i);
    }
  }
  BRAID_CHECK(!order.empty(), model_.path, ": the graph has no node to run");
  const size_t n = order.size();
  std::vector<std::set<std::string>> reads(n), acts(n), wts(n);
  for (size_t k = 0; k < n; ++k) {
    collect_reads(g.nodes[order[k]], reads[k]);
    for (const auto& r : reads[k]) {
      if (weights_.count(r) != 0) wts[k].insert(r);
      else if (constants.count(r) == 0) acts[k].insert(r);
    }
  }
  // A cut before node k is valid when one activation crosses it and no weight is on both sides.
  std::vector<size_t> cuts{0};
  std::vector<std::string> crossing{input_names_[0]};
  std::set<std::string> produced{input_names_[0]}, weights_before;
  for (size_t k = 1; k < n; ++k) {
    for (const auto& o : g.nodes[order[k - 1]].outputs) produced.insert(o);
    weights_before.insert(wts[k - 1].begin(), wts[k - 1].end());
    std::set<std::string> live;
    bool shared_weight = false;
    for (size_t j = k; j < n; ++j) {
      for (const auto& a : acts[j])
        if (produced.count(a) != 0) live.insert(a);
      for (const auto& w : wts[j]) shared_weight = shared_weight || weights_before.count(w) != 0;
    }
    if (produced.count(g.outputs[0].name) != 0) live.insert(g.outputs[0].name);
    if (live.size() == 1 && !shared_weight) {
      cuts.push_back(k);
      crossing.push_back(*live.begin());
    }
  }
  cuts.push_back(n);
  auto shared = std::make_shared<const Model>(model_);
  auto seq = std::make_shared<nn::Sequential>();
  const std::set<std::string> stats = statistics_inputs(g);
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    Graph part;
    part.name = detail::cat(g.name, "/", c);
    ValueInfo in;
    in.name = crossing[c];
    part.inputs.push_back(in);
    std::set<std::string> used;
    for (size_t k = cuts[c]; k < cuts[c + 1]; ++k) {
      part.nodes.push_back(g.nodes[order[k]]);
      used.insert(reads[k].begin(), reads[k].end());
    }
    ValueInfo out;
    out.name = c + 2 < cuts.size() ? crossing[c + 1] : g.outputs[0].name;
    part.outputs.push_back(out);
    std::map<std::string, Tensor> seg_constants;
    for (const auto& u : used)
      if (constants.count(u) != 0) seg_constants[u] = constants.at(u);
    auto seg = std::make_shared<OnnxSegment>(shared, std::move(part), registry_, std::move(seg_constants));
    for (const auto& u : used) {
      auto w = weights_.find(u);
      if (w != weights_.end()) seg->add_weight(u, w->second, is_floating(w->second.dtype()) && stats.count(u) == 0);
    }
    seg->train(is_training());
    seq->add(seg);
  }
  seq->train(is_training());
  return seq;
}

Tensor OnnxModule::forward(const Tensor& x) {
  BRAID_CHECK(input_names_.size() == 1 && model_.graph.outputs.size() == 1, model_.path,
              ": forward(x) needs a model with one input and one output; this one takes [", join(input_names_),
              "] and gives [", join(output_names()), "]: use run()");
  return run_ordered({x})[0];
}

std::vector<Tensor> OnnxModule::run(const std::vector<Tensor>& inputs) { return run_ordered(inputs); }

std::map<std::string, Tensor> OnnxModule::run_named(const std::map<std::string, Tensor>& inputs) {
  for (const auto& [name, t] : inputs) {
    // A weight given here would otherwise be ignored without a word: refuse it.
    BRAID_CHECK(weights_.count(name) == 0, model_.path, ": '", name,
                "' is a weight of the model, not an input; change it with load_state_dict() (inputs: [",
                join(input_names_), "])");
    BRAID_CHECK(std::find(input_names_.begin(), input_names_.end(), name) != input_names_.end(), model_.path,
                ": no graph input named '", name, "' (inputs: [", join(input_names_), "])");
  }
  std::vector<Tensor> ordered;
  for (const std::string& name : input_names_) {
    auto it = inputs.find(name);
    BRAID_CHECK(it != inputs.end(), model_.path, ": input '", name, "' is missing (inputs: [", join(input_names_),
                "])");
    ordered.push_back(it->second);
  }
  std::vector<Tensor> out = run_ordered(ordered);
  std::map<std::string, Tensor> named;
  for (size_t i = 0; i < out.size(); ++i) named[model_.graph.outputs[i].name] = out[i];
  return named;
}

std::vector<Tensor> OnnxModule::run_ordered(const std::vector<Tensor>& inputs) {
  BRAID_CHECK(inputs.size() == input_names_.size(), model_.path, ": expected ", input_names_.size(),
              " inputs [", join(input_names_), "], got ", inputs.size());
  Scope scope;
  for (const auto& [name, t] : weights_) scope.values[name] = t;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueInfo* info = nullptr;
    for (const ValueInfo& v : model_.graph.inputs)
      if (v.name == input_names_[i]) info = &v;
    BRAID_CHECK(inputs[i].defined(), model_.path, ": input '", input_names_[i], "' is undefined");
    if (info != nullptr && info->has_shape) {
      const Shape& s = inputs[i].shape();
      bool ok = s.size() == info->shape.size();
      for (size_t d = 0; ok && d < s.size(); ++d)
        if (info->shape[d].size >= 0 && info->shape[d].size != s[d]) ok = false;
      if (!ok) {
        std::string want = "[";
        for (size_t d = 0; d < info->shape.size(); ++d) {
          if (d) want += ", ";
          want += info->shape[d].size >= 0 ? std::to_string(info->shape[d].size)
                                           : (info->shape[d].symbol.empty() ? std::string("?") : info->shape[d].symbol);
        }
        want += "]";
        throw ValueError(detail::cat(model_.path, ": input '", input_names_[i], "' has shape ", shape_str(s),
                                     ", the model expects ", want));
      }
    }
    scope.values[input_names_[i]] = inputs[i];
  }
  Executor ex(model_, *registry_, is_training(), profiling_ ? &profile_ : nullptr);
  ex.set_current(&scope);
  ex.set_device(inputs.empty() ? device() : inputs[0].device());
  return ex.run_graph(model_.graph, scope, plan_.get());
}

}  // namespace braid::onnx
