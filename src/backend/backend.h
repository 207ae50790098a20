// The primitive kernels a device backend implements: the one dispatch point between ops and
// devices. Ops validate and shape their operands before calling here, so a backend may assume
// valid input: matching shapes (broadcast operands come as stride-0 views), compute dtypes, and
// outputs that are freshly allocated or valid views. Everything else is composite code in src/ops.
#pragma once

#include <cstdint>
#include <vector>

#include "braid/tensor.h"

namespace braid::detail {

enum class UnaryOp {
  Neg, Abs, Exp, Log, Log1p, Expm1, Sqrt, Rsqrt, Square, Reciprocal, Sin, Cos, Tanh, Sigmoid, Relu,
  Erf, Sign, Floor, Ceil, Round, LogicalNot, IsNan,
  PowScalar,  // x ** p0
  Clamp,      // min(max(x, p0), p1); +-inf for an absent bound
  LeakyRelu,  // x > 0 ? x : p0 * x
  Elu,        // x > 0 ? x : p0 * (exp(x) - 1)
  Softplus,   // log(1 + exp(x)), stable
  GeluTanh,   // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Max, Min, Eq, Ne, Lt, Le, Gt, Ge, And, Or, Xor };

enum class ReduceOp { Sum, Prod, Max, Min, ArgMax, ArgMin };

enum class RandomKind { Uniform, Normal, Bernoulli };

class Backend {
 public:
  virtual ~Backend() = default;
  /// dst[i] = cast(src[i]); same shape, any strides and dtypes.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;
  /// dst[i] = start + i * step over dst's row-major order.
  virtual void iota(const Tensor& dst, double start, double step) = 0;
  /// out = op(x); same shape and dtype (bool for LogicalNot/IsNan).
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out, double p0, double p1) = 0;
  /// out = op(a, b); a and b have out's shape and the same dtype; out is that dtype or bool.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out = cond ? a : b; all of out's shape, cond bool, a/b out's dtype.
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out has x's shape with the reduced axes set to 1; ArgMax/ArgMin reduce one axis into int64.
  virtual void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) = 0;
  /// out (..., M, N) = a (..., M, K) @ b (..., K, N); batch axes already broadcast; out contiguous.
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  /// out[..i..] = x[..index[..i..]..] along axis; index int64 of out's shape, values in range.
  virtual void gather(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& out) = 0;
  /// out[..index[..i..]..] += src[..i..] along axis; index int64 of src's shape, values in range.
  virtual void scatter_add(const Tensor& out, int64_t axis, const Tensor& index, const Tensor& src) = 0;
  /// Fills out from the Philox stream (seed, first block counter).
  virtual void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t counter, double a, double b) = 0;
};

/// The backend that runs tensors on device.
Backend& backend_for(Device device);

}  // namespace braid::detail
