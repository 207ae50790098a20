// The split backward of zero-bubble pipeline schedules: backward_input runs now the part of a
// backward pass that leads to given inputs (a stage's input gradient, which another stage waits
// for), DeferredWeightGrads::run the rest (the parameters' gradients) when the schedule has time.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/function.h"
#include "braid/autograd.h"
#include "braid/ops.h"

namespace braid {
namespace detail {

// Note [Split backward]
// A node is on the input path when one of its edges leads to an input leaf or to a node on the
// input path. The first half runs only those nodes, newest first, asking each formula (through
// Grads::needs) only for the gradients of on-path edges. A node that also has edges needing a
// gradient off the path (a parameter leaf, or an op on a parameter such as a transpose) is kept
// with its output's gradient; the other on-path nodes free their saved tensors at once. The second
// half runs the kept nodes' formulas again for just the off-path edges, then the off-path nodes
// they feed, newest first as backward() does. Every formula thus sees the output gradient it sees
// in backward(), and every gradient is computed by the same formula: the results are backward()'s.
// The price is what the zero-bubble paper pays too: a kept node holds its output gradient and its
// saved tensors until the second half; and a formula that computes gradients it was not asked for
// does that work twice.
struct DeferredWeightState {
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> kept;                // on-path nodes, output gradient
  std::vector<std::pair<std::shared_ptr<Node>, Tensor>> off_roots;           // roots off the input path
  std::vector<std::pair<std::shared_ptr<AutogradMeta>, Tensor>> leaf_roots;  // roots that are leaves
  std::unordered_set<Node*> on_path;
  std::unordered_set<AutogradMeta*> inputs;
  bool done = false;
};

namespace {

bool edge_needs(const Edge& e) { return e.node != nullptr || (e.leaf && e.leaf->requires_grad); }

using Ready = std::priority_queue<Node*, std::vector<Node*>, bool (*)(Node*, Node*)>;
bool older(Node* a, Node* b) { return a->sequence < b->sequence; }

void check_alive(const Node& n) {
  BRAID_CHECK(n.backward != nullptr, "backward_input: the graph through '", n.name,
              "' was already freed by an earlier backward");
}

}  // namespace
}  // namespace detail

DeferredWeightGrads backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                                   const std::vector<Tensor>& inputs) {
  using namespace detail;
  BRAID_CHECK(gradients.empty() || roots.size() == gradients.size(), "backward_input: ", roots.size(), " tensors but ",
              gradients.size(), " gradients");
  auto state = std::make_shared<DeferredWeightState>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    BRAID_CHECK(x.defined() && x.requires_grad() && x.is_leaf(), "backward_input: input ", i,
                " must be a leaf tensor that requires grad (e.g. a stage input after set_requires_grad)");
    state->inputs.insert(x.impl().autograd.get());
  }
  std::vector<Tensor> gs;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    BRAID_CHECK(r.defined() && r.requires_grad(), "backward_input: tensor ", i, " (shape ",
                r.defined() ? shape_str(r.shape()) : "undefined", ") does not require grad");
    const Tensor g = i < gradients.size() && gradients[i].defined() ? gradients[i] : ones_like(r);
    BRAID_CHECK(g.shape() == r.shape(), "backward_input: gradient ", i, " has shape ", shape_str(g.shape()),
                ", its tensor ", shape_str(r.shape()));
    gs.push_back(g.dtype() == r.dtype() ? g : cast(g, r.dtype()));
  }
  run_as_backward_pass([&] {
    // Every node reachable from the roots, oldest first: a node's inputs are older than it.
    std::unordered_map<Node*, std::shared_ptr<Node>> owner;
    std::vector<Node*> stack;
    for (const Tensor& r : roots) {
      const auto& fn = r.impl().autograd->grad_fn;
      if (fn && owner.emplace(fn.get(), fn).second) stack.push_back(fn.get());
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (Edge& e : n->inputs)
        if (e.node && owner.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
    }
    std::vector<Node*> nodes;
    for (auto& [n, p] : owner) nodes.push_back(n);
    std::sort(nodes.begin(), nodes.end(), older);
    auto& on = state->on_path;
    auto to_input = [&](const Edge& e) {
      return (e.node && on.count(e.node.get())) || (e.leaf && state->inputs.count(e.leaf.get()));
    };
    for (Node* n : nodes)
      if (std::any_of(n->inputs.begin(), n->inputs.end(), to_input)) on.insert(n);
    std::unordered_map<Node*, int> pending;
    for (Node* n : on)
      for (Edge& e : n->inputs)
        if (e.node && on.count(e.node.get())) pending[e.node.get()]++;
    std::unordered_map<Node*, Tensor> grads;
    std::unordered_set<AutogradMeta*> got;
    Ready ready(older);
    for (size_t i = 0; i < roots.size(); ++i) {
      auto& meta = roots[i].impl().autograd;
      if (!meta->grad_fn) {
        if (state->inputs.count(meta.get())) {
          accumulate_leaf(*meta, gs[i]);
          got.insert(meta.get());
        } else {
          state->leaf_roots.emplace_back(meta, gs[i]);
        }
      } else if (!on.count(meta->grad_fn.get())) {
        state->off_roots.emplace_back(meta->grad_fn, gs[i]);
      } else {
        Tensor& slot = grads[meta->grad_fn.get()];
        const bool fresh = !slot.defined();
        slot = accumulate_grad(slot, gs[i]);
        if (fresh && pending[meta->grad_fn.get()] == 0) ready.push(meta->grad_fn.get());
      }
    }
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      Tensor g;
      if (auto it = grads.find(n); it != grads.end()) {
        g = std::move(it->second);
        grads.erase(it);
      }
      std::vector<bool> needs;
      bool keep = false;
      for (Edge& e : n->inputs) {
        needs.push_back(to_input(e));
        keep = keep || (edge_needs(e) && !needs.back());
      }
      if (g.defined()) {
        check_alive(*n);
        if (auto out = n->output.lock(); out && out->retain_grad) out->grad = accumulate_grad(out->grad, g);
        Grads result(needs);
        n->backward(g, result);
        for (size_t i = 0; i < n->inputs.size(); ++i) {
          Edge& e = n->inputs[i];
          Tensor gi = std::move(result.all()[i]);
          if (!needs[i] || !gi.defined()) continue;
          if (e.node) {
            Tensor& slot = grads[e.node.get()];
            slot = accumulate_grad(slot, fit_to_edge(std::move(gi), e, *n, i));
          } else {
            accumulate_leaf(*e.leaf, fit_to_edge(std::move(gi), e, *n, i));
            got.insert(e.leaf.get());
          }
        }
        if (keep)
          state->kept.emplace_back(owner.at(n), g);
        else
          BackwardFn().swap(n->backward);
      }
      for (Edge& e : n->inputs)
        if (e.node && on.count(e.node.get()) && --pending[e.node.get()] == 0) ready.push(e.node.get());
    }
    for (AutogradMeta* leaf : got) fire_grad_ready(*leaf);
  });
  DeferredWeightGrads d;
  d.state_ = std::move(state);
  return d;
}

bool DeferredWeightGrads::pending() const { return state_ && !state_->done; }

void DeferredWeightGrads::run() {
  using namespace detail;
  BRAID_CHECK(pending(), "DeferredWeightGrads::run: ",
              state_ ? "the weight gradients were already computed" : "nothing to run (not made by backward_input)");
  DeferredWeightState& st = *state_;
  run_as_backward_pass([&] {
    const auto& on = st.on_path;
    // Off-path nodes wait for every edge into them from kept or off-path nodes.
    std::unordered_map<Node*, int> pending;
    std::unordered_set<Node*> seen;
    std::vector<Node*> stack;
    auto visit = [&](Node* n) {
      for (Edge& e : n->inputs) {
        if (!e.node || on.count(e.node.get())) continue;
        pending[e.node.get()]++;
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
    };
    for (auto& [n, g] : st.kept) visit(n.get());
    for (auto& [n, g] : st.off_roots)
      if (seen.insert(n.get()).second) stack.push_back(n.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      visit(n);
    }
    std::unordered_map<Node*, Tensor> grads;
    Ready ready(older);
    for (auto& [n, g] : st.kept) {
      grads[n.get()] = g;
      ready.push(n.get());
    }
    for (auto& [n, g] : st.off_roots) {
      Tensor& slot = grads[n.get()];
      const bool fresh = !slot.defined();
      slot = accumulate_grad(slot, g);
      if (fresh && pending[n.get()] == 0) ready.push(n.get());
    }
    std::vector<AutogradMeta*> got;
    auto to_leaf = [&](AutogradMeta& leaf, const Tensor& g) {
      accumulate_leaf(leaf, g);
      if (std::find(got.begin(), got.end(), &leaf) == got.end()) got.push_back(&leaf);
    };
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      Tensor g;
      if (auto it = grads.find(n); it != grads.end()) {
        g = std::move(it->second);
        grads.erase(it);
      }
      const bool kept = on.count(n) > 0;
      std::vector<bool> needs;
      for (Edge& e : n->inputs) {
        const bool to_input = (e.node && on.count(e.node.get())) || (e.leaf && st.inputs.count(e.leaf.get()));
        needs.push_back(edge_needs(e) && !(kept && to_input));
      }
      if (g.defined()) {
        check_alive(*n);
        if (!kept)
          if (auto out = n->output.lock(); out && out->retain_grad) out->grad = accumulate_grad(out->grad, g);
        Grads result(needs);
        n->backward(g, result);
        BackwardFn().swap(n->backward);
        for (size_t i = 0; i < n->inputs.size(); ++i) {
          Edge& e = n->inputs[i];
          Tensor gi = std::move(result.all()[i]);
          if (!needs[i] || !gi.defined()) continue;
          if (e.node) {
            Tensor& slot = grads[e.node.get()];
            slot = accumulate_grad(slot, fit_to_edge(std::move(gi), e, *n, i));
          } else {
            to_leaf(*e.leaf, fit_to_edge(std::move(gi), e, *n, i));
          }
        }
      }
      for (Edge& e : n->inputs)
        if (e.node && !on.count(e.node.get()) && --pending[e.node.get()] == 0) ready.push(e.node.get());
    }
    for (auto& [leaf, g] : st.leaf_roots) to_leaf(*leaf, g);
    for (AutogradMeta* leaf : got) fire_grad_ready(*leaf);
  });
  st.kept.clear();
  st.off_roots.clear();
  st.leaf_roots.clear();
  st.done = true;
}

}  // namespace braid
