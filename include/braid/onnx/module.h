// Running ONNX models in braid. An OnnxModule is an nn::Module made from a loaded onnx::Model: its
// floating-point initialisers are parameters under their ONNX names (a dotted name such as
// "layer1.0.conv1.weight" becomes that path in named_parameters() and state_dict()), the rest
// (integer initialisers, BatchNormalization's running statistics) are buffers. Each node runs as a
// function of braid's differentiable ops, looked up in an explicit OpRegistry by op type and
// opset, so an imported model trains like any other braid model: autograd, optimizers,
// DataParallel and checkpoints apply unchanged.
//
// Construction runs a preflight over every node, subgraphs included, and throws one
// NotImplementedError listing every unsupported op, opset or attribute with the node's name, so a
// user sees the whole gap at once instead of the first missing op.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "braid/nn/module.h"
#include "braid/onnx/model.h"

namespace braid::onnx {

class Executor;
struct ExecPlan;
struct Scope;

/// What an op implementation sees of the node it runs: its inputs (an undefined Tensor for an
/// omitted optional input), its attributes with defaults, the opset and the training flag.
class OpContext {
 public:
  OpContext(const Node& node, int64_t opset, bool training, std::vector<Tensor> inputs, Executor* executor)
      : node_(node), opset_(opset), training_(training), inputs_(std::move(inputs)), executor_(executor) {}

  const Node& node() const { return node_; }
  /// The model's ai.onnx opset version (the op behaves as its newest version not above it).
  int64_t opset() const { return opset_; }
  bool training() const { return training_; }
  /// The device the graph runs on: constants and index lists an op builds go there (Note [Graph
  /// values on the device] in onnx/module.cpp).
  Device device() const;

  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i].defined(); }
  /// Input i; throws naming the node when it is omitted.
  const Tensor& input(size_t i) const;
  /// The values of a 1-d (or 0-d) integer input, e.g. Reshape's shape.
  std::vector<int64_t> input_ints(size_t i) const;
  double input_scalar(size_t i) const;

  bool has_attr(const std::string& name) const { return node_.attributes.count(name) != 0; }
  const Attribute& attr(const std::string& name) const;
  /// The attribute called name, or null when the node has none (nothing copied).
  const Attribute* find_attr(const std::string& name) const {
    auto it = node_.attributes.find(name);
    return it == node_.attributes.end() ? nullptr : &it->second;
  }
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  double attr_float(const std::string& name, double fallback) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name, const std::vector<int64_t>& fallback = {}) const;
  std::vector<double> attr_floats(const std::string& name, const std::vector<double>& fallback = {}) const;

  /// The executor running the node, or null (braid's fused nodes run their pattern through it).
  Executor* executor() const { return executor_; }
  /// Runs a subgraph attribute (If's branches, Loop's body) with the given inputs, outer values visible.
  std::vector<Tensor> run_subgraph(const Graph& g, const std::vector<Tensor>& inputs);

  /// Throws ValueError; the executor prefixes the model's file and the node.
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw ValueError(detail::cat(args...));
  }

 private:
  const Node& node_;
  int64_t opset_;
  bool training_;
  std::vector<Tensor> inputs_;
  Executor* executor_;
};

/// One ONNX op as braid implements it.
struct OpSchema {
  std::string domain;   ///< "" for ai.onnx
  std::string op_type;  ///< "Conv"
  /// The oldest opset whose semantics this implementation covers; a model importing an older
  /// ai.onnx opset is refused by the preflight.
  int64_t since_opset = 1;
  /// The newest opset whose semantics this implementation covers (Note [Opsets after 21]); a model
  /// importing a newer ai.onnx opset is refused for this op by the preflight.
  int64_t until_opset = kMaxOpset;
  /// Attributes the implementation reads; any other attribute on the node is reported unsupported.
  std::vector<std::string> attributes;
  /// Optional: a reason an attribute value or input pattern is unsupported ("" when fine).
  std::function<std::string(const Node&, int64_t opset)> check;
  /// The computation, in braid ops (so autograd differentiates it).
  std::function<std::vector<Tensor>(OpContext&)> run;
  /// Inputs of a storage type are computed in its compute type, and outputs of that type cast back:
  /// float16/bfloat16 through float32, int8/uint8 through int32 (true for arithmetic; false for ops
  /// that handle dtypes themselves, such as Cast, Shape and the quantised ops).
  bool storage_via_compute = true;
};

/// The table from (domain, op type) to implementation. global() holds braid's ops; users add
/// their own custom ops to it (or to a registry they pass in OnnxOptions).
class OpRegistry {
 public:
  static OpRegistry& global();
  OpRegistry() = default;
  /// A copy (to extend a registry without changing the original), with its own index.
  OpRegistry(const OpRegistry& other) : ops_(other.ops_) { index(); }
  OpRegistry& operator=(const OpRegistry& other) {
    if (this != &other) {
      ops_ = other.ops_;
      index();
    }
    return *this;
  }
  /// Adds or replaces an op.
  void add(OpSchema schema);
  const OpSchema* find(const std::string& domain, const std::string& op_type) const;
  /// Every registered op type of domain ("" for ai.onnx), sorted.
  std::vector<std::string> op_types(const std::string& domain = "") const;
  /// The domains with at least one registered op, sorted ("" for ai.onnx first).
  std::vector<std::string> domains() const;

 private:
  void index();
  std::map<std::pair<std::string, std::string>, OpSchema> ops_;
  std::unordered_map<std::string, const OpSchema*> default_domain_;  // ai.onnx's, hashed: found for every node run
};

/// Every problem the preflight found ("Conv 'conv1': attribute 'foo' is not supported"); empty when
/// the model can run.
std::vector<std::string> preflight(const Model& model, const OpRegistry& registry = OpRegistry::global());

struct OnnxOptions {
  /// Initialisers load as parameters that do not require gradients (inference, or a frozen backbone).
  bool frozen = false;
  /// Floating-point Constant nodes (more than one element) become weights like initialisers, so
  /// models whose exporter stores weights as Constants can be fine-tuned (Note [Constants as weights]).
  bool constants_as_weights = true;
  /// Where ops are looked up; nullptr for OpRegistry::global().
  const OpRegistry* registry = nullptr;
  /// Inference passes to leave out, by name ("conv", "chain", ...; "all"), to find which one a wrong
  /// result comes from; added to those BRAID_ONNX_PASSES_OFF names (onnx_passes() lists them).
  std::vector<std::string> disabled_passes{};
};

/// An inference pass of OnnxModule (Note [Graph passes] in onnx/passes/passes.cpp): its name, the
/// op of braid's domain it writes, and what it fuses.
struct OnnxPass {
  std::string name, op_type, what;
};
/// Every inference pass, in the order they run.
std::vector<OnnxPass> onnx_passes();

/// Where a pass fired: the pass, the fused node's name, and the nodes it replaced ("Conv 'c1'").
struct FiredPass {
  std::string pass, node;
  std::vector<std::string> replaced;
};

/// An imported ONNX model as a braid module. It starts in eval mode (BatchNormalization uses the
/// stored statistics, Dropout is the identity, as in onnxruntime); train() switches to batch
/// statistics (updating the running ones, as PyTorch) and active dropout for fine-tuning.
class OnnxModule : public nn::Module {
 public:
  explicit OnnxModule(Model model, const OnnxOptions& options = {});
  /// Loads and imports path (load_model, then the preflight). Python: braid.onnx.load(path,
  /// frozen=False, constants_as_weights=True), the options' fields as keywords.
  static std::shared_ptr<OnnxModule> load(const std::string& path, const OnnxOptions& options = {},
                                          const LoadOptions& load_options = {});

  /// The model's single output for its single input (throws naming the graph's inputs/outputs otherwise).
  Tensor forward(const Tensor& x) override;
  /// Outputs in the graph's order for inputs in the graph's order (initialisers that are also graph
  /// inputs may be left out, keeping their stored value).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  /// Outputs by name for inputs by name.
  std::map<std::string, Tensor> run_named(const std::map<std::string, Tensor>& inputs);

  /// The graph as a Sequential of segments, cut wherever one activation alone crosses (Note [Cutting
  /// an ONNX graph into layers]), sharing this module's weights: what pipeline training partitions.
  std::shared_ptr<nn::Sequential> to_sequential();
  /// Names of the inputs a caller feeds (graph inputs that are not initialisers), in order.
  const std::vector<std::string>& input_names() const { return input_names_; }
  std::vector<std::string> output_names() const;
  const Model& model() const { return model_; }
  /// Per-op-type time accounting (as onnxruntime's profiler): while on, every run adds each node's
  /// wall time (milliseconds) and call count under its op type.
  void set_profiling(bool on) { profiling_ = on; }
  struct OpTime {
    double ms = 0;
    int64_t calls = 0;
  };
  const std::map<std::string, OpTime>& profile() const { return profile_; }
  /// The inference passes that rewrote the graph, one entry per fused node, in graph order.
  std::vector<FiredPass> fired_passes() const;
  /// Initialiser name -> the parameter or buffer tensor that holds it (shared with state_dict()).
  const std::map<std::string, Tensor>& weights() const { return weights_; }
  std::string describe() const override;

 private:
  std::vector<Tensor> run_ordered(const std::vector<Tensor>& inputs);
  Model model_;
  const OpRegistry* registry_;
  std::vector<std::string> input_names_;
  std::map<std::string, Tensor> weights_;  // initialiser name -> the parameter or buffer tensor
  // The plans (value lifetimes, kept values) of inference, with the passes, and of training and
  // every run recording gradients, the graph as written; each with the weights' scope, numbered as
  // it numbers values, every run's outer scope.
  std::shared_ptr<ExecPlan> infer_plan_, train_plan_;
  std::shared_ptr<Scope> infer_weights_, train_weights_;
  bool profiling_ = false;
  std::map<std::string, OpTime> profile_;
};

/// Registers braid's ai.onnx ops into r (called once by OpRegistry::global()).
void register_builtin_ops(OpRegistry& r);

}  // namespace braid::onnx
