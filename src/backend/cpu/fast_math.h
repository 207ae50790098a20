// Float32 exp, tanh, sigmoid and erf written as branch-free polynomials, so that the elementwise
// loops that call them vectorise (std::exp is an opaque libm call that stops GCC). Accuracy against
// double-precision libm: exp <= 1 ulp over [-87, 88], tanh <= 1.4 ulp, sigmoid <= 2 ulp, erf
// <= 0.7 ulp (8.1e-8 relative; tests/test_edges.cpp measures it over a dense grid).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

// Note [Vector clones]
// The float32 polynomial kernels are compute-bound at SSE2 width, the x86-64 baseline braid is
// built for. target_clones also compiles them for AVX2 and AVX-512 (two and four times the width:
// x86-64-v3, AVX2 with FMA, which every AVX2 CPU since Haswell and Zen has; x86-64-v4, whose byte
// and word instructions let conversions to 8 bits run at full width) and the loader picks the copy
// the CPU runs. (The AVX2 copy was once compiled for "avx2" alone, which does not include FMA:
// there each fma_f32 was a call to libm, per element; tests/tools/test_vector_clones.py reads the
// disassembly so that it stays inline.) Every copy does the same IEEE operations: libbraid is
// compiled with -ffp-contract=off (meson.build), so that no copy fuses a multiply and an add on its
// own, and the polynomials ask for their fused multiply-adds by name (fma_f32). A fused multiply-add
// is one correctly rounded operation wherever it runs: an instruction in the AVX2 and AVX-512
// copies, libm's fmaf in the baseline copy (slower, same bits). So results do not depend on the
// machine, and the copies the CPUs of today run do half the operations of separate multiplies
// and adds. Callers of these functions are vector clones themselves: elsewhere each fma_f32
// would be a call.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BRAID_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
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

/// a * b + c rounded once (Note [Vector clones]).
inline float fma_f32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// Note [Vectorisable expf]
// Cephes expf: n = round(x / ln2) (by the 1.5 * 2^23 shifter, which needs no SSE4.1 rounding
// instruction), r = x - n ln2 in two parts so that r is exact, exp(r) by a degree-6 polynomial on
// [-ln2/2, ln2/2], then a scale by 2^n. The scale is applied as 2^(n/2) * 2^(n - n/2) so that
// results that overflow or fall into the subnormals come out right without a branch.

/// exp(x) = p * 2^n for x in range: p, with n (two's complement) in `n`.
inline float exp_parts(float x, uint32_t& n) {
  constexpr float kShift = 0x1.8p23f;
  const float t = fma_f32(x, 1.44269504088896341f, kShift);
  const float k = t - kShift;
  n = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kShift);
  float r = fma_f32(k, -0.693359375f, x);
  r = fma_f32(k, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma_f32(p, r, 1.3981999507e-3f);
  p = fma_f32(p, r, 8.3334519073e-3f);
  p = fma_f32(p, r, 4.1665795894e-2f);
  p = fma_f32(p, r, 1.6666665459e-1f);
  p = fma_f32(p, r, 5.0000001201e-1f);
  return fma_f32(p, r * r, r) + 1.0f;
}

inline float exp_f32(float x) {
  x = select(x < -104.0f, -104.0f, x);  // exp(-104) rounds to 0 and exp(89) to inf; NaN passes through
  x = select(x > 89.0f, 89.0f, x);
  uint32_t ni;
  const float p = exp_parts(x, ni);
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1);
  const uint32_t n2 = ni - n1;
  return p * std::bit_cast<float>((n1 + 127u) << 23) * std::bit_cast<float>((n2 + 127u) << 23);
}

/// exp_f32 for x in [-87, 88], where exp(x) is a normal float: one scale by 2^n, no clamps.
inline float exp_normal_f32(float x) {
  uint32_t ni;
  const float p = exp_parts(x, ni);
  return p * std::bit_cast<float>((ni + 127u) << 23);
}

/// tanh: Cephes' odd polynomial below 0.625, where 1 - 2 / (e^2x + 1) would cancel; that form
/// above. Computed on |x| and given x's sign at the end, so that tanh(-0) = -0.
inline float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float z = ax * ax;
  float p = -5.70498872745e-3f;
  p = fma_f32(p, z, 2.06390887954e-2f);
  p = fma_f32(p, z, -5.37397155531e-2f);
  p = fma_f32(p, z, 1.33314422036e-1f);
  p = fma_f32(p, z, -3.33332819422e-1f);
  const float small = fma_f32(p * z, ax, ax);
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

/// erf: a minimax polynomial x (1 + P(x^2)) up to |x| = 0.921875; above, 1 - exp(-Q(|x|)) with Q
/// a polynomial fitted to -log(erfc) (N. Juffa's erff: no division, one exp), |x| clamped at 3.925,
/// where erf rounds to 1. Both forms computed on |x| and selected without branches; the sign at the
/// end, so that erf(-0) = -0; NaN passes through.
inline float erf_f32(float x) {
  const float ax = std::fabs(x);
  const float s = ax * ax;
  float p = -5.99104969e-4f;
  p = fma_f32(p, s, 4.99339588e-3f);
  p = fma_f32(p, s, -2.67667342e-2f);
  p = fma_f32(p, s, 1.12818025e-1f);
  p = fma_f32(p, s, -3.76124859e-1f);
  p = fma_f32(p, s, 1.28379151e-1f);
  const float small = fma_f32(p, ax, ax);
  const float t = std::min(ax, 3.925f);  // NaN stays (std::min returns its first argument)
  float q = 1.72948930e-5f;
  q = fma_f32(q, t, -3.83208680e-4f);
  q = fma_f32(q, t, 3.88393435e-3f);
  q = fma_f32(q, t, -2.42545605e-2f);
  q = fma_f32(q, t, 1.06777847e-1f);
  q = fma_f32(q, t, 6.34846687e-1f);
  q = fma_f32(q, t, 1.28717512e-1f);
  q = fma_f32(q, t, t);  // in [1.7, 17.7]
  return std::copysign(select(ax <= 0.921875f, small, 1.0f - exp_normal_f32(-q)), x);
}

// quantize's composite, clamp(round(x / scale) + zero), as the float holding the integer; NaN
// becomes 0. The quotient is clamped first, to [lo - zero, hi - zero] (integers, so rounding keeps
// it inside and the result is the composite's), which leaves it small enough to round half to even
// by adding and subtracting 1.5 * 2^23, a rounding that vectorises where nearbyint would be a call.
// Selects by masks for the same reason (Note [Branch-free select]). The callers are vector clones
// (Note [Vector clones]) for the division.
template <bool kSigned>
inline float rounded_quotient(float x, float scale, float zero) {  // round(clamped x / scale); NaN stays
  constexpr float lo = kSigned ? -128.0f : 0.0f, hi = kSigned ? 127.0f : 255.0f;
  constexpr float kShift = 0x1.8p23f;
  float q = x / scale;
  q = select(q < lo - zero, lo - zero, q);
  q = select(q > hi - zero, hi - zero, q);
  return (q + kShift) - kShift;
}

template <bool kSigned>
inline float quantized_value(float x, float scale, float zero) {
  const float r = rounded_quotient<kSigned>(x, scale, zero);
  return select(r == r, r + zero, 0.0f);
}

// fake_quantize: the quantised value v, then dequantize's (v - zero) * scale in float32, without the
// 8-bit tensor between them. v - zero is the rounded quotient itself (exact: small integers), so
// the bits are the two composites'.
template <bool kSigned>
inline void fake_quantize_range(const float* x, float* out, int64_t n, float scale, float zero) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = rounded_quotient<kSigned>(x[i], scale, zero);
    out[i] = select(r == r, r, 0.0f - zero) * scale;  // NaN: (0 - zero) * scale
  }
}

}  // namespace braid::detail
