// The reverse-mode engine: recording (record), the backward pass and the autograd methods of
// Tensor. Backward walks the graph iteratively (no recursion, so a chain of 100,000 ops is fine),
// newest node first, and frees each node's saved tensors as soon as it has run.
#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/function.h"
#include "braid/amp.h"
#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_sequence{0};
}  // namespace

bool is_grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool enabled) { g_grad_enabled = enabled; }

namespace detail {

// Note [Iterative graph destruction]
// A chain of n ops is n Nodes, each owning the next through shared_ptr (edges and the tensors its
// formula saved). Letting the destructors recurse overflows the stack for long chains, so a dying
// Node moves what it owns onto a thread-local list, and the outermost destructor drains the list.
namespace {
thread_local std::vector<std::shared_ptr<Node>> t_dying_nodes;
thread_local std::vector<BackwardFn> t_dying_fns;
thread_local bool t_draining = false;
}  // namespace

Node::~Node() {
  for (Edge& e : inputs)
    if (e.node) t_dying_nodes.push_back(std::move(e.node));
  if (backward) t_dying_fns.push_back(std::move(backward));
  if (t_draining) return;
  t_draining = true;
  while (!t_dying_nodes.empty() || !t_dying_fns.empty()) {
    if (!t_dying_fns.empty()) {
      BackwardFn f = std::move(t_dying_fns.back());
      t_dying_fns.pop_back();
    } else {
      std::shared_ptr<Node> n = std::move(t_dying_nodes.back());
      t_dying_nodes.pop_back();
    }
  }
  t_draining = false;
}

bool needs_grad(const Tensor& t) { return g_grad_enabled && t.defined() && t.requires_grad(); }

bool needs_grad(ArgView<Tensor> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor record_backward(const char* name, Tensor out, ArgView<Tensor> inputs, BackwardFn fn) {
  BRAID_ASSERT(is_floating(out.dtype()), name, " recorded a gradient for a ", dtype_name(out.dtype()), " output");
  auto node = std::make_shared<Node>();
  node->name = name;
  node->sequence = g_sequence++;
  node->backward = std::move(fn);
  node->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Edge e;
    if (t.defined()) {
      e.shape = t.shape();
      e.dtype = t.dtype();
      auto& meta = t.impl().autograd;
      if (meta && meta->grad_fn) e.node = meta->grad_fn;
      else if (meta && meta->requires_grad) e.leaf = meta;
    }
    node->inputs.push_back(std::move(e));
  }
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = node;
  node->output = meta;
  out.impl().autograd = std::move(meta);
  return out;
}

void check_inplace(const Tensor& t, const char* op) {
  BRAID_CHECK(!(g_grad_enabled && t.requires_grad()), op, ": a tensor that requires grad (shape ",
              shape_str(t.shape()), ") cannot be modified in place while grad mode is on; "
              "do the update inside a NoGradGuard, or on a detached tensor");
  if (t.defined()) t.storage()->bump_version();  // Note [Storage versions]
}

Tensor accumulate_grad(const Tensor& acc, const Tensor& g) { return acc.defined() ? add(acc, g) : g; }

namespace {

Tensor accumulate(const Tensor& acc, const Tensor& g) { return accumulate_grad(acc, g); }

// A gradient handed to a leaf must not share memory with anything else, since optimizers and
// clipping update .grad in place.
Tensor own(const Tensor& g) {
  bool unique = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
  return unique ? g : g.clone();
}

}  // namespace

Tensor fit_to_edge(Tensor g, const Edge& e, const Node& node, size_t i) {
  if (g.shape() != e.shape) {
    g = sum_to(g, e.shape);
    BRAID_ASSERT(g.shape() == e.shape, "backward of ", node.name, " gave input ", i, " a gradient of shape ",
                 shape_str(g.shape()), " for shape ", shape_str(e.shape));
  }
  if (g.dtype() != e.dtype) g = cast(g, e.dtype);
  return g;
}

void accumulate_leaf(AutogradMeta& leaf, const Tensor& g) {
  leaf.grad = leaf.grad.defined() ? add(leaf.grad, g) : own(g);
}

void fire_grad_ready(const AutogradMeta& leaf) {
  // Copy: a hook may remove itself.
  auto hooks = leaf.grad_ready_hooks;
  for (auto& [id, fn] : hooks) fn();
}

namespace {

thread_local std::vector<std::function<void()>>* t_backward_callbacks = nullptr;

void run_graph(const std::vector<std::pair<std::shared_ptr<Node>, Tensor>>& roots, bool retain_graph);

// Note [Backward callbacks]
// Hooks (the data-parallel reducer's) may queue work that must run after the whole pass, such as
// waiting for the last bucket's all-reduce. The queue is per thread and per outermost backward; a
// callback may itself queue more.
//
// Several roots (a pipeline stage's activation and the skip tensors it hands on) run as one pass:
// every leaf's grad-ready hooks fire once, after its last contribution from any root.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads, bool retain_graph) {
  NoGradGuard no_grad;
  // Backward formulas run as they would outside an autocast scope (Note [Autocast]), so backward()
  // inside one, as a pipeline's train_step calls it, gives the gradients it gives outside.
  autocast no_autocast(kBFloat16, false);
  std::vector<std::function<void()>> callbacks;
  auto* outer = t_backward_callbacks;
  t_backward_callbacks = &callbacks;
  struct Restore {
    std::vector<std::function<void()>>*& slot;
    std::vector<std::function<void()>>* prev;
    ~Restore() { slot = prev; }
  } restore{t_backward_callbacks, outer};
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> graph_roots;
  for (size_t i = 0; i < roots.size(); ++i) {
    auto& meta = roots[i].impl().autograd;
    if (!meta->grad_fn) {
      accumulate_leaf(*meta, root_grads[i]);
      fire_grad_ready(*meta);
    } else {
      graph_roots.emplace_back(meta->grad_fn, root_grads[i]);
    }
  }
  if (!graph_roots.empty()) run_graph(graph_roots, retain_graph);
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto fn = std::move(callbacks[i]);
    fn();
  }
}

}  // namespace

void run_as_backward_pass(const std::function<void()>& body) {
  NoGradGuard no_grad;
  std::vector<std::function<void()>> callbacks;
  auto* outer = t_backward_callbacks;
  t_backward_callbacks = &callbacks;
  struct Restore {
    std::vector<std::function<void()>>*& slot;
    std::vector<std::function<void()>>* prev;
    ~Restore() { slot = prev; }
  } restore{t_backward_callbacks, outer};
  body();
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto fn = std::move(callbacks[i]);
    fn();
  }
}

namespace {

void run_graph(const std::vector<std::pair<std::shared_ptr<Node>, Tensor>>& roots, bool retain_graph) {
  // Count, for every node reachable from the roots, how many edges lead into it, and for every leaf
  // how many edges lead into it (so that its grad-ready hooks fire after the last one).
  std::unordered_map<Node*, int> pending;
  std::unordered_map<AutogradMeta*, int> pending_leaf;
  std::unordered_set<AutogradMeta*> leaf_got_grad;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const auto& [node, g] : roots)
    if (seen.insert(node.get()).second) stack.push_back(node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (Edge& e : n->inputs) {
      if (e.leaf && !e.leaf->grad_ready_hooks.empty()) pending_leaf[e.leaf.get()]++;
      if (!e.node) continue;
      pending[e.node.get()]++;
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  auto leaf_done = [&](AutogradMeta* leaf) {
    auto it = pending_leaf.find(leaf);
    if (it == pending_leaf.end()) return;
    if (--it->second == 0 && leaf_got_grad.count(leaf)) fire_grad_ready(*leaf);
  };
  auto newer = [](Node* a, Node* b) { return a->sequence < b->sequence; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(newer)> ready(newer);
  std::unordered_map<Node*, Tensor> grads;
  // The roots' nodes stay alive (held by roots) while they run even if no tensor owns them. A root
  // that another root's graph reaches waits for those edges like any node.
  for (const auto& [node, g] : roots) {
    Tensor& slot = grads[node.get()];
    const bool fresh = !slot.defined();
    slot = accumulate(slot, g);
    if (fresh && pending[node.get()] == 0) ready.push(node.get());
  }
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Tensor g;
    if (auto it = grads.find(n); it != grads.end()) {
      g = std::move(it->second);
      grads.erase(it);
    }
    if (!g.defined()) {  // no gradient flows through n; its inputs still wait on it
      for (Edge& e : n->inputs) {
        if (e.node && --pending[e.node.get()] == 0) ready.push(e.node.get());
        if (e.leaf) leaf_done(e.leaf.get());
      }
      continue;
    }
    BRAID_CHECK(n->backward != nullptr, "backward: the graph through '", n->name,
                "' was already freed by an earlier backward; pass retain_graph=true to the first backward "
                "to run backward twice");
    if (auto out = n->output.lock(); out && out->retain_grad) out->grad = accumulate(out->grad, g);
    std::vector<bool> needs;
    for (Edge& e : n->inputs) needs.push_back(e.node != nullptr || (e.leaf && e.leaf->requires_grad));
    Grads result(std::move(needs));
    n->backward(g, result);
    g = Tensor();
    if (!retain_graph) BackwardFn().swap(n->backward);
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      Edge& e = n->inputs[i];
      Tensor gi = std::move(result.all()[i]);
      if (e.node) {
        if (gi.defined()) {
          Tensor& slot = grads[e.node.get()];
          slot = accumulate(slot, fit_to_edge(std::move(gi), e, *n, i));
        }
        if (--pending[e.node.get()] == 0) ready.push(e.node.get());
      } else if (e.leaf) {
        if (gi.defined()) {
          accumulate_leaf(*e.leaf, fit_to_edge(std::move(gi), e, *n, i));
          if (!e.leaf->grad_ready_hooks.empty()) leaf_got_grad.insert(e.leaf.get());
        }
        leaf_done(e.leaf.get());
      }
    }
  }
}

}  // namespace
}  // namespace detail

int add_grad_ready_hook(const Tensor& leaf, std::function<void()> fn) {
  BRAID_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(),
              "add_grad_ready_hook: expected a leaf tensor that requires grad (a parameter)");
  static std::atomic<int> next_id{1};
  const int id = next_id++;
  leaf.impl().autograd->grad_ready_hooks.emplace_back(id, std::move(fn));
  return id;
}

void remove_grad_ready_hook(const Tensor& leaf, int id) {
  if (!leaf.defined() || !leaf.impl().autograd) return;
  auto& hooks = leaf.impl().autograd->grad_ready_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph) {
  BRAID_CHECK(gradients.empty() || roots.size() == gradients.size(), "backward: ", roots.size(), " tensors but ",
              gradients.size(), " gradients");
  std::vector<Tensor> gs;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    BRAID_CHECK(r.defined() && r.requires_grad(), "backward: tensor ", i, " (shape ",
                r.defined() ? shape_str(r.shape()) : "undefined", ") does not require grad");
    const Tensor g = i < gradients.size() && gradients[i].defined() ? gradients[i] : ones_like(r);
    BRAID_CHECK(g.shape() == r.shape(), "backward: gradient ", i, " has shape ", shape_str(g.shape()), ", its tensor ",
                shape_str(r.shape()));
    gs.push_back(g.dtype() == r.dtype() ? g : cast(g, r.dtype()));
  }
  if (!roots.empty()) detail::run_backward(roots, gs, retain_graph);
}

void queue_backward_callback(std::function<void()> fn) {
  BRAID_CHECK(detail::t_backward_callbacks != nullptr,
              "queue_backward_callback: no backward pass is running on this thread");
  detail::t_backward_callbacks->push_back(std::move(fn));
}

bool Tensor::requires_grad() const {
  auto& m = impl().autograd;
  return m && m->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool value) {
  auto& m = impl().autograd;
  BRAID_CHECK(!(m && m->grad_fn), "set_requires_grad: only leaf tensors can change requires_grad (this one was made by ",
              m ? m->grad_fn->name : "", "); use detach() first");
  BRAID_CHECK_T(TypeError, !value || is_floating(dtype()), "set_requires_grad: only floating-point tensors can require "
                "gradients, got ", dtype_name(dtype()));
  if (!m) m = std::make_shared<detail::AutogradMeta>();
  m->requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const {
  auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  auto& m = impl().autograd;
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  BRAID_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient shape ", shape_str(g.shape()),
              " does not match tensor shape ", shape_str(shape()));
  BRAID_CHECK_T(TypeError, !g.defined() || g.device() == device(), "set_grad: gradient on ", g.device().str(),
                " for a tensor on ", device().str());
  auto& m = impl().autograd;
  if (!m) m = std::make_shared<detail::AutogradMeta>();
  m->grad = g;
}

void Tensor::retain_grad() {
  BRAID_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  impl().autograd->retain_grad = true;
}

std::string Tensor::grad_fn_name() const {
  auto& m = impl().autograd;
  return m && m->grad_fn ? m->grad_fn->name : "";
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  BRAID_CHECK(requires_grad(), "backward: the tensor (shape ", shape_str(shape()),
              ") does not require grad and has no grad_fn; did a parameter miss set_requires_grad, or did the "
              "computation run inside NoGradGuard?");
  Tensor g = gradient;
  if (!g.defined()) {
    BRAID_CHECK(numel() == 1, "backward: a gradient can be implied only for a one-element output, got shape ",
                shape_str(shape()), "; pass the output's gradient explicitly");
    g = ones(shape(), dtype(), device());
  }
  BRAID_CHECK(g.shape() == shape(), "backward: gradient shape ", shape_str(g.shape()), " does not match output shape ",
              shape_str(shape()));
  detail::run_backward({*this}, {g.dtype() == dtype() ? g : cast(g, dtype())}, retain_graph);
}

Tensor Tensor::detach() const {
  return Tensor(std::make_shared<TensorImpl>(TensorImpl{impl().storage, impl().shape, impl().strides,
                                                        impl().offset, impl().dtype, nullptr}));
}

}  // namespace braid
