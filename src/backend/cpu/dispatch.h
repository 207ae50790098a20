// From a runtime dtype to a C++ element type, and element conversions between those types. Kernels
// are templated lambdas (`[&]<typename T>() { ... }`) that these helpers instantiate once per
// dtype; an unsupported dtype becomes a TypeError naming the op instead of a crash.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "braid/tensor.h"

namespace braid::detail {

[[noreturn]] inline void unsupported_dtype(const char* op, DType t) {
  throw TypeError(cat(op, ": dtype ", dtype_name(t), " is not supported by the CPU backend"));
}

/// Calls f.template operator()<T>() for the compute types (float, double, int64, int32, bool).
template <typename F>
decltype(auto) dispatch_compute(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Bool:
      return f.template operator()<bool>();
    default:
      break;
  }
  unsupported_dtype(op, t);
}

/// dispatch_compute plus the storage types Half, BFloat16, int8_t and uint8_t.
template <typename F>
decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float16:
      return f.template operator()<Half>();
    case DType::BFloat16:
      return f.template operator()<BFloat16>();
    case DType::Int8:
      return f.template operator()<int8_t>();
    case DType::UInt8:
      return f.template operator()<uint8_t>();
    default:
      return dispatch_compute(t, op, std::forward<F>(f));
  }
}

template <typename T>
constexpr bool kIsHalfType = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
constexpr bool kIsInt = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
template <typename T>
constexpr bool kIsNarrowInt = std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>;

// Note [Rounding to half without double rounding]
// double -> float -> half can round twice (a double just above a half tie rounds to the tie in
// float, then to even). Rounding to float "to odd" (an inexact result gets an odd last bit) keeps
// the information, and float's 13 extra bits make the final round-to-nearest-even exact.
inline float to_float_round_odd(double x) {
  float f = static_cast<float>(x);
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (static_cast<double>(f) != x && x == x && (bits & 1u) == 0) {
    bits = std::fabs(static_cast<double>(f)) > std::fabs(x) ? bits - 1 : bits + 1;  // the odd neighbour
    f = std::bit_cast<float>(bits);
  }
  return f;
}

/// Converts between element types as a C++ cast would, except that float -> int saturates (NaN
/// gives 0) instead of being undefined, and the half types round to nearest even, once.
template <typename To, typename From>
To convert(From x) {
  if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(half_to_float(x.bits));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(bfloat16_to_float(x.bits));
  } else if constexpr (kIsHalfType<To> && (std::is_same_v<From, double> || kIsInt<From>)) {
    return convert<To>(to_float_round_odd(static_cast<double>(x)));
  } else if constexpr (std::is_same_v<To, Half>) {
    return Half{float_to_half(static_cast<float>(x))};
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return BFloat16{float_to_bfloat16(static_cast<float>(x))};
  } else if constexpr (kIsInt<To> && std::is_floating_point_v<From>) {
    // -min is 2^31 or 2^63, exact in float and double; the cast is defined on [-limit, limit).
    constexpr From kLimit = -static_cast<From>(std::numeric_limits<To>::min());
    if (!(x == x)) return 0;
    if (x >= kLimit) return std::numeric_limits<To>::max();
    if (x <= -kLimit) return std::numeric_limits<To>::min();
    return static_cast<To>(x);
  } else if constexpr (kIsNarrowInt<To> && std::is_floating_point_v<From>) {
    // Saturating, truncated toward zero like the wider integers; NaN gives 0.
    if (!(x == x)) return 0;
    if (x >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    if (x <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    return static_cast<To>(x);
  } else {
    return static_cast<To>(x);
  }
}

/// Wrapping integer arithmetic (two's complement), so that overflow is defined as in PyTorch.
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T wrap_sub(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <typename T>
T wrap_mul(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

}  // namespace braid::detail
