// SGD with momentum, dampening, Nesterov momentum, weight decay and maximize, as
// torch.optim.SGD's single-tensor path (torch/optim/sgd.py).
#include "braid/optim/optimizers.h"

#include <cmath>

#include "backend/backend.h"
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

// Runs of neighbours on one device and dtype that are past their first step (their momentum buffers
// exist, or there is no momentum) go to the backend's multi-tensor step (Note [Multi-tensor SGD] in
// src/backend/cuda/sgd.cu); the rest, and a backend without one, step one by one.
void SGD::update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params) {
  const double momentum = group.get("momentum");
  const braid::detail::SgdStep s{group.get("lr"), momentum, group.get("dampening"), group.get("weight_decay"),
                                 group.get("nesterov") != 0, group.get("maximize") != 0};
  const auto ready = [&](const ParamUpdate& u) { return momentum == 0 || u.state->tensors.count("momentum_buffer") > 0; };
  for (size_t i = 0; i < params.size();) {
    const Tensor& p0 = params[i].param;
    size_t j = i;
    while (j < params.size() && ready(params[j]) && params[j].param.device() == p0.device() &&
           params[j].param.dtype() == p0.dtype())
      ++j;
    if (j - i > 1) {
      std::vector<braid::detail::SgdTensors> run;
      for (size_t k = i; k < j; ++k)
        run.push_back({params[k].param, params[k].grad,
                       momentum != 0 ? params[k].state->tensors.at("momentum_buffer") : Tensor()});
      if (braid::detail::backend_for(p0.device()).fused().sgd_steps(run, s)) {
        for (const auto& t : run)
          for (const Tensor* u : {&t.p, &t.buf})
            if (u->defined()) u->storage()->bump_version();  // Note [Storage versions]
        i = j;
        continue;
      }
    }
    j = std::max(j, i + 1);
    for (size_t k = i; k < j; ++k) update(group, params[k].param, params[k].grad, *params[k].state);
    i = j;
  }
}

}  // namespace braid::optim
