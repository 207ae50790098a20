// Binary elementwise primitives: arithmetic into the operands' dtype, comparisons and logical ops
// into bool. Besides the all-contiguous loop, a contiguous operand against a broadcast scalar (stride
// 0) has its own vectorised loop, since `x * 0.5` and optimiser updates are that shape.
#include <atomic>
#include <cmath>
#include <iterator>
#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "core/internal.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loop.h"

namespace braid::detail {
namespace {

const char* binary_name(BinaryOp op) {
  static const char* const kNames[] = {"add", "sub", "mul", "div", "pow", "maximum",     "minimum",    "eq",
                                       "ne",  "lt",  "le",  "gt",  "ge",  "logical_and", "logical_or", "logical_xor"};
  const auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

// out (n) = f(a (n), b (n)), all with the loop's strides. In-place updates pass the output as an
// input too (x.add_(y)), so the pointers carry no __restrict; GCC still vectorises behind a
// runtime overlap check.
template <typename O, typename T, typename F>
void map_binary(const StridedLoop& loop, F f) {
  const auto one_run = [&f](char* const* p, const int64_t* s, int64_t n) {
    O* o = reinterpret_cast<O*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    const T* b = reinterpret_cast<const T*>(p[2]);
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const T bv = *b;
      for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
      const T av = *a;
      for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(a[i * s[1]], b[i * s[2]]);
    }
  };
  if (loop.ndim() >= 2 && loop.inner_size() < 64) {  // short runs (few channels, channels-last): blocks of rows
    loop.run_rows([&one_run](char* const* p, const int64_t* s, int64_t n, const int64_t* outer, int64_t rows) {
      for (int64_t r = 0; r < rows; ++r) {
        char* const q[3] = {p[0] + r * outer[0], p[1] + r * outer[1], p[2] + r * outer[2]};
        one_run(q, s, n);
      }
    });
    return;
  }
  loop.run(one_run);
}

// Integer power by squaring; wraps on overflow like the other integer arithmetic.
template <typename T>
T int_pow(T base, T exp) {
  T r = 1;
  for (; exp > 0; exp >>= 1) {
    if (exp & 1) r = wrap_mul(r, base);
    base = wrap_mul(base, base);
  }
  return r;
}

// Kernels run inside OpenMP regions, which an exception must not cross: integer kernels record a
// bad operand in a flag, write 0 there, and the error is thrown after the loop.
template <typename T>
void divide(const StridedLoop& loop) {
  if constexpr (std::is_floating_point_v<T>) {
    map_binary<T, T>(loop, [](T a, T b) { return a / b; });
  } else {
    std::atomic<bool> by_zero{false};
    map_binary<T, T>(loop, [&by_zero](T a, T b) {
      if (b == 0) by_zero.store(true, std::memory_order_relaxed);
      return b == 0 ? T(0) : (b == -1 ? wrap_sub(T(0), a) : a / b);  // -1 avoids MIN / -1 overflow
    });
    BRAID_CHECK(!by_zero.load(), "div: integer division by zero");
  }
}

template <typename T>
void power(const StridedLoop& loop) {
  if constexpr (std::is_floating_point_v<T>) {
    map_binary<T, T>(loop, [](T a, T b) { return std::pow(a, b); });
  } else {
    std::atomic<bool> negative{false};
    map_binary<T, T>(loop, [&negative](T a, T b) {
      if (b < 0) negative.store(true, std::memory_order_relaxed);
      return int_pow(a, b);
    });
    BRAID_CHECK(!negative.load(), "pow: integers to negative integer powers are not allowed; use a float base");
  }
}

template <typename T>
void arithmetic(BinaryOp op, const StridedLoop& loop, DType dtype) {
  if constexpr (std::is_same_v<T, bool>) {  // bool arithmetic is logic: + is or, * is and
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Max:
        return map_binary<T, T>(loop, [](T a, T b) { return a | b; });
      case BinaryOp::Mul:
      case BinaryOp::Min:
        return map_binary<T, T>(loop, [](T a, T b) { return a & b; });
      default:
        unsupported_dtype(binary_name(op), dtype);
    }
  } else {
    switch (op) {
      case BinaryOp::Add:
        return map_binary<T, T>(loop, [](T a, T b) { return wrap_add(a, b); });
      case BinaryOp::Sub:
        return map_binary<T, T>(loop, [](T a, T b) { return wrap_sub(a, b); });
      case BinaryOp::Mul:
        return map_binary<T, T>(loop, [](T a, T b) { return wrap_mul(a, b); });
      case BinaryOp::Div:
        return divide<T>(loop);
      case BinaryOp::Pow:
        return power<T>(loop);
      case BinaryOp::Max:  // NaN wins, as torch.maximum
        return map_binary<T, T>(loop, [](T a, T b) { return (a > b) | (a != a) ? a : b; });
      case BinaryOp::Min:
        return map_binary<T, T>(loop, [](T a, T b) { return (a < b) | (a != a) ? a : b; });
      default:
        BRAID_ASSERT(false, "unhandled binary op ", binary_name(op));
    }
  }
}

template <typename T>
void compare_or_logic(BinaryOp op, const StridedLoop& loop) {
  switch (op) {
    case BinaryOp::Eq:
      return map_binary<bool, T>(loop, [](T a, T b) { return a == b; });
    case BinaryOp::Ne:
      return map_binary<bool, T>(loop, [](T a, T b) { return a != b; });
    case BinaryOp::Lt:
      return map_binary<bool, T>(loop, [](T a, T b) { return a < b; });
    case BinaryOp::Le:
      return map_binary<bool, T>(loop, [](T a, T b) { return a <= b; });
    case BinaryOp::Gt:
      return map_binary<bool, T>(loop, [](T a, T b) { return a > b; });
    case BinaryOp::Ge:
      return map_binary<bool, T>(loop, [](T a, T b) { return a >= b; });
    case BinaryOp::And:
      return map_binary<bool, T>(loop, [](T a, T b) { return (a != T(0)) & (b != T(0)); });
    case BinaryOp::Or:
      return map_binary<bool, T>(loop, [](T a, T b) { return (a != T(0)) | (b != T(0)); });
    case BinaryOp::Xor:
      return map_binary<bool, T>(loop, [](T a, T b) { return (a != T(0)) != (b != T(0)); });
    default:
      BRAID_ASSERT(false, "unhandled binary op ", binary_name(op));
  }
}

bool is_bool_result(BinaryOp op) { return op >= BinaryOp::Eq; }

}  // namespace

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_name(op);
  const bool mixed = mixed_half_operands(a.dtype(), b.dtype()) && out.dtype() == kFloat32 && !is_bool_result(op);
  BRAID_ASSERT((a.dtype() == b.dtype() || mixed) &&
                   out.dtype() == (is_bool_result(op) ? kBool : mixed ? kFloat32 : a.dtype()) &&
                   a.shape() == out.shape() && b.shape() == out.shape(),
               name, ": got ", dtype_name(a.dtype()), " ", shape_str(a.shape()), ", ", dtype_name(b.dtype()), " ",
               shape_str(b.shape()), " -> ", dtype_name(out.dtype()), " ", shape_str(out.shape()));
  if (mixed) {  // Note [Half arithmetic]: the half operand widened exactly, the float32 kernel into out
    const auto wide = [](const Tensor& t) { return is_half(t.dtype()) ? widen_to_float32(t) : t; };
    return binary(op, wide(a), wide(b), out);
  }
  if (is_half(a.dtype())) {  // Note [Half arithmetic]: float32 kernels, one rounding
    const Tensor f = is_bool_result(op) ? out : new_tensor(out.shape(), kFloat32, out.device());
    binary(op, widen_to_float32(a), widen_to_float32(b), f);
    if (!is_bool_result(op)) copy(f, out);
    return;
  }
  StridedLoop loop(out.shape(), {loop_operand(out), loop_operand(a), loop_operand(b)});
  dispatch_compute(a.dtype(), name, [&]<typename T>() {
    if (is_bool_result(op))
      compare_or_logic<T>(op, loop);
    else
      arithmetic<T>(op, loop, a.dtype());
  });
}

}  // namespace braid::detail
