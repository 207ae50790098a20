// Module bookkeeping: registration, dotted names, train/eval, state dicts, and the containers.
#include "braid/nn/module.h"

#include <sstream>

#include "braid/autograd.h"
#include "braid/nn/skip.h"
#include "braid/ops.h"

namespace braid::nn {

namespace {
std::string join(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }
}  // namespace

void Module::check_new_name(const std::string& name) const {
  BRAID_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid name '", name,
              "' (names are non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& [n, v] : list)
      if (n == name) return true;
    return false;
  };
  BRAID_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": name '", name,
              "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name);
  BRAID_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  if (requires_grad) value.set_requires_grad(true);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::set_buffer(const std::string& name, Tensor value) {
  for (auto& [n, t] : buffers_)
    if (n == name) {
      t = std::move(value);
      return;
    }
  throw IndexError(detail::cat(type_name_, ": no buffer named '", name, "'"));
}

void Module::add_child(const std::string& name, ModulePtr m) {
  check_new_name(name);
  BRAID_CHECK(m != nullptr, type_name_, ": child '", name, "' is null");
  children_.emplace_back(name, std::move(m));
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out = params_;
  if (recurse)
    for (const auto& [name, c] : children_)
      for (auto& [n, t] : c->named_parameters(true)) out.emplace_back(join(name, n), t);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  for (const auto& [n, t] : buffers_)
    if (t.defined()) out.emplace_back(n, t);
  if (recurse)
    for (const auto& [name, c] : children_)
      for (auto& [n, t] : c->named_buffers(true)) out.emplace_back(join(name, n), t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& [n, c] : children_) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules(const std::string& prefix,
                                                                     bool include_self) const {
  std::vector<std::pair<std::string, ModulePtr>> out;
  if (include_self) {
    // A const method hands out a mutable handle to itself, as libtorch's does: the caller asked for
    // the tree's modules, and the tree is not const to whoever holds the root.
    auto self = std::const_pointer_cast<Module>(weak_from_this().lock());
    BRAID_CHECK(self != nullptr, type_name_, ".named_modules: this module is not held by a std::shared_ptr, so it "
                "cannot list itself; create it with std::make_shared, or pass include_self = false");
    out.emplace_back(prefix, std::move(self));
  }
  for (const auto& [name, c] : children_) {
    std::string path = join(prefix, name);
    out.emplace_back(path, c);
    for (auto& entry : c->named_modules(path, false)) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<ModulePtr> Module::modules(bool include_self) const {
  std::vector<ModulePtr> out;
  for (auto& [n, m] : named_modules("", include_self)) out.push_back(std::move(m));
  return out;
}

ModulePtr Module::child(const std::string& path) const {
  const Module* m = this;
  ModulePtr found;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) {
    found = nullptr;
    std::string known;
    for (const auto& [n, c] : m->children_) {
      if (n == part) found = c;
      known += (known.empty() ? "" : ", ") + n;
    }
    BRAID_CHECK_T(IndexError, found != nullptr, m->type_name_, ": no child named '", part, "' in path '", path,
                  "'; known: ", known.empty() ? "(none)" : known);
    m = found.get();
  }
  return found;
}

void Module::replace_child(const std::string& path, ModulePtr replacement) {
  BRAID_CHECK(replacement != nullptr, "replace_child: replacement for '", path, "' is null");
  auto dot = path.rfind('.');
  Module* parent = this;
  ModulePtr holder;
  if (dot != std::string::npos) {
    holder = child(path.substr(0, dot));
    parent = holder.get();
  }
  std::string last = dot == std::string::npos ? path : path.substr(dot + 1);
  for (auto& [n, c] : parent->children_)
    if (n == last) {
      c = std::move(replacement);
      return;
    }
  child(path);  // throws with the list of known names
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [n, t] : named_parameters()) out[n] = t;
  for (auto& [n, t] : named_buffers()) out[n] = t;
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict mine = state_dict();
  // Check everything before writing anything, so that a bad dict leaves the model untouched.
  for (const auto& [name, t] : mine) {
    auto it = state.find(name);
    BRAID_CHECK(it != state.end() || !strict, "load_state_dict: missing entry '", name, "' for ", type_name_);
    if (it == state.end()) continue;
    BRAID_CHECK(it->second.shape() == t.shape(), "load_state_dict: '", name, "' has shape ",
                shape_str(it->second.shape()), " in the state dict but ", shape_str(t.shape()), " in the model");
  }
  if (strict)
    for (const auto& [name, t] : state)
      BRAID_CHECK(mine.count(name), "load_state_dict: unexpected entry '", name, "' (the model has no such parameter or buffer)");
  NoGradGuard no_grad;
  for (auto& [name, t] : mine) {
    auto it = state.find(name);
    if (it != state.end()) t.copy_(it->second);
  }
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

// Note [Module::to]
// Layers keep handles to their parameters (weight_ = register_parameter(...)), so conversion must
// not hand out new tensors. As PyTorch's param.data = ..., it repoints each tensor's own impl at
// converted storage; autograd state (requires_grad) stays, views taken earlier keep the old data.
void Module::to(DType dtype) {
  BRAID_CHECK_T(TypeError, is_floating(dtype) && is_compute_type(dtype), type_name_,
                ".to: expected float32 or float64, got ", dtype_name(dtype));
  NoGradGuard no_grad;
  auto convert = [dtype](Tensor t) {
    if (!t.defined() || !is_floating(t.dtype()) || t.dtype() == dtype) return;
    Tensor c = t.detach().to(dtype).contiguous();
    Tensor g = t.grad();
    TensorImpl& impl = t.impl();
    impl.storage = c.storage();
    impl.strides = c.strides();
    impl.offset = c.offset();
    impl.dtype = dtype;
    if (g.defined()) t.set_grad(g.to(dtype));
  };
  for (auto& [n, t] : params_) convert(t);
  for (auto& [n, t] : buffers_) convert(t);
  for (auto& [n, c] : children_) c->to(dtype);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  auto move = [device](Tensor t) {
    if (!t.defined() || t.device() == device) return;
    Tensor c = t.detach().to(device);
    Tensor g = t.grad();
    TensorImpl& impl = t.impl();
    impl.storage = c.storage();
    impl.strides = c.strides();
    impl.offset = c.offset();
    if (g.defined()) t.set_grad(g.to(device));
  };
  for (auto& [n, t] : params_) move(t);
  for (auto& [n, t] : buffers_) move(t);
  for (auto& [n, c] : children_) c->to(device);
}

Device Module::device() const {
  for (const auto& [n, t] : named_parameters()) return t.device();
  for (const auto& [n, t] : named_buffers()) return t.device();
  return Device::cpu();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

std::string Module::to_string() const {
  std::ostringstream os;
  os << describe();
  if (!children_.empty()) {
    os << " (\n";
    for (const auto& [n, c] : children_) {
      std::string inner = c->to_string(), indented;
      for (char ch : inner) indented += ch == '\n' ? std::string("\n  ") : std::string(1, ch);
      os << "  (" << n << "): " << indented << "\n";
    }
    os << ")";
  }
  return os.str();
}

Sequential::Sequential(const std::vector<ModulePtr>& modules) : Module("Sequential") {
  for (const ModulePtr& m : modules) add(m);
}

Sequential& Sequential::add(ModulePtr m, const std::string& name) {
  register_module(name.empty() ? std::to_string(size()) : name, std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  return run_in_skip_scope(*this, [&] {
    Tensor h = x;
    for (auto& [n, m] : named_children()) h = m->forward(h);
    return h;
  });
}

ModuleList& ModuleList::add(ModulePtr m) {
  register_module(std::to_string(size()), std::move(m));
  return *this;
}

Tensor ModuleList::forward(const Tensor&) {
  throw NotImplementedError("ModuleList has no forward of its own; call its modules from the owning module");
}

}  // namespace braid::nn
