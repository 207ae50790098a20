// The optimizer base: parameter groups and their options, the step loop that hands each parameter
// with a gradient to the subclass's update, and the state dict (Note [Optimizer state format]).
#include "braid/optim/optimizer.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid::optim {

namespace {

std::string join_keys(const std::map<std::string, double>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
  return s;
}

std::string group_key(size_t g, const std::string& name) { return "group." + std::to_string(g) + "." + name; }
std::string state_key(size_t i, const std::string& name) { return "state." + std::to_string(i) + "." + name; }

/// Splits "state.<i>.<name>" into i and name; false when key has another form.
bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  if (key.rfind("state.", 0) != 0) return false;
  size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot + 1 == key.size()) return false;
  for (size_t c = 6; c < dot; ++c)
    if (key[c] < '0' || key[c] > '9') return false;
  index = std::stoul(key.substr(6, dot - 6));
  name = key.substr(dot + 1);
  return true;
}

}  // namespace

double ParamGroup::get(const std::string& name) const {
  auto it = options.find(name);
  BRAID_CHECK_T(IndexError, it != options.end(), "parameter group has no option '", name, "'; it has: ",
                join_keys(options));
  return it->second;
}

void ParamGroup::set(const std::string& name, double value) {
  auto it = options.find(name);
  BRAID_CHECK_T(IndexError, it != options.end(), "parameter group has no option '", name, "'; it has: ",
                join_keys(options));
  it->second = value;
}

Optimizer::Optimizer(std::string name, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::init_groups(std::vector<ParamGroup> groups) {
  size_t count = 0;
  for (const ParamGroup& g : groups) count += g.params.size();
  BRAID_CHECK(count > 0, name_, ": got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t index = groups_.size();
  for (const auto& [k, v] : group.options)
    BRAID_CHECK(defaults_.count(k), name_, ": parameter group ", index, " has unknown option '", k, "'; known: ",
                join_keys(defaults_));
  for (const auto& [k, v] : defaults_) group.options.emplace(k, v);  // keeps the group's own values
  std::unordered_set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.impl_ptr().get());
  for (size_t j = 0; j < group.params.size(); ++j) {
    const Tensor& p = group.params[j];
    BRAID_CHECK(p.defined(), name_, ": parameter ", j, " of group ", index, " is undefined");
    BRAID_CHECK_T(TypeError, is_floating(p.dtype()), name_, ": parameter ", j, " of group ", index,
                  " must be floating-point, got ", dtype_name(p.dtype()));
    BRAID_CHECK(p.is_leaf(), name_, ": parameter ", j, " of group ", index, " (shape ", shape_str(p.shape()),
                ") is not a leaf tensor; optimize the leaf it was computed from");
    BRAID_CHECK(seen.insert(p.impl_ptr().get()).second, name_, ": parameter ", j, " of group ", index, " (shape ",
                shape_str(p.shape()), ") appears in more than one place; each parameter may be in one group once");
  }
  check_options(group, index);
  for (const Tensor& p : group.params) {
    ParamState s;
    init_state(group, p, s);
    if (!s.scalars.empty() || !s.tensors.empty()) state_[p.impl_ptr().get()] = std::move(s);
  }
  groups_.push_back(std::move(group));
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl_ptr().get());
  return it == state_.end() ? nullptr : &it->second;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    std::vector<ParamUpdate> updates;
    for (const Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      BRAID_CHECK_T(TypeError, grad.dtype() == p.dtype(), name_, ".step: a parameter of dtype ", dtype_name(p.dtype()),
                    " (shape ", shape_str(p.shape()), ") has a gradient of dtype ", dtype_name(grad.dtype()));
      updates.push_back({p, grad, &state_[p.impl_ptr().get()]});  // references into the map stay valid
    }
    update_group(group, updates);
  }
}

void Optimizer::update_group(const ParamGroup& group, const std::vector<ParamUpdate>& params) {
  for (const ParamUpdate& u : params) update(group, u.param, u.grad, *u.state);
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      if (set_to_none) {
        Tensor handle = p;
        handle.set_grad(Tensor());
      } else if (Tensor g = p.grad(); g.defined()) {
        g.zero_();
      }
    }
  }
}

OptimizerState Optimizer::state_dict() const {
  NoGradGuard no_grad;
  OptimizerState out;
  size_t i = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.scalars[group_key(g, "num_params")] = static_cast<double>(groups_[g].params.size());
    for (const auto& [k, v] : groups_[g].options) out.scalars[group_key(g, k)] = v;
    for (const Tensor& p : groups_[g].params) {
      if (const ParamState* s = state(p)) {
        for (const auto& [k, v] : s->scalars) out.scalars[state_key(i, k)] = v;
        for (const auto& [k, t] : s->tensors) out.tensors[state_key(i, k)] = t.detach().clone();
      }
      ++i;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& in) {
  NoGradGuard no_grad;
  const std::string who = name_ + ".load_state_dict";
  // The flat list of parameters, numbered as state_dict numbers them.
  std::vector<Tensor> params;
  for (const ParamGroup& g : groups_) params.insert(params.end(), g.params.begin(), g.params.end());

  // Groups: counts and exactly this optimizer's option names.
  std::vector<ParamGroup> groups = groups_;
  std::set<std::string> used;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string count_key = group_key(g, "num_params");
    auto it = in.scalars.find(count_key);
    BRAID_CHECK(it != in.scalars.end(), who, ": missing '", count_key, "'; the state has fewer parameter groups than the ",
                groups.size(), " of this optimizer");
    BRAID_CHECK(it->second == static_cast<double>(groups[g].params.size()), who, ": '", count_key, "' is ", it->second,
                " but this optimizer's group ", g, " has ", groups[g].params.size(), " parameters");
    used.insert(count_key);
    for (auto& [k, v] : groups[g].options) {
      auto o = in.scalars.find(group_key(g, k));
      BRAID_CHECK(o != in.scalars.end(), who, ": missing '", group_key(g, k), "'; is the state from another optimizer than ",
                  name_, "?");
      v = o->second;
      used.insert(o->first);
    }
    check_options(groups[g], g);
  }
  // Per-parameter state: known names, and tensors shaped and typed as their parameters.
  const std::vector<std::string> tensor_names = state_tensor_names(), scalar_names = state_scalar_names();
  auto known = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  std::map<size_t, ParamState> loaded;
  for (const auto& [key, v] : in.scalars) {
    if (used.count(key)) continue;
    size_t i = 0;
    std::string n;
    BRAID_CHECK(parse_state_key(key, i, n) && known(scalar_names, n), who, ": unexpected key '", key,
                "'; is the state from another optimizer than ", name_, ", or from more parameter groups?");
    BRAID_CHECK(i < params.size(), who, ": '", key, "' is for parameter ", i, " but this optimizer has ", params.size());
    loaded[i].scalars[n] = v;
  }
  for (const auto& [key, t] : in.tensors) {
    size_t i = 0;
    std::string n;
    BRAID_CHECK(parse_state_key(key, i, n) && known(tensor_names, n), who, ": unexpected tensor '", key,
                "'; is the state from another optimizer than ", name_, "?");
    BRAID_CHECK(i < params.size(), who, ": '", key, "' is for parameter ", i, " but this optimizer has ", params.size());
    BRAID_CHECK(t.defined() && t.shape() == params[i].shape() && t.dtype() == params[i].dtype(), who, ": '", key,
                "' has shape ", t.defined() ? shape_str(t.shape()) : "(undefined)", " and dtype ",
                t.defined() ? dtype_name(t.dtype()) : "-", " but parameter ", i, " has shape ",
                shape_str(params[i].shape()), " and dtype ", dtype_name(params[i].dtype()));
    // Optimizer state lives on its parameter's device, wherever the state was saved from.
    loaded[i].tensors[n] = t.detach().to(params[i].device()).clone();
  }
  // Everything checked: replace.
  groups_ = std::move(groups);
  state_.clear();
  for (auto& [i, s] : loaded) state_[params[i].impl_ptr().get()] = std::move(s);
}

}  // namespace braid::optim
