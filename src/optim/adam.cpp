// Adam and AdamW (with amsgrad and maximize), as the single-tensor paths of torch/optim/adam.py
// and adamw.py. AdamW differs only in decaying the parameter instead of adding the decay to the
// gradient, so both share one update.
#include <cmath>

#include "braid/optim/optimizers.h"
#include "backend/backend.h"
#include "optim/update.h"

namespace braid::optim {

using namespace detail;

namespace {
std::map<std::string, double> adam_defaults(const AdamOptions& o) {
  return {{"lr", o.lr},
          {"beta1", o.betas.first},
          {"beta2", o.betas.second},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

AdamOptions as_adam(const AdamWOptions& o) {
  return {o.lr, o.betas, o.eps, o.weight_decay, o.amsgrad, o.maximize};
}
}  // namespace

Adam::Adam(const std::vector<Tensor>& params, const AdamOptions& options)
    : Adam(std::vector<ParamGroup>{{params, {}}}, options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults) : Adam("Adam", false, defaults) {
  init_groups(std::move(groups));
}

Adam::Adam(std::string name, bool decoupled_weight_decay, const AdamOptions& defaults)
    : Optimizer(std::move(name), adam_defaults(defaults)), decoupled_(decoupled_weight_decay) {}

AdamW::AdamW(const std::vector<Tensor>& params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{{params, {}}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults) : Adam("AdamW", true, as_adam(defaults)) {
  init_groups(std::move(groups));
}

void Adam::check_options(const ParamGroup& group, size_t index) const {
  auto check = [&](const char* key, bool ok, const char* expected) {
    BRAID_CHECK(ok, name(), ": invalid ", key, " ", group.get(key), " in parameter group ", index, "; expected ",
                expected);
  };
  check("lr", group.get("lr") >= 0, "a value >= 0");
  check("eps", group.get("eps") >= 0, "a value >= 0");
  check("beta1", group.get("beta1") >= 0 && group.get("beta1") < 1, "a value in [0, 1)");
  check("beta2", group.get("beta2") >= 0 && group.get("beta2") < 1, "a value in [0, 1)");
  check("weight_decay", group.get("weight_decay") >= 0, "a value >= 0");
}

void Adam::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2"), eps = group.get("eps");
  const double weight_decay = group.get("weight_decay");
  const bool amsgrad = group.get("amsgrad") != 0;
  Tensor p = param;
  const double step = ++state.scalars["step"];
  Tensor& m = state_tensor(state, "exp_avg", param);
  Tensor& v = state_tensor(state, "exp_avg_sq", param);

  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  // One pass over memory where the backend has the fused step (Note [Fused kernels]); the
  // composite below is its definition.
  {
    Tensor g = effective_grad(param, grad, decoupled_ ? 0.0 : weight_decay, group.get("maximize") != 0);
    const Tensor max_v = amsgrad ? state_tensor(state, "max_exp_avg_sq", param) : Tensor();
    const braid::detail::AdamStep fused{decoupled_ ? 1 - lr * weight_decay : 1.0, beta1, beta2, step_size,
                                        std::sqrt(bias_correction2), eps};
    if (braid::detail::backend_for(p.device()).fused().adam_step(p, g, m, v, max_v, fused)) {
      p.storage()->bump_version();  // Note [Storage versions]
      return;
    }
  }

  if (decoupled_) p.mul_(1 - lr * weight_decay);
  Tensor g = effective_grad(param, grad, decoupled_ ? 0.0 : weight_decay, group.get("maximize") != 0);
  Tensor tmp = scratch_like(param);
  // m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
  m.mul_(beta1);
  mul_into(tmp, g, 1 - beta1);
  m.add_(tmp);
  v.mul_(beta2);
  mul_into(tmp, g, g);
  mul_into(tmp, tmp, 1 - beta2);
  v.add_(tmp);

  Tensor second = v;
  if (amsgrad) {
    second = state_tensor(state, "max_exp_avg_sq", param);
    max_into(second, second, v);
  }
  // p -= step_size * m / (sqrt(second) / sqrt(bias_correction2) + eps)
  sqrt_into(tmp, second);
  div_into(tmp, tmp, std::sqrt(bias_correction2));
  add_into(tmp, tmp, eps);
  div_into(tmp, m, tmp);
  mul_into(tmp, tmp, -step_size);
  p.add_(tmp);
}

}  // namespace braid::optim
