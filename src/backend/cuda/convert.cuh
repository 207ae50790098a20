// Element conversions on the device, bit for bit those of the CPU backend (convert in
// src/backend/cpu/dispatch.h and the half conversions in src/backend/cpu/copy.cpp): float -> int
// (int8 and uint8 included) saturates (NaN gives 0), float16/bfloat16 round to nearest even once,
// with inf, NaN and subnormals kept. Written out rather than taken from cuda_fp16.h, whose NaN bits
// differ.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace braid::detail::cuda {

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, F16> || std::is_same_v<T, BF16>;
template <typename T>
constexpr bool kIsInt = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double>;

// Note [Half conversions] in src/backend/cpu/copy.cpp.
__device__ inline uint16_t float_to_half_bits(float f) {
  uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x47800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x < 0x38800000u) {
    const float r = __fadd_rn(__uint_as_float(x), 0.5f);
    return static_cast<uint16_t>(sign | (__float_as_uint(r) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;
  return static_cast<uint16_t>(sign | (x >> 13));
}

__device__ inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn(static_cast<float>(mant), 0x1p-24f)));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ inline uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // keep NaN quiet
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

__device__ inline float bfloat16_bits_to_float(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Note [Rounding to half without double rounding] in src/backend/cpu/dispatch.h.
__device__ inline float to_float_round_odd(double x) {
  float f = __double2float_rn(x);
  uint32_t bits = __float_as_uint(f);
  if (static_cast<double>(f) != x && x == x && (bits & 1u) == 0) {
    bits = fabs(static_cast<double>(f)) > fabs(x) ? bits - 1 : bits + 1;  // the odd neighbour
    f = __uint_as_float(bits);
  }
  return f;
}

template <typename To>
__device__ inline To saturate_to_int(double x) {
  constexpr double kLimit = std::is_same_v<To, int32_t> ? 2147483648.0 : 9223372036854775808.0;
  constexpr To kMax = std::is_same_v<To, int32_t> ? To(INT32_MAX) : To(INT64_MAX);
  constexpr To kMin = std::is_same_v<To, int32_t> ? To(INT32_MIN) : To(INT64_MIN);
  if (!(x == x)) return 0;
  if (x >= kLimit) return kMax;
  if (x <= -kLimit) return kMin;
  return static_cast<To>(x);
}

/// As the CPU's convert<To>(x).
template <typename To, typename From>
__device__ inline To convert(From x) {
  if constexpr (std::is_same_v<From, F16>) {
    return convert<To>(half_bits_to_float(x.bits));
  } else if constexpr (std::is_same_v<From, BF16>) {
    return convert<To>(bfloat16_bits_to_float(x.bits));
  } else if constexpr (kIsHalf<To> && (std::is_same_v<From, double> || kIsInt<From>)) {
    return convert<To>(to_float_round_odd(static_cast<double>(x)));
  } else if constexpr (std::is_same_v<To, F16>) {
    return F16{float_to_half_bits(static_cast<float>(x))};
  } else if constexpr (std::is_same_v<To, BF16>) {
    return BF16{float_to_bfloat16_bits(static_cast<float>(x))};
  } else if constexpr (kIsInt<To> && kIsFloat<From>) {
    return saturate_to_int<To>(static_cast<double>(x));  // float -> double is exact
  } else if constexpr ((std::is_same_v<To, int8_t> || std::is_same_v<To, uint8_t>)&&kIsFloat<From>) {
    const double lo = std::is_same_v<To, int8_t> ? -128.0 : 0.0, hi = std::is_same_v<To, int8_t> ? 127.0 : 255.0;
    const double v = static_cast<double>(x);
    if (!(v == v)) return 0;
    return static_cast<To>(v >= hi ? hi : v <= lo ? lo : v);
  } else {
    return static_cast<To>(x);
  }
}

/// The type a kernel computes an element of T in: float for the half types (Note [Half arithmetic]
/// in src/backend/backend.h), T itself otherwise.
template <typename T>
using Compute = std::conditional_t<kIsHalf<T>, float, T>;

/// x as To: convert where either side is a half type (widening exactly, narrowing with one rounding
/// to nearest even), a plain static_cast otherwise.
template <typename To, typename From>
__device__ inline To cast(From x) {
  if constexpr (kIsHalf<To> || kIsHalf<From>)
    return convert<To>(x);
  else
    return static_cast<To>(x);
}

}  // namespace braid::detail::cuda
