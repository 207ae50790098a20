// The optimizers: SGD, Adam, AdamW, RMSprop and Adagrad, each following PyTorch 1.13's update formulas
// (torch/optim/*.py, the single-tensor path) so that a model ported from PyTorch trains alike. Each
// takes a typed options struct, whose values become the defaults of every parameter group.
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "braid/optim/optimizer.h"

namespace braid::optim {

struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();  // required, as in PyTorch
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

/// Stochastic gradient descent with optional (Nesterov) momentum:
///   g = grad (negated if maximize) + weight_decay * p
///   b = g on the first step, else momentum * b + (1 - dampening) * g
///   p -= lr * (nesterov ? g + momentum * b : b)     (b = g when momentum is 0)
/// State: "momentum_buffer".
class SGD : public Optimizer {
 public:
  /// options.lr has no default (as in PyTorch): one of options or the groups must set it.
  SGD(const std::vector<Tensor>& params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> params, const SGDOptions& defaults = {});

 protected:
  void check_options(const ParamGroup& group, size_t index) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params) override;
  std::vector<std::string> state_tensor_names() const override { return {"momentum_buffer"}; }
  std::vector<std::string> state_scalar_names() const override { return {}; }
};

struct AdamOptions {
  double lr = 1e-3;
  /// beta1 and beta2 (the param groups' options of those names), as PyTorch's betas.
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
};

/// Adam (Kingma and Ba), with weight decay added to the gradient (L2), as torch.optim.Adam:
///   g = grad (negated if maximize) + weight_decay * p;  t += 1
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  vmax = max(vmax, v) if amsgrad
///   p -= lr / (1 - beta1^t) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1 - beta2^t) + eps)
/// State: "step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad).
class Adam : public Optimizer {
 public:
  Adam(const std::vector<Tensor>& params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> params, const AdamOptions& defaults = {});

 protected:
  Adam(std::string name, bool decoupled_weight_decay, const AdamOptions& defaults);
  void check_options(const ParamGroup& group, size_t index) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  /// Runs of parameters on one device with one dtype and step go to the backend's multi-tensor
  /// kernel where it has one (Note [Fused kernels]), the others one by one.
  void update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params) override;
  std::vector<std::string> state_tensor_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }

 private:
  bool decoupled_;  // AdamW: decay the parameter, not the gradient
};

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

/// Adam with decoupled weight decay (Loshchilov and Hutter), as torch.optim.AdamW: first
/// p *= 1 - lr * weight_decay, then Adam's update without weight decay in the gradient.
class AdamW : public Adam {
 public:
  AdamW(const std::vector<Tensor>& params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> params, const AdamWOptions& defaults = {});
};

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;
};

/// RMSprop, as torch.optim.RMSprop:
///   g = grad (negated if maximize) + weight_decay * p
///   s = alpha s + (1 - alpha) g^2;  a = alpha a + (1 - alpha) g (centered)
///   d = sqrt(centered ? s - a^2 : s) + eps
///   momentum > 0: b = momentum b + g / d, p -= lr b;  else p -= lr g / d
/// State: "step", "square_avg", "momentum_buffer" (momentum > 0), "grad_avg" (centered).
class RMSprop : public Optimizer {
 public:
  RMSprop(const std::vector<Tensor>& params, const RMSpropOptions& options = {});
  RMSprop(std::vector<ParamGroup> params, const RMSpropOptions& defaults = {});

 protected:
  void check_options(const ParamGroup& group, size_t index) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_tensor_names() const override { return {"square_avg", "momentum_buffer", "grad_avg"}; }
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  bool maximize = false;
};

/// Adagrad, as torch.optim.Adagrad:
///   g = grad (negated if maximize) + weight_decay * p;  t += 1
///   s += g^2;  p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)
/// State: "step", "sum" (created for every parameter at construction, at initial_accumulator_value).
class Adagrad : public Optimizer {
 public:
  Adagrad(const std::vector<Tensor>& params, const AdagradOptions& options = {});
  Adagrad(std::vector<ParamGroup> params, const AdagradOptions& defaults = {});

 protected:
  void check_options(const ParamGroup& group, size_t index) const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<std::string> state_tensor_names() const override { return {"sum"}; }
  void init_state(const ParamGroup& group, const Tensor& param, ParamState& state) override;
};

}  // namespace braid::optim
