// The autocast scope's thread-local state (braid/amp.h) and the rule that decides which products
// it changes. The products themselves are in linalg.cpp and conv.cpp.
#include "braid/amp.h"

#include "ops/common.h"

namespace braid {

// Note [Autocast]
// Inside an autocast scope the matmul class (matmul, and so linear, attention and the recurrent
// layers; conv1d, conv2d, conv_transpose2d) rounds each float32/float16/bfloat16 operand to the
// scope's dtype and hands the backend a product of two half operands, which it accumulates in
// float32 and writes as float32 (the Backend::matmul contract). On a GPU that is one cuBLAS GEMM
// with half inputs, float32 output and float32 compute type, on tensor cores; on the CPU the
// operands are widened to float32 scratch and go to sgemm, so autocast there shows what a model
// does in bfloat16 or float16, not a speed-up.
//
// The float32 output is braid's choice, where PyTorch returns the half dtype: half types are
// storage-only here, so the ops downstream (reductions, softmax, normalisation, losses) stay in
// float32, as mixed precision wants them, without a list of ops to cast back up. The cost is that
// activations between layers are float32: what autocast saves is the products' work and their
// saved operands (each product keeps its rounded operands for backward, half the bytes), not the
// activation memory that PyTorch's half outputs also halve.
//
// Gradients stay float32. Rounding is recorded as part of the product's node, not as a recorded
// cast followed by a product: the engine hands each input a gradient of that input's dtype, so a
// gradient passing through a bfloat16 intermediate would be rounded to 8 bits on its way to the
// float32 parameter. The node's inputs are the float32 originals and its backward multiplies the
// float32 output gradient by the rounded operands widened to float32 (dA = dY B_r^T, dB = A_r^T dY):
// the gradient of what was computed, with the rounding passed straight through, as a cast's
// gradient is. matmul's backward formulas turn autocast off (convolution's building blocks call
// matmul_raw, which never looks at it), so backward() called inside the scope, as a pipeline's
// train_step does, gives the same gradients as outside it.
//
// As in PyTorch, only float32 and the half types are cast: a product with a float64 or integer
// operand is computed as it would be outside the scope, so float64 gradient checks are exact
// under autocast too. A convolution's bias is not rounded: it is added to the float32 output in
// float32 (PyTorch rounds it, since its output is half). The depthwise convolution is not a GEMM
// on the CPU; its direct kernel runs on the rounded operands widened to float32, so that every
// path of conv2d computes the same function. Unlike PyTorch, rounded weights are not cached for
// the scope: each product rounds its operands again, one elementwise pass.

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
DType autocast_dtype() { return t_autocast_dtype; }

namespace detail {

bool autocast_eligible(const Tensor& t) {
  return t.defined() && (t.dtype() == kFloat32 || t.dtype() == kFloat16 || t.dtype() == kBFloat16);
}

bool autocasts(const Tensor& a, const Tensor& b) {
  return t_autocast_enabled && autocast_eligible(a) && autocast_eligible(b);
}

}  // namespace detail
}  // namespace braid
