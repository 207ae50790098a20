// Element types and devices. float32 is the working type, float64 serves gradient checks, the
// integer types hold indices and labels, bool holds masks; float16/bfloat16 and int8/uint8 are
// storage formats (half-precision weights and activations; quantised values and raw image bytes)
// that convert to and from the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/device.h"

namespace braid {

enum class DType { Float32, Float64, Int64, Int32, Bool, Float16, BFloat16, Int8, UInt8 };

constexpr DType kFloat32 = DType::Float32;
constexpr DType kFloat64 = DType::Float64;
constexpr DType kInt64 = DType::Int64;
constexpr DType kInt32 = DType::Int32;
constexpr DType kBool = DType::Bool;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kBFloat16 = DType::BFloat16;
constexpr DType kInt8 = DType::Int8;
constexpr DType kUInt8 = DType::UInt8;

/// Bytes per element.
int64_t dtype_size(DType t);
/// Lower-case name, as PyTorch prints it ("float32").
std::string dtype_name(DType t);
/// float16, bfloat16, float32 or float64.
bool is_floating(DType t);
/// float16 or bfloat16: the half types, which the elementwise ops and reductions compute in float32
/// and round once (Note [Half arithmetic] in src/backend/backend.h).
inline bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
/// Types the backend's kernels take in every primitive: all but float16/bfloat16 (which the elementwise
/// ops and reductions take: Note [Half arithmetic]) and int8/uint8 (storage only).
bool is_compute_type(DType t);
/// The compute type a storage type widens to without loss: float32 for float16/bfloat16, int32 for
/// int8/uint8; a compute type itself.
DType compute_type(DType t);
// Note [Type promotion]
// braid follows PyTorch's rules, with the differences marked (*).
//
// Two tensors: the higher of the two dtypes, bool < int32 < int64 < {float16, bfloat16} < float32 <
// float64 (int8 and uint8 count as int32; float16 with bfloat16 gives float32, as in PyTorch; two
// half tensors of one dtype keep it, computed in float32 and rounded once: Note [Half arithmetic]
// in src/backend/backend.h). The
// dtype of a 0-d tensor counts like any other (*: PyTorch lets a 0-d tensor act as a scalar, so
// int32[n] + int64[] is int32 there and int64 here; braid's result type depends on dtypes alone, as
// NumPy 2's does).
//
// A tensor and a C++ scalar (`x + 2.0`, `clamp(x, lo)`, `add(a, b, alpha)`): a floating tensor keeps
// its dtype. For an integer tensor a whole-number scalar that fits the dtype acts as a Python int
// (the dtype stays; for bool it becomes int64); any other scalar (fractional, NaN, inf, or a whole
// number out of range) acts as a Python float and the result is float32 (*: PyTorch wraps an
// out-of-range Python int around; braid never converts a scalar out of range). With a float16 or
// bfloat16 tensor the scalar is rounded to that dtype, as NumPy does (*: PyTorch keeps it at float32
// precision inside the half op).
//
//   op                                      | bool, bool | int, int   | int, float | float, float
//   add, mul, maximum, minimum, where       | bool       | promoted   | float      | promoted
//   pow                                     | TypeError  | promoted   | float      | promoted
//   div (true division)                     | float32    | float32    | float      | promoted
//   eq ne lt le gt ge, logical_*            | bool       | bool       | bool       | bool
//   sub refuses a bool operand on either side (use logical_not or logical_xor), as PyTorch does.
//
// One tensor: neg, abs and relu refuse bool; abs, neg, relu, sign, floor, ceil, round, square and
// clamp keep an integer dtype (square of bool gives int64; sign of bool stays bool); the floating
// functions (exp, log, sqrt, sin, tanh, sigmoid, erf, gelu, ...) turn integer and bool input into
// float32; pow(x, double) follows the scalar rule (x ** 2 stays integer, x ** 0.5 is float32), and
// integers to negative integer powers are an error, as in NumPy (*: PyTorch computes them when the
// exponent is a tensor and refuses them when it is a scalar). sum and prod of integer or bool give
// int64, as does sum_to (also when nothing is summed); amax/amin keep the dtype; argmax/argmin give
// int64. mean, var, std, logsumexp, softmax and log_softmax turn integer and bool input into
// float32 (*: PyTorch refuses integer input to these).
//
// Conversions of a scalar: full and fill_ truncate toward zero and throw when the value is out of
// the dtype's range; cast saturates out-of-range elements (NaN gives 0), where PyTorch's result is
// whatever the platform's conversion gives. In-place updates (add_, mul_) keep the dtype and refuse
// a result of a higher kind (float into an integer tensor, an integer into bool), as PyTorch does.

/// The type two tensor operands of a binary op are computed in (Note [Type promotion]).
DType promote_types(DType a, DType b);
/// Whether v converts to t without overflow: always for bool and float64, and for NaN and infinities
/// in the other floating types, which otherwise need |v| up to their largest finite value; for
/// integer types a finite value whose truncation toward zero is in range.
bool scalar_fits(double v, DType t);
/// The dtype a tensor of dtype t and the scalar v compute in (Note [Type promotion]).
DType scalar_result_type(DType t, double v);
/// Throws ValueError naming op when v does not fit t (scalar_fits).
void check_scalar_fits(double v, DType t, const char* op);

/// Sizes of a tensor, outermost first.
using Shape = std::vector<int64_t>;

/// "[2, 3]".
std::string shape_str(const Shape& s);
/// Number of elements; throws ValueError (naming op when given) on a negative size or overflow.
int64_t shape_numel(const Shape& s, const char* op = nullptr);

}  // namespace braid
