// The executor of an ONNX graph (Note [Executing an ONNX graph] in module.cpp): the scope of named
// values, the plan OnnxModule precomputes for its top-level graph (value lifetimes, kept values, and
// the graph as the passes of onnx/passes/ rewrote it), and the Executor that runs a graph's nodes
// through the op registry. Internal to onnx/: module.cpp runs whole graphs with it, and
// to_sequential's segments run their slices of one.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "braid/autograd.h"
#include "braid/conv.h"
#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "kept.h"
#include "ops/fused.h"
#include "ops_util.h"

namespace braid::onnx {

// ---- execution ----

// Note [Value slots]
// A graph's values are found by name: nodes name their inputs and outputs, and nested graphs read
// the values of the graphs around them. In the top-level graph of an OnnxModule, which runs over
// and over, each value (a graph input or a node's output) also has a number, its slot, given once
// by make_plan: the run's values live in a vector at those numbers, nodes read their inputs from
// the slots make_plan resolved for them, and values are released by slot. A value found by name
// (a pattern's runner, an op reading an outer value) still hashes its name once to find the slot
// (the weights' scope, the run's parent, has slots of the same numbering, so a weight too),
// but no value is copied into a hash table, and no run allocates a node of one, on every run of
// every node (measured: benchmarks/README.md, "What changed what", run Y; what is left of that cost
// is the patterns' runners, which still find their inputs by name). Scopes without slots
// (subgraphs, the training segments) keep every value by name.
//
// Note [Slots by the name's address]
// The patterns' runners and the small-value paths still name what they read (a node's input, a
// chain's operand), and hashing names of 40-60 characters in the plan's table on every run of every
// such node showed in a transformer's profile at batch 1 (measured: benchmarks/README.md, "What
// changed what", run AA). Those names are, nearly always, the graph's own strings (its nodes'
// inputs and outputs), which live as long as the plan: make_plan also numbers
// each of those strings by its address, and a lookup tries the address first (a pointer's hash),
// checking the name against the slot's own before it trusts it, then the name.
struct SlotAddresses {
  std::unordered_map<const std::string*, int> at;  // a graph string's address -> its value's slot
  std::vector<const std::string*> name;            // per slot, its name (the key in ExecPlan::slot_of)
};

struct Scope {
  const Scope* parent = nullptr;
  std::unordered_map<std::string, Tensor> values;  // hashed: graph value names are long and share prefixes
  const std::unordered_map<std::string, int>* index = nullptr;  // the plan's slots (ExecPlan::slot_of), or none
  const SlotAddresses* addresses = nullptr;                     // Note [Slots by the name's address]
  std::vector<Tensor> slots;
  std::vector<uint8_t> bound;  // per slot, whether it holds a value (which may be undefined)

  /// Numbered values, for a plan's index.
  void use_slots(const std::unordered_map<std::string, int>* slot_of, const SlotAddresses* by_address = nullptr) {
    index = slot_of;
    addresses = by_address;
    slots.assign(slot_of->size(), Tensor());
    bound.assign(slot_of->size(), 0);
  }
  /// name's slot in this scope's index, or -1 (index must be set).
  int slot_of(const std::string& name) const {
    if (addresses != nullptr) {
      auto it = addresses->at.find(&name);
      if (it != addresses->at.end() && *addresses->name[static_cast<size_t>(it->second)] == name) return it->second;
    }
    auto it = index->find(name);
    return it != index->end() ? it->second : -1;
  }
  const Tensor* find(const std::string& name) const {
    const std::unordered_map<std::string, int>* looked = nullptr;  // the index last asked, and its answer
    int k = -1;
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      if (s->index != nullptr) {
        if (s->index != looked) {  // the run's scope and the weights' share the plan's index: one lookup
          k = s->slot_of(name);
          looked = s->index;
        }
        if (k >= 0 && s->bound[static_cast<size_t>(k)] != 0) return &s->slots[static_cast<size_t>(k)];
      }
      if (s->values.empty()) continue;
      auto it = s->values.find(name);
      if (it != s->values.end()) return &it->second;
    }
    return nullptr;
  }
  /// name's value, found first at the slot make_plan resolved for it (at; -1 for none): in this
  /// scope, then in its parent when that has the same numbering (the weights' scope); by name otherwise.
  const Tensor* find(const std::string& name, int at) const {
    if (at >= 0 && index != nullptr) {
      if (const Tensor* t = slot(at)) return t;
      if (parent != nullptr && parent->index == index)
        if (const Tensor* t = parent->slot(at)) return t;
    }
    return find(name);
  }
  /// The value of slot i in this scope, or null when it holds none.
  const Tensor* slot(int i) const {
    return bound[static_cast<size_t>(i)] != 0 ? &slots[static_cast<size_t>(i)] : nullptr;
  }
  /// The place of name's value in this scope (its slot, or its entry by name), bound from now on.
  Tensor& at(const std::string& name) {
    if (index != nullptr) {
      const int k = slot_of(name);
      if (k >= 0) {
        bound[static_cast<size_t>(k)] = 1;
        return slots[static_cast<size_t>(k)];
      }
    }
    return values[name];
  }
  void release(int i) {
    slots[static_cast<size_t>(i)] = Tensor();
    bound[static_cast<size_t>(i)] = 0;
  }
  void erase(const std::string& name) {
    if (index != nullptr) {
      const int k = slot_of(name);
      if (k >= 0) return release(k);
    }
    values.erase(name);
  }
};

/// An activation that make_plan found after a Conv (Note [Fusing activations into Conv]).
struct ActFusion {
  std::vector<size_t> nodes;  // one activation node, HardSwish written out as Add, Clip, Mul, Div, or
                              // the Add of a residual and the activation after it
  std::string label;          // its name in profiles: the op type, "HardSwish" or "Add+" the op type
  std::vector<size_t> post;   // a Mul and an Add by one-element constants after it, or none
  std::string residual{};     // the value the Add adds (Note [Residual as a post-op]), or none
  bool residual_writable = false;  // whether no other node reads it from the convolution on
};

/// An exact GELU written out as nodes (Note [GELU as one op]): Div by sqrt 2 (the key), then these.
struct GeluFusion {
  size_t erf, add, mul1, mul2;
  std::string one, half;   // the values added to erf (1) and multiplied in (0.5)
  bool half_last = false;  // x * (1 + erf) first, then * 0.5 (detail::gelu_half_last), else braid::gelu's order
};

/// A run of elementwise nodes that runs as one braid::elementwise_chain in inference (Note
/// [Elementwise chains] in src/ops/chain.cpp; found by find_chains, chains.cpp).
struct ChainFusion {
  struct Step {
    ChainStep::Kind kind = ChainStep::Kind::Add;
    size_t node = 0;           // the node, and the step's other nodes: a QDQ pair's DequantizeLinear,
    std::vector<size_t> also;  // an exact GELU's Erf, Add and Muls (the last writes the step's value)
    int a = 0, b = -1;        // the slots read (ChainStep's)
    std::string constant;     // the one-element constant operand of an arithmetic step, or none
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::string input, output;  // slot 0 (or what a Cast heading it reads), and the last step's value
  bool cast_input = false;    // the chain starts with a Cast of int32 values to float32
  size_t matmul = kNone;      // the MatMulInteger whose product alone the Cast reads, or the float32
                              // MatMul by a weight whose product alone the first step reads, run with it
  std::vector<Step> steps;
  std::vector<size_t> nodes;  // every node the chain runs
  std::vector<size_t> early;  // Constant and static nodes after the first that it reads (placed before it)
};

/// A squeeze-and-excitation block written as nodes, run as one detail::channel_gate in inference
/// (Note [Channel gates as one op] in src/ops/gate.cpp; found by find_gates,
/// gates.cpp): a GlobalAveragePool, two stages of a 1x1 Conv, an optional Add of a bias and an
/// optional activation, and the Mul of the pool's input by the gate.
struct GateFusion {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Stage {
    size_t conv = kNone, add = kNone, act = kNone;
    std::string bias;  // the Add's operand, or none
  };
  std::string input, output;  // the pool's input, the Mul's output
  std::string gate;           // the value the Mul reads besides the input
  Stage stages[2];
  std::vector<size_t> nodes;  // every node the block runs (Identity nodes between included), the Mul last
  bool gate_only = false;     // the Mul runs in an elementwise chain: the block makes `gate` alone
  std::vector<size_t> early;  // Constant and static nodes after the pool that it reads (placed before it)
};

/// Shape computations that read one value's shape, evaluated once per shape (Note [Shape
/// computations evaluated once per shape], shape_groups.cpp).
struct ShapeGroup {
  std::string root;                // the value whose shape its Shape nodes read
  std::vector<size_t> nodes;       // in graph order, the first a Shape node
  std::vector<std::string> exits;  // its values that nodes outside it read
  std::vector<size_t> exit_of;     // per exit, the node that makes it
};

/// A pattern a pass found (Note [Graph passes], passes/passes.cpp): the nodes of the model's graph it
/// runs, and the values of theirs that nodes outside it read. It runs as one node of domain
/// kFusedDomain whose "fusion" attribute is its index in ExecPlan::fused.
struct FusedGroup {
  size_t pass = 0;                   // its index in passes()
  size_t at = 0;                     // the node the pass keyed it by (the Conv, the chain's first node)
  std::vector<size_t> nodes;         // every node it replaces, in graph order
  std::vector<std::string> outputs;  // the fused node's outputs
};

/// The domain of the nodes the passes write.
inline const std::string kFusedDomain = "braid";

/// What OnnxModule precomputes about its top-level graph (see make_plan). The patterns' maps (conv_bn
/// to chains) and `folded` number the model's graph's nodes, which the passes' runs read; everything
/// else numbers the nodes of `graph`, the graph that runs.
struct ExecPlan {
  std::shared_ptr<const Graph> graph;  // the model's graph as the passes rewrote it (a copy when none fired)
  bool inference = false;              // made with the passes, for inference; else the graph as written
  std::vector<FusedGroup> fused;
  std::vector<std::vector<std::string>> release_after;  // values whose last use is node i
  // Note [Value slots]: the top-level graph's values (its inputs and its nodes' outputs, then the
  // weights, which live in the weights' scope) numbered; per node, its inputs' slots (-1 for an
  // empty name) and the slots it releases.
  std::unordered_map<std::string, int> slot_of;
  SlotAddresses slot_addresses;  // Note [Slots by the name's address]
  std::vector<std::vector<int>> input_slots, release_slots;
  std::vector<std::vector<std::string>> release_unslotted;  // released names without a slot (none, in practice)
  std::map<size_t, size_t> conv_bn;                     // Conv node -> the BatchNormalization it feeds
  std::map<size_t, std::pair<size_t, size_t>> conv_affine;  // Conv node -> the Mul and Add by scalars after it
  std::map<size_t, ActFusion> conv_act;                 // Conv (or folded BatchNormalization) -> its activation
  std::map<size_t, size_t> qdq;  // QuantizeLinear -> the DequantizeLinear that alone reads it (Note [QDQ pairs])
  std::map<size_t, GeluFusion> gelu;        // Div node -> the rest of an exact GELU (Note [GELU as one op])
  std::map<size_t, ChainFusion> chains;     // first node (or its MatMulInteger) -> its elementwise chain
  std::map<size_t, GateFusion> gates;       // GlobalAveragePool -> its squeeze-and-excitation block
  std::map<std::string, double> constants;  // one-element Constant nodes' values, known before they run
  mutable FoldedWeights folded;             // Note [Folded weights kept]
  mutable ConstantCache constant_values;    // Note [Constants evaluated once]
  std::vector<bool> static_node;            // Note [Static nodes evaluated once]
  mutable StaticOutputs static_outputs;
  std::vector<bool> small_node;  // Note [Small values evaluated once per value]
  mutable SmallValues small_values;
  std::vector<ShapeGroup> shape_groups;
  std::vector<int> shape_group_of;  // per node, its shape group or -1
  mutable SmallValues shape_kept;   // per group: its root's dtype and shape, and the exits they gave
  std::vector<bool> shapes_start;  // per node, whether a shape group starts there
  // Per node, what running it looks up by name otherwise (OnnxModule fills schema, opset and values): its
  // schema (null when the registry lacks the op), its domain's opset, and whether it is a Constant
  // node that run_constant serves.
  std::vector<const OpSchema*> schema;
  std::vector<int64_t> opset;
  std::vector<bool> constant_node;
};

/// A Conv's run with an activation fused (all null when none): the activation, the value name it
/// writes, and its profile label.
struct Fused {
  const ops::FusedActivation* act = nullptr;
  const std::string* output = nullptr;
  const std::string* label = nullptr;
};

class Executor {
 public:
  Executor(const Model& m, const OpRegistry& r, bool training, std::map<std::string, OnnxModule::OpTime>* profile)
      : model_(m), registry_(r), training_(training), profile_(profile) {}

  /// Runs g's nodes in scope; returns g's outputs. With a plan (the top-level graph: g is
  /// plan->graph), values are released after their last use, and in inference kept values are
  /// bound instead of computed again (kept.h); the passes' fused nodes run through the registry as
  /// every node does.
  std::vector<Tensor> run_graph(const Graph& g, Scope& scope, const ExecPlan* plan = nullptr) {
    BRAID_ASSERT(plan == nullptr || plan->graph.get() == &g);
    const bool fold = plan != nullptr && plan->inference && !training_ && !is_grad_enabled();
    // Note [Channels-last activations in inference] (src/ops/conv.cpp); the outputs leave as NCHW.
    std::optional<ChannelsLastGuard> channels_last;
    if (fold) channels_last.emplace();
    if (plan != nullptr) {
      plan_ = plan;
      plan_scope_ = &scope;
    }
    if (fold) skip_.assign(g.nodes.size(), 0);
    if (fold) shapes_.assign(plan->shape_groups.size(), PendingShapes());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (fold && skip_[i] != 0) {  // bound by its shape group
        release(plan, i, scope);
        continue;
      }
      if (fold && plan->shapes_start[i] && bind_shapes(plan->shape_group_of[i], scope, *plan)) {
        release(plan, i, scope);
        continue;
      }
      if (fold && plan->static_node[i]) {
        run_static(g.nodes[i], scope, *plan, i);
        release(plan, i, scope);
        continue;
      }
      if (plan != nullptr && plan->constant_node[i]) {
        run_constant(g.nodes[i], scope, *plan, i);
        release(plan, i, scope);
        continue;
      }
      if (fold && plan->small_node[i] && run_small(g.nodes[i], scope, *plan, i)) {
        release(plan, i, scope);
        continue;
      }
      if (plan != nullptr)
        run_node(g.nodes[i], scope, Fused(), plan->schema[i], plan->opset[i],
                 scope.index == &plan->slot_of ? &plan->input_slots[i] : nullptr);
      else
        run_node(g.nodes[i], scope);
      release(plan, i, scope);
    }
    std::vector<Tensor> out;
    for (const ValueInfo& o : g.outputs) {
      const Tensor* t = scope.find(o.name);
      if (t == nullptr || !t->defined())
        throw ValueError(detail::cat(model_.path, ": graph output '", o.name, "' was not computed"));
      // Note [Channels-last activations in inference] (ops/conv.cpp): the caller gets NCHW.
      out.push_back(!t->is_contiguous() && t->is_channels_last() ? contiguous(*t) : *t);
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

  /// Runs a node of kFusedDomain (Note [Graph passes], passes/passes.cpp): its pattern through
  /// its pass, or its nodes as written where the pass's run declines; the values it makes, in the
  /// node's output order.
  std::vector<Tensor> run_fused(const Node& n);

  // ---- the passes' runs (onnx/passes/, with their Notes) ----
  // Each runs its pattern in scope, writing its outputs there, or returns false (nothing written)
  // when the pattern does not apply in this run. g is the model's graph, whose nodes they name.

  // Note [QDQ pairs] (passes/qdq.cpp)
  bool run_fake_quantize(const Node& q, const Node& dq, Scope& scope);
  // A QuantizeLinear's per-tensor scale (float32, positive, finite), zero point and type (uint8
  // without one), or false when they are not such.
  static bool qdq_numbers(const Node& q, const Scope& scope, double& scale, int64_t& zero, DType& qtype);

  // Note [Elementwise chains] (src/ops/chain.cpp); passes/chain.cpp.
  bool run_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan);
  // The chain's steps for an input of shape x (its numbers read from scope), or false when they do not apply.
  bool chain_steps(const Graph& g, const ChainFusion& chain, const Scope& scope, const ExecPlan& plan, const Shape& x,
                   std::vector<ChainStep>& steps);
  // A chain with its MatMulInteger as braid::int_matmul_chain (Note [int8 epilogues]); with zero
  // points per row or column the product as its node and the chain after it; false (both left to
  // run as nodes) when the product is not of two 8-bit matrices or the chain's steps do not apply.
  bool run_int_matmul_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan);
  // A chain with its float32 MatMul by a weight as braid::matmul_chain (Note [float32 epilogues]).
  bool run_matmul_chain(const Graph& g, const ChainFusion& chain, Scope& scope, const ExecPlan& plan);

  // Note [Channel gates as one op] (src/ops/gate.cpp); passes/gate.cpp.
  bool run_gate(const Graph& g, const GateFusion& gate, Scope& scope, const ExecPlan& plan);

  // Note [GELU as one op] (passes/gelu.cpp)
  bool run_gelu(const Graph& g, const Node& div, const GeluFusion& f, Scope& scope, const ExecPlan& plan);
  // Whether an exact GELU's numbers are sqrt 2, 1 and 0.5 in this run.
  static bool gelu_numbers(const Node& div, const GeluFusion& f, const Scope& scope, const ExecPlan& plan);

  // Note [Folding BatchNormalization into Conv] (passes/conv.cpp): a Conv group of the conv pass.
  bool run_conv_group(const Graph& g, size_t conv, Scope& scope, const ExecPlan& plan);
  bool run_folded(const Node& conv, const Node& bn, Scope& scope, const ExecPlan& plan, size_t node, size_t bn_node,
                  const Fused& fused = Fused());
  // A BatchNormalization that no Conv folds, as channel_affine (passes/batch_norm.cpp).
  bool run_batch_norm(const Node& bn, Scope& scope, const ExecPlan& plan, size_t node);
  // An inference BatchNormalization of float32 (channels) parameters as y = x * scale + shift,
  // folded once per parameter values (plan.folded); false when it is not one (passes/batch_norm.cpp).
  bool batch_norm_affine(const Node& bn, const Scope& scope, const ExecPlan& plan, size_t node, int64_t channels,
                         Tensor& scale, Tensor& shift);

  // The Conv with folded weights and bias (patterns.cpp).
  void run_conv_folded(const Node& conv, std::vector<Tensor> inputs, std::array<const Node*, 2> folded,
                       const std::string& output, const std::string& label, Scope& scope, const Fused& fused,
                       std::chrono::steady_clock::time_point start);

  // Note [Folding a scalar affine into Conv]
  bool run_affine(const Node& conv, const Node& mul, const Node& add, Scope& scope, const ExecPlan& plan, size_t node,
                  const Fused& fused);

  // Whether the activation the plan paired with conv can run as its epilogue in this run, and
  // which: a 1-d or 2-d convolution, and the numbers it depends on known and as expected.
  // src is the value the activation reads: the Conv's output, or its folded BatchNormalization's.
  bool fusable(const Graph& g, size_t node, const std::string& src, const ActFusion& f, const Scope& scope,
               const ExecPlan& plan, ops::FusedActivation& out);
  // The affine map after the activation that the plan found (Note [Folding a scalar affine into
  // Conv]): its scale and shift into out; false when they are not known numbers.
  static bool post_affine(const Graph& g, const ActFusion& f, const Scope& scope, const ExecPlan& plan,
                          ops::FusedActivation& out);

 private:
  // Note [Shape computations evaluated once per shape] (shape_groups.cpp): binds a group's exits
  // and skips its nodes when its root has the shape it had when they were kept, else starts
  // collecting them (true when bound); note_shapes takes node i's exits as they are made.
  bool bind_shapes(int group, Scope& scope, const ExecPlan& plan);
  void note_shapes(size_t i, const Scope& scope, const ExecPlan& plan);
  struct PendingShapes {
    bool collecting = false;
    std::string key;
    std::vector<Tensor> exits;
    size_t made = 0;
  };
  std::vector<PendingShapes> shapes_;

  // The kept values' runs (kept_runs.cpp): a node of weights and constants, or what it gave last
  // time (Note [Static nodes evaluated once]); a node of small values, or what it gave for the same
  // values (Note [Small values evaluated once per value]; false when its inputs are not all small);
  // a Constant node, or the value it gave last time (Note [Constants evaluated once]).
  void run_static(const Node& n, Scope& scope, const ExecPlan& plan, size_t node);
  bool run_small(const Node& n, Scope& scope, const ExecPlan& plan, size_t node);
  void run_constant(const Node& n, Scope& scope, const ExecPlan& plan, size_t node);

  void release(const ExecPlan* plan, size_t i, Scope& scope) {
    if (plan != nullptr && !shapes_.empty() && plan->shape_group_of[i] >= 0) note_shapes(i, scope, *plan);
    if (plan == nullptr) return;
    if (scope.index == &plan->slot_of) {
      for (int k : plan->release_slots[i]) scope.release(k);
      for (const std::string& name : plan->release_unslotted[i]) scope.erase(name);
      return;
    }
    for (const std::string& name : plan->release_after[i]) scope.erase(name);
  }

  // Adds the time since start to a row of the profile (when one is kept): label, or label+suffix
  // where a fused activation's label is given; the name is made only when profiling.
  void add_time(std::chrono::steady_clock::time_point start, std::string_view label,
                const std::string* suffix = nullptr) {
    if (profile_ == nullptr) return;
    std::string name(label);
    if (suffix != nullptr) name += "+" + *suffix;
    auto& slot = (*profile_)[name];
    slot.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    slot.calls++;
  }

  template <typename E>
  [[noreturn]] void rethrow_as(const E& e, const Node& n) {
    throw E(detail::cat(model_.path, ": ", n.label(), ": ", e.what()));
  }

  // A one-element value known now: computed in scope, or a Constant node's that has not run yet.
  static bool number(const std::string& name, const Scope& scope, const ExecPlan& plan, double& out) {
    if (const Tensor* t = scope.find(name)) {
      if (!t->defined() || t->numel() != 1) return false;
      out = t->item();
      return true;
    }
    auto it = plan.constants.find(name);
    if (it == plan.constants.end()) return false;
    out = it->second;
    return true;
  }

  // schema and opset: n's, where the plan has them (ExecPlan::schema), else looked up here.
  void run_node(const Node& n, Scope& scope, const Fused& fused = Fused(), const OpSchema* schema = nullptr,
                int64_t opset = -1, const std::vector<int>* input_slots = nullptr) {
    const OpSchema* s = schema != nullptr ? schema : registry_.find(n.domain, n.op_type);
    if (s == nullptr)
      throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": op '", n.op_type, "' is not supported"));
    // Note [Graph passes] (passes/passes.cpp): a fused node reads its pattern's values from the
    // scope itself (so that a residual its convolution may overwrite has no second handle here) and
    // profiles itself under its pattern's label (Conv+BatchNormalization+Relu).
    const bool fused_node = n.domain == kFusedDomain;
    std::vector<Tensor> inputs;
    inputs.reserve(fused_node ? 0 : n.inputs.size());
    // Note [Storage types through compute types]
    // Every ONNX value keeps its element type; float16, bfloat16, int8 and uint8 are storage types
    // in braid, which its kernels do not compute in. An op that does not handle dtypes itself
    // (OpSchema::storage_via_compute) gets such inputs widened exactly (float16/bfloat16 to float32,
    // int8/uint8 to int32), and its outputs of that compute type are narrowed back to the storage
    // type they came from, as ONNX's type constraints tie an op's result type to its inputs'. Narrowing
    // an integer wraps, as ONNX's integer arithmetic does. half/narrow: what each compute type was.
    DType half = kFloat32, narrow = kInt32;
    bool has_half = false, has_narrow = false;
    for (size_t k = 0; k < (fused_node ? 0 : n.inputs.size()); ++k) {
      const std::string& name = n.inputs[k];
      if (name.empty()) {
        inputs.emplace_back();
        continue;
      }
      // Note [Value slots]: the slot make_plan resolved for it, else by name (a weight, an outer value).
      const int at = input_slots != nullptr ? (*input_slots)[k] : -1;
      const Tensor* t = at >= 0 ? scope.slot(at) : nullptr;
      if (t == nullptr && at >= 0 && scope.parent != nullptr && scope.parent->index == scope.index)
        t = scope.parent->slot(at);  // a weight, in the weights' scope
      if (t == nullptr) t = scope.find(name);
      if (t == nullptr)
        throw ValueError(detail::cat(model_.path, ": ", n.label(), ": input '", name, "' has no value"));
      Tensor v = *t;
      if (s->storage_via_compute && v.defined() && !is_compute_type(v.dtype())) {
        (is_floating(v.dtype()) ? has_half : has_narrow) = true;
        (is_floating(v.dtype()) ? half : narrow) = v.dtype();
        v = cast(v, compute_type(v.dtype()));
      }
      if (v.defined() && v.device() != device_) v = v.to(device_);
      inputs.push_back(std::move(v));
    }
    std::vector<Tensor> outputs;
    const auto start = profile_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const Scope* saved = current_;
    current_ = &scope;
    try {
      OpContext ctx(n, opset >= 0 ? opset : model_.opset(n.domain), training_, std::move(inputs), this);
      outputs = fused.act ? ops::conv_fused(ctx, *fused.act) : s->run(ctx);
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
    if (!fused_node) add_time(start, n.op_type, fused.label);
    if (outputs.size() < n.outputs.size()) {
      // Trailing optional outputs may be left undefined only if nobody asked for them.
      for (size_t i = outputs.size(); i < n.outputs.size(); ++i)
        if (!n.outputs[i].empty())
          throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": output ", i, " ('", n.outputs[i],
                                                "') is not produced by braid's ", n.op_type));
    }
    // Fused, the convolution's one output is the activation's.
    std::vector<std::string> activation_output;
    if (fused.output) activation_output.push_back(*fused.output);
    const std::vector<std::string>& names = fused.output ? activation_output : n.outputs;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i].empty()) continue;
      Tensor t = outputs[i];
      if (!t.defined())
        throw NotImplementedError(detail::cat(model_.path, ": ", n.label(), ": output ", i, " ('", n.outputs[i],
                                              "') is not produced by braid's ", n.op_type));
      if (has_half && is_floating(t.dtype()) && t.dtype() != half) t = cast(t, half);
      if (has_narrow && t.dtype() == kInt32) t = cast(t, narrow);
      // Note [Graph values on the device]
      // Values an op makes from attributes or from the host (Constant, Shape, ConstantOfShape, index
      // lists) start on the CPU; every value the graph hands on lives on the device the caller's
      // inputs are on, as onnxruntime places initialisers and constants on its execution provider.
      if (t.device() != device_) t = t.to(device_);
      scope.at(names[i]) = std::move(t);
    }
  }

  const Model& model_;
  const OpRegistry& registry_;
  bool training_;
  Device device_;
  const Scope* current_ = nullptr;
  std::map<std::string, OnnxModule::OpTime>* profile_;
  std::vector<char> skip_;  // per node of the top-level graph: bound by its shape group in this run
  const ExecPlan* plan_ = nullptr;  // the top-level graph's plan, and the scope it runs in, for fused nodes
  Scope* plan_scope_ = nullptr;
};

/// The plan of the top-level graph g: with passes (inference), the graph the passes named in
/// `off` do not rewrite (Note [Graph passes]); without, g as written. schema and opset per node
/// come from registry and model.
std::shared_ptr<ExecPlan> make_plan(const Model& model, const Graph& g, const std::map<std::string, Tensor>& weights,
                                    const OpRegistry& registry, bool passes, const std::set<std::string>& off = {});
/// The shape computations (Note [Shape computations evaluated once per shape]), into
/// plan.shape_groups (shape_groups.cpp), among the nodes of the graph that runs. reads[i]: the
/// values node i reads, its subgraphs' included.
void find_shape_groups(const Graph& g, const std::vector<std::set<std::string>>& reads,
                       const std::set<std::string>& keep, ExecPlan& plan);
/// Every value name a node reads, its subgraphs' reads of outer values included (module.cpp).
void collect_reads(const Node& n, std::set<std::string>& out);
/// Adds braid's fused nodes' ops (domain kFusedDomain, one per pass) to r (passes/passes.cpp).
void register_fused_ops(OpRegistry& r);

}  // namespace braid::onnx
