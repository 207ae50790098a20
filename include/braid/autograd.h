// Reverse-mode autograd: the grad-mode switch and the hooks that let code outside the model (the
// data-parallel reducer) act while backward runs. Recording and backward live in src/autograd.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "braid/tensor.h"

namespace braid {

/// Whether ops record a graph (thread-local; on by default).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

/// Turns recording off for its scope, as torch.no_grad().
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Backward from several tensors at once, each with its gradient (torch.autograd.backward): one
/// pass, in which every leaf's gradient and grad-ready hooks see all roots' contributions. No
/// grad_tensors, or an undefined one, means ones of the tensor's shape (d tensor / d tensor).
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              bool retain_graph = false);

namespace detail {
struct DeferredWeightState;
}

/// The second half of a split backward (backward_input): the parameter gradients that the first
/// half left out. run() accumulates them into the leaves' .grad and fires their grad-ready hooks.
class DeferredWeightGrads {
 public:
  DeferredWeightGrads() = default;
  /// Runs once; a second call is a ValueError.
  void run();
  /// Whether run() has work left (false for a default-made object and after run()).
  bool pending() const;

 private:
  friend DeferredWeightGrads backward_input(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                            const std::vector<Tensor>&);
  std::shared_ptr<detail::DeferredWeightState> state_;
};

/// A backward pass split in two, as zero-bubble pipeline schedules need (arXiv 2401.10241): now,
/// only the part of backward(tensors, grad_tensors) that leads to `inputs` (leaves that require
/// grad, e.g. a pipeline stage's input), whose .grad is complete on return; later, through the
/// returned object, the gradients of every other leaf (the parameters). Each op's formula runs as
/// in backward(), so the two halves give the gradients backward() would, bitwise, for a leaf fed
/// by one op; an op whose inputs lead both ways keeps its output's gradient (and its saved
/// tensors) until run() (Note [Split backward]).
DeferredWeightGrads backward_input(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
                                   const std::vector<Tensor>& inputs);

/// Calls fn each time a backward pass has finished accumulating into leaf's .grad: after the last
/// of that pass's contributions, not after each (a parameter used twice fires once). A leaf that
/// receives no gradient in a pass does not fire. Returns an id for remove_grad_ready_hook.
int add_grad_ready_hook(const Tensor& leaf, std::function<void()> fn);
void remove_grad_ready_hook(const Tensor& leaf, int id);

/// Queues fn to run once the backward pass in progress on this thread has finished, before
/// backward() returns (as PyTorch's queue_callback). Throws outside a backward pass.
void queue_backward_callback(std::function<void()> fn);

}  // namespace braid
