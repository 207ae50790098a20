// Module: the base of every layer and model. It owns named parameters, buffers and child modules
// in registration order, so that dotted names ("features.0.weight") are stable across state
// dicts, checkpoints, ONNX initialisers and Python. Layers never write backward: their forward is
// made of differentiable ops.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "braid/tensor.h"

namespace braid::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = std::map<std::string, Tensor>;

/// Held by std::shared_ptr (std::make_shared, register_module), as libtorch's modules are:
/// named_modules() and modules() hand out the module itself next to its descendants.
class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The layer's computation on one input. Modules with several inputs add their own overloads.
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// "Linear", "Conv2d", ...
  const std::string& type_name() const { return type_name_; }
  /// One line describing the configuration, e.g. "Linear(in=784, out=10, bias=true)".
  virtual std::string describe() const { return type_name_; }

  /// Parameters (trainable tensors) of this module and, with recurse, its descendants, in order.
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Buffers: state that is saved but not trained (BatchNorm's running statistics).
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  /// The direct children, in registration order.
  std::vector<std::pair<std::string, ModulePtr>> named_children() const { return children_; }
  std::vector<ModulePtr> children() const;
  /// This module first (as (prefix, self), unless include_self is false), then every descendant with
  /// its dotted path under prefix, depth first, as libtorch's and PyTorch's named_modules(). Listing
  /// itself needs the module to be held by a std::shared_ptr; a ValueError says so otherwise.
  std::vector<std::pair<std::string, ModulePtr>> named_modules(const std::string& prefix = "",
                                                               bool include_self = true) const;
  std::vector<ModulePtr> modules(bool include_self = true) const;
  /// The child at a dotted path ("features.3"); throws IndexError listing the known names.
  ModulePtr child(const std::string& path) const;
  /// Replaces the child at a dotted path (fine-tuning swaps a classifier head this way).
  void replace_child(const std::string& path, ModulePtr replacement);

  /// Training mode (dropout active, batch statistics) for this module and its descendants.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Parameters and buffers by dotted name (tensors are shared, not copied).
  StateDict state_dict() const;
  /// Copies values in; strict requires exactly the same names. Shapes must match; nothing is
  /// written unless every entry checks out.
  void load_state_dict(const StateDict& state, bool strict = true);
  /// Clears every parameter's gradient.
  void zero_grad();
  /// Converts every floating-point parameter, buffer and gradient of this module and its
  /// descendants to dtype in place: the tensor handles layers hold stay valid (see Note [Module::to]).
  void to(DType dtype);
  /// Moves every parameter, buffer and gradient of this module and its descendants to device in
  /// place, as PyTorch's Module.to(device): the handles layers and optimizers hold stay valid.
  void to(Device device);
  /// The device of the first parameter or buffer (the CPU for a module without any).
  Device device() const;
  /// Number of parameter elements.
  int64_t num_parameters() const;
  /// A multi-line tree of the model, as PyTorch prints it.
  std::string to_string() const;

  // Registration is public, as in PyTorch: layers call it from their constructors, and a model
  // written in Python registers the attributes it assigns.
  /// Registers a parameter under name and returns it (marked requires_grad unless frozen).
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  /// Points a registered buffer at a new tensor (running statistics are replaced each step).
  void set_buffer(const std::string& name, Tensor value);

 private:
  void add_child(const std::string& name, ModulePtr m);
  void check_new_name(const std::string& name) const;
  std::string type_name_;
  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

/// Runs children in order, each on the previous one's output.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<ModulePtr>& modules);
  /// Appends a module named by its position ("0", "1", ...) unless a name is given.
  Sequential& add(ModulePtr m, const std::string& name = "");
  Tensor forward(const Tensor& x) override;
  size_t size() const { return named_children().size(); }
  ModulePtr at(size_t i) const { return named_children().at(i).second; }
};

/// Holds modules by position without running them; the owner decides how.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList& add(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return named_children().size(); }
  ModulePtr at(size_t i) const { return named_children().at(i).second; }
};

}  // namespace braid::nn
