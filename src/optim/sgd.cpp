// SGD with momentum, dampening, Nesterov momentum, weight decay and maximize, as
// torch.optim.SGD's single-tensor path (torch/optim/sgd.py).
#include "braid/optim/optimizers.h"

#include <cmath>

#include "optim/update.h"

namespace braid::optim {

using namespace detail;

namespace {
std::map<std::string, double> sgd_defaults(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}
}  // namespace

SGD::SGD(const std::vector<Tensor>& params, const SGDOptions& options) : SGD(std::vector<ParamGroup>{{params, {}}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults) : Optimizer("SGD", sgd_defaults(defaults)) {
  init_groups(std::move(groups));
}

void SGD::check_options(const ParamGroup& group, size_t index) const {
  const double lr = group.get("lr");
  BRAID_CHECK(!std::isnan(lr), "SGD: parameter group ", index,
              " has no learning rate; set SGDOptions::lr or the group's \"lr\" (SGD has no default)");
  BRAID_CHECK(lr >= 0, "SGD: invalid learning rate ", lr, " in parameter group ", index);
  BRAID_CHECK(group.get("momentum") >= 0, "SGD: invalid momentum ", group.get("momentum"), " in parameter group ", index);
  BRAID_CHECK(group.get("weight_decay") >= 0, "SGD: invalid weight_decay ", group.get("weight_decay"),
              " in parameter group ", index);
  BRAID_CHECK(!group.get("nesterov") || (group.get("momentum") > 0 && group.get("dampening") == 0),
              "SGD: Nesterov momentum requires a momentum and zero dampening (parameter group ", index, ")");
}

void SGD::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get("lr"), momentum = group.get("momentum"), dampening = group.get("dampening");
  Tensor d = effective_grad(param, grad, group.get("weight_decay"), group.get("maximize") != 0);
  Tensor scratch;
  if (momentum != 0) {
    auto it = state.tensors.find("momentum_buffer");
    if (it == state.tensors.end()) {
      state.tensors["momentum_buffer"] = d.is_same(grad) ? d.clone() : d;  // a scratch d is ours to keep
    } else {
      Tensor& buf = it->second;
      buf.mul_(momentum);
      if (dampening == 0) {
        buf.add_(d);
      } else {
        scratch = scratch_like(param);
        mul_into(scratch, d, 1 - dampening);
        buf.add_(scratch);
      }
    }
    const Tensor& buf = state.tensors["momentum_buffer"];
    if (group.get("nesterov")) {
      if (!scratch.defined()) scratch = scratch_like(param);
      mul_into(scratch, buf, momentum);
      add_into(scratch, scratch, d);
      d = scratch;
    } else {
      d = buf;
    }
  }
  if (!scratch.defined()) scratch = scratch_like(param);
  mul_into(scratch, d, -lr);
  Tensor p = param;
  p.add_(scratch);
}

}  // namespace braid::optim
