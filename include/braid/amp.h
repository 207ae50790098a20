// Automatic mixed precision: the autocast scope, in which matrix products and convolutions read
// their floating operands rounded to float16 or bfloat16 and accumulate in float32 (Note
// [Autocast] in src/ops/autocast.cpp). Loss scaling for float16 is optim::GradScaler
// (braid/optim/grad_scaler.h).
#pragma once

#include "braid/dtype.h"
#include "braid/tensor.h"

namespace braid {

/// Mixed precision for its scope, as torch.autocast (hence the lower-case name, which Python shares):
///
///     { braid::autocast guard(kBFloat16); loss = loss_fn(model(x), y); }
///     loss.backward();
///
/// Inside, matmul (so linear, attention and the recurrent layers), conv1d, conv2d, conv_transpose2d
/// and scaled_dot_product_attention round their float32/float16/bfloat16 operands to dtype and
/// multiply them with float32 accumulation; they return dtype on a GPU, whose kernels compute in
/// half, and float32 on the CPU. The numerically sensitive ops (softmax, log_softmax, layer_norm,
/// sum, exp, log, the losses, ...) widen a half input to float32; every other op runs in its inputs'
/// dtype. Gradients reach float32 parameters in float32. Any product with a float64 or integer operand
/// is unchanged. The lists and the rule are Note [Autocast] in src/ops/autocast.cpp. The state is
/// thread-local; scopes nest, the innermost winning, and enabled = false turns autocast off for a
/// scope inside another. dtype must be kFloat16 or kBFloat16 (TypeError otherwise).
class autocast {
 public:
  explicit autocast(DType dtype, bool enabled = true);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

/// For an op on autocast's float32 list (softmax, losses, ...; Note [Autocast]), braid's or a user's
/// own, as torch.amp.custom_fwd(cast_inputs=torch.float32): x widened to float32 (a recorded cast)
/// inside an autocast scope when it is float16 or bfloat16, else x itself.
Tensor autocast_float32(const Tensor& x);

/// Whether an autocast scope is in effect on this thread.
bool autocast_enabled();
/// The dtype of the innermost autocast scope on this thread (kBFloat16 outside any).
DType autocast_dtype();

}  // namespace braid
