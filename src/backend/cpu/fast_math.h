// Float32 exp, tanh, sigmoid and erf written as branch-free polynomials, so that the elementwise
// loops that call them vectorise (std::exp is an opaque libm call that stops GCC). Accuracy against
// double-precision libm: exp <= 1 ulp over [-87, 88], tanh <= 1.4 ulp, sigmoid <= 2 ulp, erf
// <= 1.5 ulp (1.75e-7 relative; tests/test_edges.cpp measures it over a dense grid).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

// Note [Vector clones]
// The float32 polynomial kernels are compute-bound at SSE2 width, the x86-64 baseline braid is
// built for. target_clones also compiles them for AVX2 and AVX-512 (two and four times the width)
// and the loader picks the copy the CPU runs. Every copy does the same IEEE operations: libbraid is
// compiled with -ffp-contract=off (meson.build), so that the FMA instructions those targets have
// never fuse a multiply and an add, and results do not depend on the machine.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BRAID_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BRAID_VECTOR_CLONES
#endif

namespace braid::detail {

// Note [Branch-free select]
// GCC (without -fno-trapping-math) will not vectorise `c ? a : b` when it can sink the arithmetic
// behind a or b into the branch, because executing a possibly-trapping float op on both paths
// would change behaviour. Selecting with bit masks keeps both values computed and the loop flat.
template <typename T>
inline T select(bool c, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U m = U(0) - static_cast<U>(c);
  return std::bit_cast<T>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m));
}

// Note [Vectorisable expf]
// Cephes expf: n = round(x / ln2) (by the 1.5 * 2^23 shifter, which needs no SSE4.1 rounding
// instruction), r = x - n ln2 in two parts so that r is exact, exp(r) by a degree-6 polynomial on
// [-ln2/2, ln2/2], then a scale by 2^n. The scale is applied as 2^(n/2) * 2^(n - n/2) so that
// results that overflow or fall into the subnormals come out right without a branch.
inline float exp_f32(float x) {
  x = select(x < -104.0f, -104.0f, x);  // exp(-104) rounds to 0 and exp(89) to inf; NaN passes through
  x = select(x > 89.0f, 89.0f, x);
  constexpr float kShift = 0x1.8p23f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const uint32_t ni = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kShift);  // n, two's complement
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1);
  const uint32_t n2 = ni - n1;
  return p * std::bit_cast<float>((n1 + 127u) << 23) * std::bit_cast<float>((n2 + 127u) << 23);
}

/// tanh: Cephes' odd polynomial below 0.625, where 1 - 2 / (e^2x + 1) would cancel; that form
/// above. Computed on |x| and given x's sign at the end, so that tanh(-0) = -0.
inline float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float z = ax * ax;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * ax + ax;
  const float e = exp_f32(2.0f * select(ax > 10.0f, 10.0f, ax));  // tanh(x > 9.1) rounds to 1
  const float large = 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(select(ax < 0.625f, small, large), x);
}

/// sigmoid through e = exp(-|x|), which never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below.
inline float sigmoid_f32(float x) {
  const float e = exp_f32(-std::fabs(x));
  const float d = 1.0f + e;
  return select(x >= 0.0f, 1.0f, e) / d;
}

/// erf: Cephes' erff. x T(x^2) below 1; above, 1 - erfc(|x|) with erfc(x) = exp(-x^2) / x times
/// P(1/x^2) up to 2 and R(1/x^2) from 2 (erf rounds to 1 from 3.92). Computed on |x|, all three
/// forms always, selected without branches; the sign at the end, so that erf(-0) = -0.
inline float erf_f32(float x) {
  const float ax = std::fabs(x);
  const float z = ax * ax;
  float t = 7.853861353153693e-5f;
  t = t * z - 8.010193625184903e-4f;
  t = t * z + 5.188327685732524e-3f;
  t = t * z - 2.685381193529856e-2f;
  t = t * z + 1.128358514861418e-1f;
  t = t * z - 3.761262582423300e-1f;
  t = t * z + 1.128379165726710f;
  const float small = ax * t;
  const float c = select(ax < 1.0f, 1.0f, select(ax > 4.0f, 4.0f, ax));  // the erfc forms' argument, in range
  const float e = exp_f32(-(c * c));
  const float q = 1.0f / c;
  const float y = q * q;
  float p = 2.326819970068386e-2f;
  p = p * y - 1.387039388740657e-1f;
  p = p * y + 3.687424674597105e-1f;
  p = p * y - 5.824733027278666e-1f;
  p = p * y + 6.210004621745983e-1f;
  p = p * y - 4.944515323274145e-1f;
  p = p * y + 3.404879937665872e-1f;
  p = p * y - 2.741127028184656e-1f;
  p = p * y + 5.638259427386472e-1f;
  float r = -1.047766399936249e1f;
  r = r * y + 1.297719955371516e1f;
  r = r * y - 7.495518717768503e0f;
  r = r * y + 2.921019019210786e0f;
  r = r * y - 1.015265279202700e0f;
  r = r * y + 4.218463358204948e-1f;
  r = r * y - 2.820767439740514e-1f;
  r = r * y + 5.641895067754075e-1f;
  const float erfc = e * q * select(c < 2.0f, p, r);
  return std::copysign(select(ax < 1.0f, small, 1.0f - erfc), x);
}

// quantize's composite, clamp(round(x / scale) + zero), as the float holding the integer: rounding
// half to even by adding and subtracting 1.5 * 2^23 (exact below 2^22 in magnitude, and anything
// larger saturates), which vectorises where nearbyint would be a call; selects by masks for the
// same reason (Note [Branch-free select]); NaN becomes 0. The callers are vector clones (Note
// [Vector clones]) for the division.
template <bool kSigned>
inline float quantized_value(float x, float scale, float zero) {
  constexpr float lo = kSigned ? -128.0f : 0.0f, hi = kSigned ? 127.0f : 255.0f;
  constexpr float kShift = 0x1.8p23f;
  const float q = x / scale;
  const float r = (q + kShift) - kShift;
  float v = select(std::fabs(q) < 0x1p22f, r, q) + zero;
  v = select(v == v, v, 0.0f);
  v = select(v < lo, lo, v);
  return select(v > hi, hi, v);
}

// fake_quantize: the quantised value v, then dequantize's (v - zero) * scale in float32, without the
// 8-bit tensor between them; v is an integer held exactly, so the bits are the two composites'.
template <bool kSigned>
inline void fake_quantize_range(const float* x, float* out, int64_t n, float scale, float zero) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = (static_cast<float>(static_cast<int32_t>(quantized_value<kSigned>(x[i], scale, zero))) - zero) * scale;
}

}  // namespace braid::detail
