// Raw building blocks for the ops: primitives run into fresh outputs, without autograd.
#include "ops/common.h"

#include <cmath>

namespace braid::detail {

Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  const size_t nd = shape.size(), td = t.shape().size();
  Shape strides(nd, 0);
  for (size_t i = 0; i < td; ++i) {
    size_t o = nd - td + i;
    strides[o] = t.shape()[i] == 1 && shape[o] != 1 ? 0 : t.strides()[i];
  }
  return as_strided(t.detach(), shape, strides, t.offset());
}

bool is_channels_last_layout(const Tensor& t) { return t.dim() == 4 && !t.is_contiguous() && t.is_channels_last(); }

// A channels-last tensor keeps its layout, as PyTorch's preserve_format (Note [Channels-last
// training] in ops/conv.cpp); anything else comes out contiguous.
Tensor cast_raw(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = is_channels_last_layout(t) ? new_channels_last(t.shape(), dtype, t.device())
                                          : new_tensor(t.shape(), dtype, t.device());
  backend_of(t).copy(t, out);
  return out;
}

Tensor contiguous_raw(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = new_tensor(t.shape(), t.dtype(), t.device());
  backend_of(t).copy(t, out);
  return out;
}

Tensor as_channels_last(const Tensor& t) {
  if (is_channels_last_layout(t)) return t;
  Tensor out = new_channels_last(t.shape(), t.dtype(), t.device());
  backend_of(t).copy(t, out);
  return out;
}

// An elementwise result of shape s: channels-last when its first operand of that shape is (Note
// [Channels-last activations in inference] in ops/conv.cpp), otherwise contiguous.
static Tensor new_elementwise(const Shape& s, DType dtype, const Tensor& first, const Tensor* second = nullptr) {
  const Tensor* lead = first.shape() == s ? &first : second != nullptr && second->shape() == s ? second : nullptr;
  if (lead != nullptr && is_channels_last_layout(*lead)) return new_channels_last(s, dtype, first.device());
  return new_tensor(s, dtype, first.device());
}

SameLayout same_layout(const Tensor& x, DType dtype) {
  const Shape& s = x.shape();
  if (is_channels_last_layout(x)) {
    Tensor result = new_channels_last(s, dtype, x.device());
    return {x.permute({0, 2, 3, 1}), result.permute({0, 2, 3, 1}), result};
  }
  Tensor result = new_tensor(s, dtype, x.device());
  return {contiguous_raw(x), result, result};
}

Tensor unary_raw(UnaryOp op, const Tensor& x, double p0, double p1, DType out_dtype, bool keep_dtype) {
  Tensor out = new_elementwise(x.shape(), keep_dtype ? x.dtype() : out_dtype, x);
  backend_of(x).unary(op, x, out, p0, p1);
  return out;
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, DType compute, DType out_dtype, const char* name) {
  check_same_device(a, b, name);
  Shape s = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = new_elementwise(s, out_dtype, a, &b);
  // A float32 and a half operand go in as they are: the backend widens the half one on the load
  // (Note [Half arithmetic]), which saves the pass of a cast.
  const bool as_they_are = compute == kFloat32 && out_dtype == compute && mixed_half_operands(a.dtype(), b.dtype());
  const auto operand = [&](const Tensor& t) { return broadcast_view(as_they_are ? t : cast_raw(t, compute), s); };
  backend_of(a).binary(op, operand(a), operand(b), out);
  return out;
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, DType out_dtype) {
  Shape s = x.shape();
  for (int64_t a : axes) s[a] = 1;
  Tensor out = new_tensor(s, out_dtype, x.device());
  backend_of(x).reduce(op, x, axes, out);
  return out;
}

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& axes, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) != axes.end();
    if (!reduced) out.push_back(s[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Tensor scalar_operand(const Tensor& t, double v) { return scalar_tensor(v, scalar_result_type(t.dtype(), v), t.device()); }

Tensor checked_index(const Tensor& index, int64_t size, const char* op, int64_t axis) {
  BRAID_CHECK_T(TypeError, index.dtype() == kInt64 || index.dtype() == kInt32, op,
                ": index must be int64 or int32, got ", dtype_name(index.dtype()));
  Tensor idx = cast_raw(index, kInt64);
  if (idx.numel() == 0) return idx;
  std::vector<int64_t> all(idx.shape().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  int64_t lo = static_cast<int64_t>(reduce_raw(ReduceOp::Min, idx, all, kInt64).item());
  int64_t hi = static_cast<int64_t>(reduce_raw(ReduceOp::Max, idx, all, kInt64).item());
  BRAID_CHECK_T(IndexError, lo >= -size && hi < size, op, ": index ", (lo < -size ? lo : hi),
                " is out of range for axis ", axis, " of size ", size);
  if (lo < 0) {  // wrap negative indices as Python does
    Tensor wrapped = new_tensor(idx.shape(), kInt64, idx.device());
    Tensor neg = binary_raw(BinaryOp::Lt, idx, scalar_like(idx, 0), kInt64, kBool, op);
    Tensor plus = binary_raw(BinaryOp::Add, idx, scalar_like(idx, static_cast<double>(size)), kInt64, kInt64, op);
    backend_of(idx).where(neg, plus, idx, wrapped);
    return wrapped;
  }
  return idx;
}

}  // namespace braid::detail
