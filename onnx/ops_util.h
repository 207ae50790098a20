// Helpers shared by the ONNX op implementations (onnx/ops_*.cpp).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "braid/onnx/module.h"
#include "braid/ops.h"
#include "ops/fused.h"

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

/// An activation that the executor fuses into the Conv before it (Note [Fusing activations into
/// Conv] in onnx/module.cpp): conv2d_activation's name and numbers.
struct FusedActivation {
  std::string name;
  double a = 0, b = 0;
  double scale = 1, shift = 0;  // an affine map after the activation (Note [Folding a scalar affine into Conv])
  Tensor residual{};            // added before the activation, when defined (Note [Residual as a post-op])
  bool residual_writable = false;  // its memory may hold the result (nothing reads it after)
};
/// The Conv op with an activation applied to its output, fused where braid::conv2d_activation can.
Tensors conv_fused(OpContext& c, const FusedActivation& act);
/// Conv of the given tensors with c's attributes (pads, strides, dilations, group, auto_pad):
/// what Conv, ConvInteger and QLinearConv compute.
Tensor conv_of(const OpContext& c, Tensor x, Tensor weight, const Tensor& bias,
               const FusedActivation& act = FusedActivation());

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

/// An op of onnxruntime's com.microsoft domain (ops_contrib*.cpp); `integer` for those that read
/// int8/uint8 themselves (not through their compute type).
inline OpSchema contrib_op(const char* type, std::vector<std::string> attributes,
                           std::function<Tensors(OpContext&)> run, bool integer = false) {
  OpSchema s = op(type, std::move(attributes), std::move(run));
  s.domain = "com.microsoft";
  s.storage_via_compute = !integer;
  return s;
}

/// Reduction axes from the attribute (older opsets) or the second input (ReduceSum 13+, all 18+).
std::vector<int64_t> reduce_axes(const OpContext& c, bool from_input);

// Index helpers of the indexing and resampling ops (ops_extra.cpp, ops_sampling.cpp, ...).
inline Tensor index_vec(const std::vector<int64_t>& v, Device d) { return tensor(v, {static_cast<int64_t>(v.size())}, d); }

inline int64_t shape_prod(const Shape& s, size_t from = 0, size_t to = std::string::npos) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, s.size()); ++i) p *= s[i];
  return p;
}

/// Reverses x along axis.
inline Tensor flip(const Tensor& x, int64_t axis) {
  const int64_t n = x.size(axis);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = n - 1 - i;
  return index_select(x, axis, index_vec(idx, x.device()));
}

/// Integer values of an index tensor (any integer dtype).
inline std::vector<int64_t> int_values(const OpContext& c, const Tensor& t, const char* what) {
  if (t.dtype() != kInt64 && t.dtype() != kInt32) c.fail(what, " must be int32 or int64, got ", dtype_name(t.dtype()));
  return t.to_vector<int64_t>();
}

/// The values of a small tensor (scales, thresholds, conditions) as doubles.
inline std::vector<double> float_values(const Tensor& t) { return cast(t, kFloat64).to_vector<double>(); }

inline int64_t wrap(const OpContext& c, int64_t i, int64_t n, const char* what) {
  if (i < -n || i >= n) c.fail(what, " index ", i, " is out of range for a dimension of size ", n);
  return i < 0 ? i + n : i;
}

void register_math_ops(OpRegistry& r);
void register_tensor_ops(OpRegistry& r);
void register_nn_ops(OpRegistry& r);
void register_rnn_ops(OpRegistry& r);
void register_extra_ops(OpRegistry& r);
void register_sampling_ops(OpRegistry& r);
void register_einsum_ops(OpRegistry& r);
void register_control_ops(OpRegistry& r);
void register_signal_ops(OpRegistry& r);
/// The exact int32 sums of (a - a_zero)(b - b_zero) for int8/uint8 a and b, zero points per tensor,
/// row or column (ops_quant.cpp; MatMulInteger's, through the backend's int8 GEMM).
Tensor integer_matmul(const OpContext& c, const Tensor& a, const Tensor& a_zero, const Tensor& b, const Tensor& b_zero);
void register_quant_ops(OpRegistry& r);
void register_contrib_ops(OpRegistry& r);            // onnxruntime's com.microsoft operators
void register_contrib_attention_ops(OpRegistry& r);  // and its attention ones

}  // namespace braid::onnx::ops
