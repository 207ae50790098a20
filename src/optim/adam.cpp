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

namespace {

// One parameter's step, worked out: its numbers and operands (g the effective gradient).
struct Prepared {
  braid::detail::AdamStep numbers;
  braid::detail::AdamTensors t;
};

Prepared prepare(const ParamGroup& group, bool decoupled, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), beta1 = group.get("beta1"), beta2 = group.get("beta2"), eps = group.get("eps");
  const double weight_decay = group.get("weight_decay");
  const double step = ++state.scalars["step"];
  Tensor& m = state_tensor(state, "exp_avg", param);
  Tensor& v = state_tensor(state, "exp_avg_sq", param);
  const Tensor max_v = group.get("amsgrad") != 0 ? state_tensor(state, "max_exp_avg_sq", param) : Tensor();
  const Tensor g = effective_grad(param, grad, decoupled ? 0.0 : weight_decay, group.get("maximize") != 0);
  const double bias_correction1 = 1 - std::pow(beta1, step), bias_correction2 = 1 - std::pow(beta2, step);
  return {{decoupled ? 1 - lr * weight_decay : 1.0, beta1, beta2, lr / bias_correction1, std::sqrt(bias_correction2), eps},
          {param, g, m, v, max_v}};
}

// The step as ops: the definition of the fused kernels (Note [Fused kernels]).
void composite(const Prepared& a) {
  const braid::detail::AdamStep& s = a.numbers;
  auto [p, g, m, v, max_v] = a.t;  // handles: the in-place ops change the tensors themselves
  if (s.decay != 1) p.mul_(s.decay);
  Tensor tmp = scratch_like(p);
  // m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
  m.mul_(s.beta1);
  mul_into(tmp, g, 1 - s.beta1);
  m.add_(tmp);
  v.mul_(s.beta2);
  mul_into(tmp, g, g);
  mul_into(tmp, tmp, 1 - s.beta2);
  v.add_(tmp);
  Tensor second = v;
  if (max_v.defined()) {
    max_into(max_v, max_v, v);
    second = max_v;
  }
  // p -= step_size * m / (sqrt(second) / sqrt(bias_correction2) + eps)
  sqrt_into(tmp, second);
  div_into(tmp, tmp, s.sqrt_bias_correction2);
  add_into(tmp, tmp, s.eps);
  div_into(tmp, m, tmp);
  mul_into(tmp, tmp, -s.step_size);
  p.add_(tmp);
}

// One parameter: the backend's one-pass step where it has one, else the composite.
void single(const Prepared& a) {
  const auto& [p, g, m, v, max_v] = a.t;
  if (braid::detail::backend_for(p.device()).fused().adam_step(p, g, m, v, max_v, a.numbers))
    p.storage()->bump_version();  // Note [Storage versions]
  else
    composite(a);
}

bool same_numbers(const braid::detail::AdamStep& a, const braid::detail::AdamStep& b) {
  return a.decay == b.decay && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.step_size == b.step_size &&
         a.sqrt_bias_correction2 == b.sqrt_bias_correction2 && a.eps == b.eps;
}

}  // namespace

void Adam::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  single(prepare(group, decoupled_, param, grad, state));
}

void Adam::update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params) {
  std::vector<Prepared> prepared;
  prepared.reserve(params.size());
  for (const ParamUpdate& u : params) prepared.push_back(prepare(group, decoupled_, u.param, u.grad, *u.state));
  // Runs of neighbours that one multi-tensor launch can take: one device, dtype, amsgrad and step.
  for (size_t i = 0; i < prepared.size();) {
    const Tensor& p0 = prepared[i].t.p;
    size_t j = i + 1;
    while (j < prepared.size() && prepared[j].t.p.device() == p0.device() && prepared[j].t.p.dtype() == p0.dtype() &&
           prepared[j].t.max_v.defined() == prepared[i].t.max_v.defined() &&
           same_numbers(prepared[j].numbers, prepared[i].numbers))
      ++j;
    std::vector<braid::detail::AdamTensors> run;
    for (size_t k = i; k < j; ++k) run.push_back(prepared[k].t);
    if (j - i > 1 && braid::detail::backend_for(p0.device()).fused().adam_steps(run, prepared[i].numbers)) {
      for (const auto& t : run) t.p.storage()->bump_version();  // Note [Storage versions]
    } else {
      for (size_t k = i; k < j; ++k) single(prepared[k]);
    }
    i = j;
  }
}

}  // namespace braid::optim
