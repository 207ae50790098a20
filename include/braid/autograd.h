// Reverse-mode autograd: the grad-mode switch. Recording and backward live in src/autograd.
#pragma once

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

}  // namespace braid
