// The explicit list of braid's ONNX op families; OpRegistry::global() calls this once.
#include "ops_util.h"
#include "passes/passes.h"

namespace braid::onnx {

void register_builtin_ops(OpRegistry& r) {
  ops::register_math_ops(r);
  ops::register_tensor_ops(r);
  ops::register_nn_ops(r);
  ops::register_rnn_ops(r);
  ops::register_extra_ops(r);
  ops::register_sampling_ops(r);
  ops::register_einsum_ops(r);
  ops::register_control_ops(r);
  ops::register_signal_ops(r);
  ops::register_quant_ops(r);
  ops::register_contrib_ops(r);
  ops::register_contrib_attention_ops(r);
  register_fused_ops(r);  // domain braid: the nodes the inference passes write (passes/passes.cpp)
}

}  // namespace braid::onnx
