// Reverse-mode autograd: the grad-mode switch and the hooks that let code outside the model (the
// data-parallel reducer) act while backward runs. Recording and backward live in src/autograd.
#pragma once

#include <functional>
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

/// Calls fn each time a backward pass has finished accumulating into leaf's .grad: after the last
/// of that pass's contributions, not after each (a parameter used twice fires once). A leaf that
/// receives no gradient in a pass does not fire. Returns an id for remove_grad_ready_hook.
int add_grad_ready_hook(const Tensor& leaf, std::function<void()> fn);
void remove_grad_ready_hook(const Tensor& leaf, int id);

/// Queues fn to run once the backward pass in progress on this thread has finished, before
/// backward() returns (as PyTorch's queue_callback). Throws outside a backward pass.
void queue_backward_callback(std::function<void()> fn);

}  // namespace braid
