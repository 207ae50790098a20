// SkipStash / SkipAdd / SkipConcat and the thread's scopes of stashed tensors (see skip.h).
#include "braid/nn/skip.h"

#include "braid/ops.h"

namespace braid::nn {

namespace {
thread_local SkipScope* t_scope = nullptr;

std::string stashed_names(const std::map<std::string, Tensor>& m) {
  std::string s;
  for (const auto& [k, v] : m) {
    s += s.empty() ? "'" : ", '";
    s += k;
    s += '\'';
  }
  return s.empty() ? "none" : s;
}

Tensor take(const std::string& layer, const std::string& name) {
  SkipScope* scope = SkipScope::current();
  BRAID_CHECK(scope != nullptr, layer, "('", name, "'): no skip scope is open; run it inside a Sequential");
  auto& m = scope->tensors();
  auto it = m.find(name);
  BRAID_CHECK(it != m.end(), layer, "('", name, "'): nothing is stashed under this name (stashed: ",
              stashed_names(m), "); a SkipStash('", name, "') must come earlier in the model");
  Tensor t = std::move(it->second);
  m.erase(it);
  return t;
}
}  // namespace

SkipScope::SkipScope(std::map<std::string, Tensor> initial) : tensors_(std::move(initial)), outer_(t_scope) {
  t_scope = this;
}

SkipScope::~SkipScope() { t_scope = outer_; }

SkipScope* SkipScope::current() { return t_scope; }

// Sequential::forward's scope (module.cpp) is opened here to keep the skip machinery in one file.
Tensor run_in_skip_scope(const Module& owner, const std::function<Tensor()>& body) {
  if (SkipScope::current() != nullptr) return body();
  SkipScope scope;
  Tensor out = body();
  BRAID_CHECK(scope.tensors().empty(), owner.type_name(), ": the forward ended with tensors stashed but never used: ",
              stashed_names(scope.tensors()), "; every SkipStash needs a later SkipAdd or SkipConcat");
  return out;
}

SkipStash::SkipStash(std::string name) : Module("SkipStash"), name_(std::move(name)) {
  BRAID_CHECK(!name_.empty(), "SkipStash: the name is empty");
}

Tensor SkipStash::forward(const Tensor& x) {
  SkipScope* scope = SkipScope::current();
  BRAID_CHECK(scope != nullptr, "SkipStash('", name_, "'): no skip scope is open; run it inside a Sequential");
  BRAID_CHECK(!scope->tensors().count(name_), "SkipStash('", name_,
              "'): a tensor is already stashed under this name and not yet used");
  scope->tensors()[name_] = x;
  return x;
}

std::string SkipStash::describe() const { return "SkipStash('" + name_ + "')"; }

SkipAdd::SkipAdd(std::string name) : Module("SkipAdd"), name_(std::move(name)) {}

Tensor SkipAdd::forward(const Tensor& x) {
  Tensor s = take("SkipAdd", name_);
  BRAID_CHECK(s.shape() == x.shape(), "SkipAdd('", name_, "'): the input has shape ", shape_str(x.shape()),
              ", the stashed tensor ", shape_str(s.shape()));
  return x + s;
}

std::string SkipAdd::describe() const { return "SkipAdd('" + name_ + "')"; }

SkipConcat::SkipConcat(std::string name, int64_t dim) : Module("SkipConcat"), name_(std::move(name)), dim_(dim) {}

Tensor SkipConcat::forward(const Tensor& x) { return concat({x, take("SkipConcat", name_)}, dim_); }

std::string SkipConcat::describe() const {
  return "SkipConcat('" + name_ + "', dim=" + std::to_string(dim_) + ")";
}

}  // namespace braid::nn
