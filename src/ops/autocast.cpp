// The autocast scope's thread-local state (braid/amp.h), the lists it follows and its one per-device
// rule. The products themselves are in linalg.cpp, conv.cpp and attention.cpp.
#include "braid/amp.h"

#include "ops/common.h"

namespace braid {

// Note [Autocast]
// Inside an autocast scope braid follows torch.autocast's lists for the ops it has (the dtype table
// in tests/data/autocast_lists.txt is PyTorch's own, and tests/test_amp_lists.cpp holds every op to
// it on each device):
//
//   lower-precision list: matmul (so linear and the recurrent layers), conv1d,
//     conv2d, conv_transpose2d, scaled_dot_product_attention: each float32/float16/bfloat16 operand
//     is rounded to the scope's dtype and the product accumulates in float32;
//   float32 list: exp, expm1, log, log1p, reciprocal, rsqrt, pow, acos, asin, softplus, sum, prod,
//     logsumexp, softmax, log_softmax, layer_norm, GroupNorm and the losses (cross_entropy, nll_loss, mse_loss,
//     l1_loss, smooth_l1_loss, binary_cross_entropy_with_logits): a float16 or bfloat16 input is
//     widened to float32 first (braid::autocast_float32, a recorded cast), so they compute and
//     return float32;
//   every other op runs in its inputs' dtype, a half one included (Note [Half arithmetic] in
//     src/backend/backend.h), with PyTorch's promotion between dtypes.
//
// The one per-device rule is the dtype the lower-precision list returns, Backend::
// autocast_half_activations (autocast_output_dtype below):
//   - a GPU (CUDA) returns the scope's dtype, as PyTorch does: activations between layers are half,
//     so ReLU, BatchNorm, pooling, residual adds and dropout read and write half the bytes, and the
//     backward products take half gradients on the tensor cores. The float32 list brings the
//     numerically sensitive parts (normalisation statistics, softmax, losses) back to float32.
//   - the CPU returns float32: its half arithmetic widens to float32 scratch anyway, so half
//     activations would cost a pass each way and save nothing; what autocast saves there is the
//     products' saved operands (half the bytes). The rounding of the products' operands is the same.
// The shadow device follows whichever backend its capability set copies, so CI runs the GPU's rule
// (tests/meson.build's shadow pass) on the CPU's kernels.
//
// Parameters and the optimizer stay float32. Rounding is recorded as part of the product's node,
// not as a recorded cast followed by a product: the engine hands each input a gradient of that
// input's dtype, so a gradient passing through a bfloat16 copy of a weight would be rounded to 8 bits
// on its way to the float32 parameter. The node's inputs are the originals and its backward multiplies
// the output gradient by the rounded operands (dA = dY B_r^T, dB = A_r^T dY), accumulating in float32
// and writing float32: the gradient of what was computed, with the rounding passed straight through,
// as a cast's gradient is. Where the output is half, dY is too and the backward products are half x
// half on the tensor cores; where it is float32 they widen the rounded operands. The engine runs
// backward with autocast off, so backward() called inside the scope, as a pipeline's train_step
// does, gives the same gradients as outside it.
//
// As in PyTorch, only float32 and the half types are cast: a product with a float64 or integer
// operand is computed as it would be outside the scope, so float64 gradient checks are exact under
// autocast too. A convolution's bias is not rounded: it is added to the float32 accumulation (then
// rounded with it where the output is half). The depthwise convolution is not a GEMM on the CPU;
// its direct kernel runs on the rounded operands widened to float32, so that every path of conv2d
// computes the same function. Unlike PyTorch, rounded weights are not cached for the scope: each
// product rounds its operands again, one elementwise pass.

namespace {
thread_local bool t_autocast_enabled = false;
thread_local DType t_autocast_dtype = kBFloat16;
}  // namespace

autocast::autocast(DType dtype, bool enabled) : prev_enabled_(t_autocast_enabled), prev_dtype_(t_autocast_dtype) {
  BRAID_CHECK_T(TypeError, dtype == kFloat16 || dtype == kBFloat16, "autocast: dtype must be float16 or bfloat16, got ",
                dtype_name(dtype));
  t_autocast_enabled = enabled;
  t_autocast_dtype = dtype;
}

autocast::~autocast() {
  t_autocast_enabled = prev_enabled_;
  t_autocast_dtype = prev_dtype_;
}

bool autocast_enabled() { return t_autocast_enabled; }

Tensor autocast_float32(const Tensor& x) {
  return t_autocast_enabled && x.defined() && is_half(x.dtype()) ? cast(x, kFloat32) : x;
}
DType autocast_dtype() { return t_autocast_dtype; }

namespace detail {

bool autocast_eligible(const Tensor& t) {
  return t.defined() && (t.dtype() == kFloat32 || t.dtype() == kFloat16 || t.dtype() == kBFloat16);
}

bool autocasts(const Tensor& a, const Tensor& b) {
  return t_autocast_enabled && autocast_eligible(a) && autocast_eligible(b);
}

DType autocast_output_dtype(const Tensor& x) {
  return backend_of(x).autocast_half_activations() ? t_autocast_dtype : kFloat32;
}

}  // namespace detail
}  // namespace braid
