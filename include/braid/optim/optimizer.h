// The optimizer base: parameter groups with their hyperparameters, per-parameter state, step and
// zero_grad, a state dict of plain named tensors and numbers that a checkpoint stores, and
// gradient clipping by global norm. The update rules live in the subclasses (optimizers.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "braid/tensor.h"

namespace braid::optim {

/// Parameters that share hyperparameters. options holds them by PyTorch's names ("lr",
/// "weight_decay", "momentum", "beta1", ...; flags such as "nesterov" as 0 or 1). A group handed to
/// an optimizer may leave options out: they take the optimizer's defaults. Schedulers change "lr"
/// (and "momentum" or "beta1") here between steps.
struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;

  /// The option's value; throws IndexError listing the group's options when it has none of that name.
  double get(const std::string& name) const;
  /// Changes an option the group already has (a typo throws rather than adding a new one).
  void set(const std::string& name, double value);
  double lr() const { return get("lr"); }
};

// Note [Optimizer state format]
// state_dict() returns an OptimizerState of copies (later steps do not change it):
//   scalars "group.<g>.num_params"      number of parameters in group g (g = 0, 1, ...)
//           "group.<g>.<option>"        every option of group g ("group.0.lr", "group.1.momentum")
//           "state.<i>.<name>"          a number of parameter i's state ("state.3.step")
//   tensors "state.<i>.<name>"          a tensor of parameter i's state ("state.3.exp_avg")
// where i counts parameters across groups in order (group 0's first is 0), as PyTorch numbers them.
// A parameter that has never had a gradient has no "state.<i>.*" entries. load_state_dict() checks
// everything first (group and parameter counts, option names, which tell one optimizer from
// another, state names, shapes and dtypes) and throws a ValueError naming the first mismatching
// key; only then does it replace the options and the state, so nothing is loaded half-way.
struct OptimizerState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

/// The state an optimizer keeps for one parameter (PyTorch's names: "step", "exp_avg", ...).
struct ParamState {
  std::map<std::string, double> scalars;
  std::map<std::string, Tensor> tensors;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// "SGD", "Adam", ...
  const std::string& name() const { return name_; }
  /// Updates every parameter that has a gradient; parameters without one are skipped.
  void step();
  /// Clears the gradients: drops them (set_to_none, the default, as PyTorch 2) or fills them with 0.
  void zero_grad(bool set_to_none = true);

  /// The groups, in order. Options may be changed between steps (schedulers do); parameters are
  /// added with add_param_group, which checks them, not by editing a group's params.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  /// Adds a group; its missing options take the defaults. A parameter may be in one group only.
  void add_param_group(ParamGroup group);
  /// The options every group has, with their default values.
  const std::map<std::string, double>& defaults() const { return defaults_; }
  /// The state of param, or nullptr before its first update.
  const ParamState* state(const Tensor& param) const;

  /// See Note [Optimizer state format].
  OptimizerState state_dict() const;
  void load_state_dict(const OptimizerState& state);

 protected:
  Optimizer(std::string name, std::map<std::string, double> defaults);
  /// Adds the constructor's groups (each with add_param_group).
  void init_groups(std::vector<ParamGroup> groups);
  /// Throws ValueError (naming the optimizer, the group and the option) for an invalid value.
  virtual void check_options(const ParamGroup& group, size_t index) const = 0;
  /// One parameter's update; grad has param's shape and dtype; runs without autograd recording.
  virtual void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) = 0;
  /// A parameter with its gradient and its state, as update_group takes them.
  struct ParamUpdate {
    Tensor param, grad;
    ParamState* state;
  };
  /// The updates of a group's parameters that have gradients, in the group's order: update on each
  /// by default; an optimizer with a multi-tensor kernel (Adam) steps them together.
  virtual void update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params);
  /// The state names a parameter may have, for load_state_dict's checks.
  virtual std::vector<std::string> state_tensor_names() const = 0;
  virtual std::vector<std::string> state_scalar_names() const { return {"step"}; }
  /// Creates state before the first step (Adagrad's accumulator); most optimizers start lazily.
  virtual void init_state(const ParamGroup&, const Tensor&, ParamState&) {}

 private:
  std::string name_;
  std::map<std::string, double> defaults_;
  std::vector<ParamGroup> groups_;
  // Keyed by the parameter's TensorImpl: a parameter's identity, as PyTorch keys state by tensor.
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

/// Scales the gradients of params in place so that their global norm of order norm_type (2, 1, any
/// p > 0, or infinity for the largest magnitude) is at most max_norm, as
/// torch.nn.utils.clip_grad_norm_: each gradient is multiplied by max_norm / (total + 1e-6) when
/// that is below 1. Returns the total norm before clipping. A NaN or infinite total throws when
/// error_if_nonfinite, and otherwise clips anyway (the gradients become NaN), as PyTorch.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace braid::optim
