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
#include <optional>
#include <set>

#include "braid/autograd.h"
#include "braid/ops.h"
#include "core/knob_read.h"
#include "passes/passes.h"

namespace braid::onnx {

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


}  // namespace

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

namespace {

/// Note [Static nodes evaluated once] in kept.h: the nodes that read only weights, constants and
/// other such nodes' outputs. An initialiser that is also a graph input is the caller's to give.
std::vector<bool> static_nodes(const Graph& g, const std::map<std::string, Tensor>& weights,
                               const std::set<std::string>& keep) {
  static const std::set<std::string> kRandom = {
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"};
  std::set<std::string> fixed;
  for (const auto& [name, t] : weights) fixed.insert(name);
  for (const auto& in : g.inputs) fixed.erase(in.name);
  std::vector<bool> out(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (!node.domain.empty()) continue;
    if (node.op_type == "Constant") {
      for (const auto& o : node.outputs) fixed.insert(o);
      continue;
    }
    bool ok = kRandom.count(node.op_type) == 0 && !node.inputs.empty();
    for (const auto& [name, a] : node.attributes)
      ok = ok && a.graphs.empty() && a.kind != Attribute::Kind::Graph && a.kind != Attribute::Kind::Graphs;
    for (const auto& in : node.inputs) ok = ok && (in.empty() || fixed.count(in) != 0);
    for (const auto& o : node.outputs) ok = ok && keep.count(o) == 0;
    if (!ok) continue;
    out[i] = true;
    for (const auto& o : node.outputs) fixed.insert(o);
  }
  return out;
}

}  // namespace

std::shared_ptr<ExecPlan> make_plan(const Model& model, const Graph& source, const std::map<std::string, Tensor>& weights,
                                    const OpRegistry& registry, bool with_passes, const std::set<std::string>& off) {
  auto plan = std::make_shared<ExecPlan>();
  plan->inference = with_passes;
  std::set<std::string> keep;
  for (const auto& o : source.outputs) keep.insert(o.name);
  // One-element Constant nodes' values, known before they run (the passes' runs read them).
  for (const Node& c : source.nodes) {
    auto v = c.attributes.find("value");
    if (c.op_type == "Constant" && c.domain.empty() && c.outputs.size() == 1 && v != c.attributes.end() &&
        v->second.kind == Attribute::Kind::Tensor && v->second.t.defined() && v->second.t.numel() == 1 &&
        is_floating(v->second.t.dtype()))
      plan->constants[c.outputs[0]] = v->second.t.item();
  }
  if (with_passes) {  // Note [Graph passes] (passes/passes.cpp)
    plan->static_node = static_nodes(source, weights, keep);
    apply_passes(source, weights, off, *plan);
  } else {
    plan->graph = std::shared_ptr<const Graph>(std::shared_ptr<const Graph>(), &source);  // the model's, not owned
  }
  const Graph& g = *plan->graph;
  const size_t n = g.nodes.size();
  plan->release_after.resize(n);
  std::map<std::string, size_t> last_use;
  std::vector<std::set<std::string>> reads(n);
  for (size_t i = 0; i < n; ++i) {
    collect_reads(g.nodes[i], reads[i]);
    for (const auto& r : reads[i]) last_use[r] = i;
  }
  for (const auto& [name, i] : last_use)
    if (keep.count(name) == 0 && weights.count(name) == 0) plan->release_after[i].push_back(name);
  // Note [Value slots] (executor.h): the graph's inputs, then its nodes' outputs, in order.
  const auto number = [&plan](const std::string& name) {
    if (!name.empty() && plan->slot_of.count(name) == 0)
      plan->slot_of.emplace(name, static_cast<int>(plan->slot_of.size()));
  };
  for (const ValueInfo& in : g.inputs)
    if (weights.count(in.name) == 0) number(in.name);
  for (const Node& node : g.nodes)
    for (const std::string& o : node.outputs) number(o);
  for (const auto& [name, t] : weights) number(name);
  // Note [Slots by the name's address] (executor.h): the graph's own strings, by address, and the
  // model's graph's, which the passes' runs name.
  plan->slot_addresses.name.resize(plan->slot_of.size());
  for (const auto& [name, k] : plan->slot_of) plan->slot_addresses.name[static_cast<size_t>(k)] = &name;
  const auto address = [&plan](const std::string& name) {
    auto it = name.empty() ? plan->slot_of.end() : plan->slot_of.find(name);
    if (it != plan->slot_of.end()) plan->slot_addresses.at.emplace(&name, it->second);
  };
  for (const Graph* graph : {&g, &source}) {
    for (const ValueInfo& in : graph->inputs) address(in.name);
    for (const ValueInfo& out : graph->outputs) address(out.name);
    for (const Node& node : graph->nodes) {
      for (const std::string& in : node.inputs) address(in);
      for (const std::string& out : node.outputs) address(out);
    }
    if (&g == &source) break;
  }
  plan->input_slots.resize(n);
  plan->release_slots.resize(n);
  plan->release_unslotted.resize(n);
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& name : g.nodes[i].inputs) {
      auto it = name.empty() ? plan->slot_of.end() : plan->slot_of.find(name);
      plan->input_slots[i].push_back(it != plan->slot_of.end() ? it->second : -1);
    }
    for (const std::string& name : plan->release_after[i]) {
      auto it = plan->slot_of.find(name);
      if (it != plan->slot_of.end())
        plan->release_slots[i].push_back(it->second);
      else
        plan->release_unslotted[i].push_back(name);
    }
  }
  plan->static_node = static_nodes(g, weights, keep);
  // Note [Small values evaluated once per value] in kept.h.
  plan->small_node.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    bool ok = node.domain.empty() && !plan->static_node[i] && SmallValues::pure_op(node.op_type);
    for (const auto& o : node.outputs) ok = ok && keep.count(o) == 0;
    plan->small_node[i] = ok;
  }
  // A Constant node whose value is not a graph output runs through the constant cache.
  for (const Node& node : g.nodes)
    plan->constant_node.push_back(node.op_type == "Constant" && node.domain.empty() && node.outputs.size() == 1 &&
                                  keep.count(node.outputs[0]) == 0);
  find_shape_groups(g, reads, keep, *plan);
  plan->shapes_start.assign(n, false);
  for (const ShapeGroup& sg : plan->shape_groups) plan->shapes_start[sg.nodes[0]] = true;
  for (const Node& node : g.nodes) {
    // braid's fused nodes are found in braid's own registry whatever registry the model uses.
    const OpRegistry& r = node.domain == kFusedDomain ? OpRegistry::global() : registry;
    plan->schema.push_back(r.find(node.domain, node.op_type));
    plan->opset.push_back(model.opset(node.domain));
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
  // Note [Graph passes] (passes/passes.cpp): the passes off are the knob's and the options'.
  std::set<std::string> off(options.disabled_passes.begin(), options.disabled_passes.end());
  const std::string knob = detail::knob_text("BRAID_ONNX_PASSES_OFF");
  for (size_t a = 0; a < knob.size();) {
    size_t b = knob.find(',', a);
    if (b == std::string::npos) b = knob.size();
    if (b > a) off.insert(knob.substr(a, b - a));
    a = b + 1;
  }
  infer_plan_ = make_plan(model_, model_.graph, weights_, *registry_, true, off);
  train_plan_ = make_plan(model_, model_.graph, weights_, *registry_, false);
  // The weights' tensors stay the same objects for the module's life (moving it to a device or
  // loading a state dict changes them in place), so their scopes are built once, not on every run.
  for (auto [plan, scope] : {std::pair{infer_plan_.get(), &infer_weights_}, std::pair{train_plan_.get(), &train_weights_}}) {
    *scope = std::make_shared<Scope>();
    (*scope)->use_slots(&plan->slot_of, &plan->slot_addresses);  // Note [Value slots]
    for (const auto& [name, t] : weights_) (*scope)->at(name) = t;
  }
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
  // Inference runs the graph the passes rewrote; training and every run recording gradients the
  // graph as written (Note [Graph passes]).
  bool wants_grad = is_grad_enabled() && is_training();
  if (is_grad_enabled() && !wants_grad) {
    for (const Tensor& t : inputs) wants_grad = wants_grad || t.requires_grad();
    for (const auto& [name, t] : weights_) wants_grad = wants_grad || t.requires_grad();
  }
  const bool infer = !is_training() && !wants_grad;
  const ExecPlan& plan = infer ? *infer_plan_ : *train_plan_;
  Scope scope;
  scope.parent = infer ? infer_weights_.get() : train_weights_.get();
  scope.use_slots(&plan.slot_of, &plan.slot_addresses);  // Note [Value slots]
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
    scope.at(input_names_[i]) = inputs[i];
  }
  // Note [Inference without a gradient to record]: where no input and no weight asks for a gradient
  // (a frozen model in eval mode, as braid.onnx.load(frozen=True) gives Python) no op records one,
  // grad mode or not, so the run is the inference it would be under NoGradGuard, with its folded
  // and fused patterns, which grad mode alone used to turn off.
  std::optional<NoGradGuard> no_grad;
  if (!wants_grad) no_grad.emplace();
  Executor ex(model_, *registry_, is_training(), profiling_ ? &profile_ : nullptr);
  ex.set_current(&scope);
  ex.set_device(inputs.empty() ? device() : inputs[0].device());
  return ex.run_graph(*plan.graph, scope, &plan);
}

std::vector<OnnxPass> onnx_passes() {
  std::vector<OnnxPass> out;
  for (const Pass& p : passes()) out.push_back({p.name, p.op_type, p.what});
  return out;
}

std::vector<FiredPass> OnnxModule::fired_passes() const {
  std::vector<FiredPass> out;
  for (const Node& n : infer_plan_->graph->nodes) {
    if (n.domain != kFusedDomain) continue;
    const FusedGroup& f = infer_plan_->fused[static_cast<size_t>(n.attributes.at("fusion").i)];
    FiredPass fp{passes()[f.pass].name, n.name, {}};
    for (size_t j : f.nodes) fp.replaced.push_back(model_.graph.nodes[j].label());
    out.push_back(std::move(fp));
  }
  return out;
}

}  // namespace braid::onnx
