// In-place elementwise arithmetic for optimizer updates. Each call runs one backend primitive into
// a tensor that already exists (it may be an operand), so that a step allocates only the one or two
// scratch tensors per parameter it asks for, instead of a temporary per operation. No autograd:
// optimizers update leaves under NoGradGuard.
#pragma once

#include <string>

#include "braid/optim/optimizer.h"
#include "braid/tensor.h"

namespace braid::optim::detail {

/// A new tensor of t's shape and dtype, contents unspecified.
Tensor scratch_like(const Tensor& t);

// out = a (op) b; all operands have out's shape and dtype, or b is a number.
void add_into(const Tensor& out, const Tensor& a, const Tensor& b);
void add_into(const Tensor& out, const Tensor& a, double b);
void sub_into(const Tensor& out, const Tensor& a, const Tensor& b);
void mul_into(const Tensor& out, const Tensor& a, const Tensor& b);
void mul_into(const Tensor& out, const Tensor& a, double b);
void div_into(const Tensor& out, const Tensor& a, const Tensor& b);
void div_into(const Tensor& out, const Tensor& a, double b);
void max_into(const Tensor& out, const Tensor& a, const Tensor& b);
void neg_into(const Tensor& out, const Tensor& a);
void sqrt_into(const Tensor& out, const Tensor& a);

/// The state tensor called name, created filled with fill in param's shape and dtype if absent.
Tensor& state_tensor(ParamState& state, const std::string& name, const Tensor& param, double fill = 0.0);

/// grad, negated when maximize, plus weight_decay * param: grad itself when neither applies,
/// else a new tensor.
Tensor effective_grad(const Tensor& param, const Tensor& grad, double weight_decay, bool maximize);

}  // namespace braid::optim::detail
