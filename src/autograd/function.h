// The autograd tape's data structures and the one call ops use to record a backward formula.
// A Node is one recorded op: its backward formula (a lambda written with forward ops) and an edge
// per input, leading either to the input's own Node or to a leaf's gradient slot.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "braid/tensor.h"
#include "core/arg_view.h"

namespace braid::detail {

struct Node;

struct AutogradMeta {
  bool requires_grad = false;
  bool retain_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for a leaf
  std::vector<std::pair<int, std::function<void()>>> grad_ready_hooks;  // leaves only
};

/// What a backward formula fills: one gradient per input, only where needs(i).
class Grads {
 public:
  explicit Grads(std::vector<bool> needs) : needs_(std::move(needs)), grads_(needs_.size()) {}
  bool needs(size_t i) const { return needs_[i]; }
  void set(size_t i, Tensor g) {
    if (needs_[i]) grads_[i] = std::move(g);
  }
  std::vector<Tensor>& all() { return grads_; }

 private:
  std::vector<bool> needs_;
  std::vector<Tensor> grads_;
};

/// grad is the gradient of the op's output (its shape); a formula may return gradients of the
/// broadcast shape, and the engine sums them down to each input's shape.
using BackwardFn = std::function<void(const Tensor& grad, Grads& grads)>;

struct Edge {
  std::shared_ptr<Node> node;          // the input's producer, or
  std::shared_ptr<AutogradMeta> leaf;  // the leaf whose .grad receives the gradient
  Shape shape;
  DType dtype = DType::Float32;
};

struct Node {
  const char* name = "";
  uint64_t sequence = 0;  // creation order; backward runs newest first
  std::vector<Edge> inputs;
  BackwardFn backward;
  std::weak_ptr<AutogradMeta> output;
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();
};

/// True when grad mode is on and any input requires a gradient.
bool needs_grad(ArgView<Tensor> inputs);
bool needs_grad(const Tensor& input);

/// record() once needs_grad(inputs) holds: makes fn out's backward.
Tensor record_backward(const char* name, Tensor out, ArgView<Tensor> inputs, BackwardFn fn);

/// Makes fn out's backward when needs_grad(inputs); returns out. Captured tensors should be
/// detached (saved.detach()) so that the tape does not keep whole graphs alive through them.
/// Without grad, fn is dropped unconverted (a std::function holding its captures would allocate);
/// an op whose captures cost something to make (detach() makes a TensorImpl) checks needs_grad
/// before it builds the lambda, so that inference pays nothing for what only backward reads.
template <typename F>
Tensor record(const char* name, Tensor out, ArgView<Tensor> inputs, F&& fn) {
  if (!needs_grad(inputs)) return out;
  return record_backward(name, std::move(out), inputs, BackwardFn(std::forward<F>(fn)));
}

// The engine's pieces that the split backward (split_backward.cpp) shares with backward().
Tensor accumulate_grad(const Tensor& acc, const Tensor& g);
Tensor fit_to_edge(Tensor g, const Edge& e, const Node& node, size_t i);
void accumulate_leaf(AutogradMeta& leaf, const Tensor& g);
void fire_grad_ready(const AutogradMeta& leaf);
/// Runs body with grad mode off as one backward pass: queue_backward_callback works inside it and
/// the queued callbacks run after it.
void run_as_backward_pass(const std::function<void()>& body);

/// Throws when t may not be modified in place (it is tracked by autograd and grad mode is on);
/// otherwise counts the write in its storage's version (Note [Storage versions]).
void check_inplace(const Tensor& t, const char* op);

}  // namespace braid::detail
