// Helpers shared by the ONNX op implementations (onnx/ops_*.cpp).
#pragma once

#include <string>
#include <vector>

#include "braid/onnx/module.h"
#include "braid/ops.h"

namespace braid::onnx::ops {

using Tensors = std::vector<Tensor>;

/// axis in [-rank, rank) -> [0, rank); fails naming the node otherwise.
inline int64_t norm_axis(const OpContext& c, int64_t axis, int64_t rank, const char* what = "axis") {
  if (axis < -rank || axis >= rank) c.fail(what, " ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

/// ONNX's TensorProto.DataType code -> the braid dtype that holds it; fails for types braid lacks.
DType dtype_from_onnx(const OpContext& c, int64_t code);
/// braid dtype -> ONNX code.
int64_t onnx_type_code(DType t);

/// A schema with the common fields filled in.
inline OpSchema op(const char* type, std::vector<std::string> attributes,
                   std::function<Tensors(OpContext&)> run, int64_t since = 1) {
  OpSchema s;
  s.op_type = type;
  s.attributes = std::move(attributes);
  s.run = std::move(run);
  s.since_opset = since;
  return s;
}

/// Reduction axes from the attribute (older opsets) or the second input (ReduceSum 13+, all 18+).
std::vector<int64_t> reduce_axes(const OpContext& c, bool from_input);

void register_math_ops(OpRegistry& r);
void register_tensor_ops(OpRegistry& r);
void register_nn_ops(OpRegistry& r);
void register_rnn_ops(OpRegistry& r);
void register_extra_ops(OpRegistry& r);

}  // namespace braid::onnx::ops
