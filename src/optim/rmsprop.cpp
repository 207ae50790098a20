// RMSprop (with momentum, centering, weight decay and maximize), as the single-tensor path of
// torch/optim/rmsprop.py.
#include <cmath>

#include "braid/optim/optimizers.h"
#include "optim/update.h"

namespace braid::optim {

using namespace detail;

namespace {
std::map<std::string, double> rmsprop_defaults(const RMSpropOptions& o) {
  return {{"lr", o.lr},
          {"alpha", o.alpha},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"momentum", o.momentum},
          {"centered", o.centered ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}
}  // namespace

RMSprop::RMSprop(const std::vector<Tensor>& params, const RMSpropOptions& options)
    : RMSprop(std::vector<ParamGroup>{{params, {}}}, options) {}

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& defaults)
    : Optimizer("RMSprop", rmsprop_defaults(defaults)) {
  init_groups(std::move(groups));
}

void RMSprop::check_options(const ParamGroup& group, size_t index) const {
  for (const char* key : {"lr", "eps", "momentum", "weight_decay", "alpha"})
    BRAID_CHECK(group.get(key) >= 0, "RMSprop: invalid ", key, " ", group.get(key), " in parameter group ", index,
                "; expected a value >= 0");
}

void RMSprop::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), alpha = group.get("alpha"), eps = group.get("eps");
  const double momentum = group.get("momentum");
  ++state.scalars["step"];
  Tensor g = effective_grad(param, grad, group.get("weight_decay"), group.get("maximize") != 0);
  Tensor tmp = scratch_like(param);
  // s = alpha s + (1 - alpha) g^2
  Tensor& square_avg = state_tensor(state, "square_avg", param);
  square_avg.mul_(alpha);
  mul_into(tmp, g, g);
  mul_into(tmp, tmp, 1 - alpha);
  square_avg.add_(tmp);
  // avg = sqrt(s - a^2) + eps with a = alpha a + (1 - alpha) g when centered, else sqrt(s) + eps
  if (group.get("centered")) {
    Tensor& grad_avg = state_tensor(state, "grad_avg", param);
    grad_avg.mul_(alpha);
    mul_into(tmp, g, 1 - alpha);
    grad_avg.add_(tmp);
    mul_into(tmp, grad_avg, grad_avg);
    sub_into(tmp, square_avg, tmp);
    sqrt_into(tmp, tmp);
  } else {
    sqrt_into(tmp, square_avg);
  }
  add_into(tmp, tmp, eps);
  div_into(tmp, g, tmp);  // g / avg
  Tensor p = param;
  if (momentum > 0) {
    Tensor& buf = state_tensor(state, "momentum_buffer", param);
    buf.mul_(momentum);
    buf.add_(tmp);
    mul_into(tmp, buf, -lr);
  } else {
    mul_into(tmp, tmp, -lr);
  }
  p.add_(tmp);
}

}  // namespace braid::optim
