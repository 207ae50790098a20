// The optimizers' in-place arithmetic (see update.h), on the device backend's binary and unary
// primitives. A number operand is a 0-d tensor viewed with stride 0, which the CPU backend runs
// through its vectorised scalar loop.
#include "optim/update.h"

#include "backend/backend.h"
#include "braid/ops.h"
#include "core/internal.h"

namespace braid::optim::detail {

namespace {

using braid::detail::BinaryOp;
using braid::detail::UnaryOp;

braid::detail::Backend& backend(const Tensor& t) { return braid::detail::backend_for(t.device()); }

Tensor broadcast_number(double v, const Tensor& like) {
  Tensor s = scalar_tensor(v, like.dtype(), like.device());
  return braid::detail::as_strided(s, like.shape(), Shape(like.shape().size(), 0), 0);
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) { backend(out).binary(op, a, b, out); }

}  // namespace

Tensor scratch_like(const Tensor& t) { return braid::detail::new_tensor(t.shape(), t.dtype(), t.device()); }

void add_into(const Tensor& out, const Tensor& a, const Tensor& b) { binary(BinaryOp::Add, out, a, b); }
void add_into(const Tensor& out, const Tensor& a, double b) { binary(BinaryOp::Add, out, a, broadcast_number(b, out)); }
void sub_into(const Tensor& out, const Tensor& a, const Tensor& b) { binary(BinaryOp::Sub, out, a, b); }
void mul_into(const Tensor& out, const Tensor& a, const Tensor& b) { binary(BinaryOp::Mul, out, a, b); }
void mul_into(const Tensor& out, const Tensor& a, double b) { binary(BinaryOp::Mul, out, a, broadcast_number(b, out)); }
void div_into(const Tensor& out, const Tensor& a, const Tensor& b) { binary(BinaryOp::Div, out, a, b); }
void div_into(const Tensor& out, const Tensor& a, double b) { binary(BinaryOp::Div, out, a, broadcast_number(b, out)); }
void max_into(const Tensor& out, const Tensor& a, const Tensor& b) { binary(BinaryOp::Max, out, a, b); }
void neg_into(const Tensor& out, const Tensor& a) { backend(out).unary(UnaryOp::Neg, a, out, 0, 0); }
void sqrt_into(const Tensor& out, const Tensor& a) { backend(out).unary(UnaryOp::Sqrt, a, out, 0, 0); }

Tensor& state_tensor(ParamState& state, const std::string& name, const Tensor& param, double fill) {
  Tensor& t = state.tensors[name];
  if (!t.defined()) t = full(param.shape(), fill, param.dtype(), param.device());
  return t;
}

Tensor effective_grad(const Tensor& param, const Tensor& grad, double weight_decay, bool maximize) {
  if (weight_decay == 0 && !maximize) return grad;
  Tensor g = scratch_like(param);
  if (weight_decay == 0) {
    neg_into(g, grad);
  } else {
    mul_into(g, param, weight_decay);
    if (maximize) sub_into(g, g, grad);
    else add_into(g, g, grad);
  }
  return g;
}

}  // namespace braid::optim::detail
