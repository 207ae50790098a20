// Adagrad (with learning-rate decay, an initial accumulator, weight decay and maximize), as the
// dense single-tensor path of torch/optim/adagrad.py.
#include <cmath>

#include "braid/optim/optimizers.h"
#include "optim/update.h"

namespace braid::optim {

using namespace detail;

namespace {
std::map<std::string, double> adagrad_defaults(const AdagradOptions& o) {
  return {{"lr", o.lr},
          {"lr_decay", o.lr_decay},
          {"weight_decay", o.weight_decay},
          {"initial_accumulator_value", o.initial_accumulator_value},
          {"eps", o.eps},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}
}  // namespace

Adagrad::Adagrad(const std::vector<Tensor>& params, const AdagradOptions& options)
    : Adagrad(std::vector<ParamGroup>{{params, {}}}, options) {}

Adagrad::Adagrad(std::vector<ParamGroup> groups, const AdagradOptions& defaults)
    : Optimizer("Adagrad", adagrad_defaults(defaults)) {
  init_groups(std::move(groups));
}

void Adagrad::check_options(const ParamGroup& group, size_t index) const {
  for (const char* key : {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"})
    BRAID_CHECK(group.get(key) >= 0, "Adagrad: invalid ", key, " ", group.get(key), " in parameter group ", index,
                "; expected a value >= 0");
}

void Adagrad::init_state(const ParamGroup& group, const Tensor& param, ParamState& state) {
  state.scalars["step"] = 0;
  state_tensor(state, "sum", param, group.get("initial_accumulator_value"));
}

void Adagrad::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double step = ++state.scalars["step"];
  const double clr = group.get("lr") / (1 + (step - 1) * group.get("lr_decay"));
  Tensor g = effective_grad(param, grad, group.get("weight_decay"), group.get("maximize") != 0);
  Tensor& sum = state_tensor(state, "sum", param, group.get("initial_accumulator_value"));
  Tensor tmp = scratch_like(param);
  // s += g^2;  p -= clr * g / (sqrt(s) + eps)
  mul_into(tmp, g, g);
  sum.add_(tmp);
  sqrt_into(tmp, sum);
  add_into(tmp, tmp, group.get("eps"));
  div_into(tmp, g, tmp);
  mul_into(tmp, tmp, -clr);
  Tensor p = param;
  p.add_(tmp);
}

}  // namespace braid::optim
