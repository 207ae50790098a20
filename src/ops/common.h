// Helpers shared by the op implementations: the front-door checks every op uses, and raw (not
// recorded) building blocks that run a backend primitive into a fresh output.
#pragma once

#include <optional>

#include "autograd/function.h"
#include "braid/amp.h"
#include "backend/backend.h"
#include "braid/autograd.h"
#include "braid/ops.h"
#include "core/internal.h"
#include "ops/trace.h"

namespace braid::detail {

inline Backend& backend_of(const Tensor& t) { return backend_for(t.device()); }

/// Rejects undefined tensors and the storage-only types (int8, uint8). float16 and bfloat16 compute
/// (Note [Half arithmetic] in backend/backend.h); an op that does not take them uses check_no_half too.
inline void check_compute(const Tensor& t, const char* op) {
  BRAID_CHECK(t.defined(), op, ": got an undefined tensor");
  BRAID_CHECK_T(TypeError, is_compute_type(t.dtype()) || is_half(t.dtype()), op, ": ", dtype_name(t.dtype()),
                " is a storage type; cast to ", dtype_name(compute_type(t.dtype())), " first (x.to(kInt32))");
}

/// check_compute, and float16/bfloat16 refused too: for the ops that have no half form.
inline void check_no_half(const Tensor& t, const char* op) {
  check_compute(t, op);
  BRAID_CHECK_T(TypeError, !is_half(t.dtype()), op, ": ", dtype_name(t.dtype()),
                " is not supported here; cast to float32 first (x.to(kFloat32))");
}

/// f(x), for an op of several steps that a half input would round at each: f runs on x widened to
/// float32 and its result is rounded once to x's dtype, as PyTorch's float32 "opmath" does (Note
/// [Half arithmetic]); both casts are recorded, so the gradient comes back in x's dtype. f(x) itself
/// for every other dtype.
template <typename F>
Tensor via_float32(const Tensor& x, F&& f) {
  if (!x.defined() || !is_half(x.dtype())) return f(x);
  return cast(f(cast(x, kFloat32)), x.dtype());
}

/// The dtype the lower-precision list (the matmul class, convolutions, attention) returns on x's
/// device inside an autocast scope: the scope's dtype where the device keeps half activations, else
/// float32 (Note [Autocast]).
DType autocast_output_dtype(const Tensor& x);

/// Floating-point ops promote integer and bool input to float32, as PyTorch does.
inline Tensor float_input(const Tensor& t, const char* op) {
  check_compute(t, op);
  return is_floating(t.dtype()) ? t : cast(t, kFloat32);
}

/// float32, float16 or bfloat16: the dtypes autocast rounds (Note [Autocast]).
bool autocast_eligible(const Tensor& t);
/// Whether a product of a and b runs in mixed precision: an autocast scope is on and both are
/// eligible. The matmul class checks this before check_compute, which refuses the half types.
bool autocasts(const Tensor& a, const Tensor& b);
/// A matrix product through the backend, not recorded: a and b (..., M, K) and (..., K, N) of one
/// dtype with broadcastable batch axes, the shapes checked here; out has a's dtype, or for half
/// operands float32 unless out_dtype gives their own dtype (Note [Autocast]).
Tensor matmul_raw(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt);

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  BRAID_CHECK_T(TypeError, a.device() == b.device(), op, ": tensors are on different devices (", a.device().str(),
                " and ", b.device().str(), ")");
}

/// A stride-0 view of t broadcast to shape (no autograd; shapes already checked).
Tensor broadcast_view(const Tensor& t, const Shape& shape);
/// Whether t is a 4-d channels-last view of NHWC memory that is not also contiguous (PyTorch's
/// channels_last memory format; Note [Channels-last training] in ops/conv.cpp).
bool is_channels_last_layout(const Tensor& t);
/// t converted to dtype without recording (t itself when it already has it), in t's layout where t
/// is channels-last, else contiguous.
Tensor cast_raw(const Tensor& t, DType dtype);
/// A contiguous copy without recording (t itself when already contiguous).
Tensor contiguous_raw(const Tensor& t);
/// A channels-last copy of a 4-d t without recording (t itself when already channels-last).
Tensor as_channels_last(const Tensor& t);
/// An elementwise pass over x's memory in x's own layout (Note [Channels-last activations in
/// inference] in ops/conv.cpp): `result` is a new tensor of x's shape and `dtype`, channels-last when
/// x is; `in` and `out` are x and result as contiguous views of the same memory (their NHWC views
/// then, x made contiguous when it is neither), for a primitive that takes contiguous tensors.
struct SameLayout {
  Tensor in, out, result;
};
SameLayout same_layout(const Tensor& x, DType dtype);
/// The epilogue of an activation named as conv2d_activation names it ("" for none), with its numbers
/// (ValueError naming op for a name it does not know; ops/conv.cpp).
Epilogue activation_epilogue(const std::string& name, double a, double b, const char* op);
/// Runs a unary primitive into a new tensor of out_dtype.
Tensor unary_raw(UnaryOp op, const Tensor& x, double p0 = 0, double p1 = 0, DType out_dtype = kFloat32, bool keep_dtype = true);
/// Runs a binary primitive with broadcasting into a new tensor; operands are cast to compute.
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, DType compute, DType out_dtype, const char* name);
/// Reduces over normalised axes into keepdim shape (no recording).
Tensor reduce_raw(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, DType out_dtype);
/// Removes the reduced axes from a keepdim-shaped result.
Shape reduced_shape(const Shape& s, const std::vector<int64_t>& axes, bool keepdim);
/// A 0-d tensor holding v in the dtype a scalar operand of t should have.
Tensor scalar_operand(const Tensor& t, double v);
/// Checks that integer index values lie in [0, size) (negative ones wrap, as Python) and returns int64 indices.
Tensor checked_index(const Tensor& index, int64_t size, const char* op, int64_t axis);

}  // namespace braid::detail
